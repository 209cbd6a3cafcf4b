"""The tests' own waiting helper: what it returns, and what its failure says."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from tests.support import async_eventually, eventually


def test_eventually_returns_the_first_value_accepted() -> None:
    counter = itertools.count()
    assert eventually(lambda: next(counter), lambda n: n >= 3, message="3", interval=0) == 3
    assert eventually(lambda: [1], message="a non-empty list") == [1]


def test_eventually_fails_saying_what_was_awaited_and_the_last_value_seen() -> None:
    with pytest.raises(AssertionError, match=r"not within 0\.05 s: the answer\nlast seen: 41"):
        eventually(lambda: 41, lambda n: n == 42, message="the answer", timeout=0.05)
    with pytest.raises(AssertionError, match="the log says: boom"):
        eventually(lambda: 0, message=lambda: "the log says: boom", timeout=0)
    with pytest.raises(AssertionError, match=r"s: eventually\(lambda: 6 \* 7, .*\nlast seen: 42$"):
        eventually(lambda: 6 * 7, lambda n: n == 41, timeout=0)  # no message: its line says


def test_eventually_retries_the_exceptions_it_is_told_and_no_others() -> None:
    tries = itertools.count()

    def connect() -> str:
        if next(tries) < 2:
            raise ConnectionRefusedError
        return "up"

    assert eventually(connect, message="up", interval=0, retry_on=(OSError,)) == "up"
    tries = itertools.count(-1000)
    with pytest.raises(AssertionError, match=r"last seen: raised ConnectionRefusedError"):
        eventually(connect, message="never up", timeout=0, retry_on=(OSError,))
    with pytest.raises(ZeroDivisionError):
        eventually(lambda: 1 / 0, message="a bug in the probe", retry_on=(OSError,))


async def test_async_eventually_awaits_coroutines_and_lets_the_loop_run() -> None:
    done = asyncio.Event()
    asyncio.get_running_loop().call_later(0.01, done.set)
    assert await async_eventually(done.is_set, message="the event", interval=0.005) is True

    async def state() -> int:
        return 7

    assert await async_eventually(state, lambda n: n == 7, message="7") == 7


async def test_async_eventually_cuts_off_a_probe_that_never_answers() -> None:
    async def hung() -> None:
        await asyncio.sleep(3600)

    with pytest.raises(AssertionError, match=r"a reply\nlast seen: raised TimeoutError"):
        await async_eventually(hung, message="a reply", timeout=0.05)
