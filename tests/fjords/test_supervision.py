"""Supervision shared by every layer: backoff, a coroutine kept running, and background tasks
whose failures are logged instead of lost."""

from __future__ import annotations

import asyncio
import logging
from functools import partial

import pytest

from fjords.supervision import Backoff, SupervisedTask, cancel_and_wait, log_task_failure

pytestmark = pytest.mark.timeout(30)


def test_backoff_doubles_up_to_its_cap() -> None:
    b = Backoff(0.1, 0.5)
    assert [b.next() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    b.reset()
    assert b.next() == 0.1
    with pytest.raises(ValueError):
        Backoff(0, 1)


async def test_supervised_task_restarts_a_coroutine_that_ends_or_fails() -> None:
    runs = 0
    done = asyncio.Event()

    async def work() -> None:
        nonlocal runs
        runs += 1
        if runs < 3:
            raise RuntimeError(f"run {runs} failed")
        done.set()
        await asyncio.Event().wait()

    async with SupervisedTask("worker", work, backoff=Backoff(0.01, 30.0)) as task:
        await asyncio.wait_for(done.wait(), 5)
        assert task.stats.restarts == 2 and task.health() == []
        assert "run 2 failed" in task.stats.last_error


async def test_a_failed_background_task_is_logged_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def fail() -> None:
        raise KeyError("a bug")

    logger = logging.getLogger("tests.supervision")
    task = asyncio.create_task(fail(), name="worker")
    task.add_done_callback(partial(log_task_failure, logger=logger, consequence="work stops"))
    with pytest.raises(KeyError):
        await task
    await asyncio.sleep(0)  # done-callbacks run in the next turn
    [record] = [r for r in caplog.records if r.name == "tests.supervision"]
    assert record.levelno == logging.ERROR and record.exc_info
    assert "worker" in record.getMessage() and "work stops" in record.getMessage()


async def test_a_cancelled_task_is_not_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    task = asyncio.create_task(asyncio.Event().wait(), name="idle")
    task.add_done_callback(log_task_failure)
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    await asyncio.sleep(0)
    assert task.cancelled() and not caplog.records
