"""Helpers shared by the tests: optional system dependencies, the shared data folder, a private
Mosquitto (`Broker`; the `broker` fixtures in tests/conftest.py start one per test), and
`eventually` / `async_eventually`, the one way a test waits for something to happen.

Outside CI a missing tool skips the test with the reason; under CI=true it fails, so CI
always exercises the real broker, Spark and the AVR toolchain.
"""

from __future__ import annotations

import asyncio
import getpass
import inspect
import json
import os
import reprlib
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
IN_CI = os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def require(available: bool, what: str) -> None:
    """Skip (or, under CI, fail) unless `available`; `what` names the missing thing and its package."""
    if available:
        return
    if IN_CI:
        pytest.fail(f"{what} is required under CI=true but is missing")
    pytest.skip(f"{what} is not available on this machine")


def require_binary(name: str, package: str) -> str:
    """The path of executable `name`, else skip/fail naming the Debian package that provides it."""
    path = shutil.which(name)
    require(
        path is not None,
        f"`{name}` (Debian package {package}; scripts/install-system-deps installs it)",
    )
    return path or ""


def shared_file(relative: str) -> Path:
    """A file under ../shared (beside the clone), else skip/fail: the product never needs it."""
    path = SHARED / relative
    require(path.is_file(), f"shared data file {path}")
    return path


def free_port() -> int:
    """A loopback TCP port nobody listens on right now (for a broker or a daemon)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fleet_command(
    broker: object, trace: Path | str, stations: Path | str, *extra: str
) -> list[str]:
    """`fjords-gateway simulate-motes` over MQTT: one mote per station of `trace`, replayed to
    `broker` (host and port), as a user starts the README's fleet; `extra` are more flags."""
    import sys

    return [
        sys.executable, "-m", "gateway.cli", "simulate-motes", "--transport", "mqtt",
        "--broker", f"{broker.host}:{broker.port}",  # type: ignore[attr-defined]
        "--trace", str(trace), "--stations", str(stations), *extra,
    ]  # fmt: skip


# -- waiting for something to happen ----------------------------------------------------------
#
# A test that waits polls: it asks `probe` for the current state every `interval` seconds until
# `until(state)` holds, and fails if it never does within `timeout`. The timeout is an upper
# bound for a loaded machine, never a measurement: keep it generous; the wait ends as soon as
# the state is there. On failure the AssertionError says what was awaited (`message`, else the
# source of `probe` and `until`) and the last state seen (or the exception the last probe
# raised), which is usually the diagnosis: so let `probe` return the state, not a bool.

_SHOW = reprlib.Repr()
_SHOW.maxstring = _SHOW.maxother = 2000
_SHOW.maxlist = _SHOW.maxdict = _SHOW.maxset = _SHOW.maxtuple = 50
_SHOW.maxlevel = 4


Message = str | Callable[[], str] | None


def _source(fn: Callable[..., object]) -> str:
    try:
        return " ".join(inspect.getsource(fn).split())
    except (OSError, TypeError):
        return repr(fn)


def _expired(
    message: Message,
    probe: Callable[..., object],
    until: Callable[..., object],
    timeout: float,
    last: object,
) -> AssertionError:
    if message is None:
        what, cond = _source(probe), "" if until is bool else _source(until)
        what += f" until {cond}" if cond and cond != what else ""  # (one line: quoted once)
    else:
        what = message() if callable(message) else message
    seen = f"raised {last!r}" if isinstance(last, BaseException) else _SHOW.repr(last)
    return AssertionError(f"not within {timeout:g} s: {what}\nlast seen: {seen}")


def eventually(
    probe: Callable[[], T],
    until: Callable[[T], object] = bool,
    *,
    message: Message = None,
    timeout: float = 30.0,
    interval: float = 0.1,
    retry_on: tuple[type[BaseException], ...] = (),
) -> T:
    """The first value of `probe()` that `until` accepts (by default: the first truthy one).

    `probe` is called at once, then every `interval` s, and once more after the deadline if a
    sleep crossed it. An exception in `retry_on` (say OSError while a daemon starts) counts as
    "not yet"; any other, or an AssertionError the probe raises to give up early (the process
    it waits for has exited), propagates. `message` (a string, or a callable for details read
    only on failure, such as a log's tail) says what is awaited; without it, the failure quotes
    the source of `probe` (and `until`).
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = probe()
        except retry_on as e:
            last = e
        else:
            if until(value):
                return value
            last = value
        if time.monotonic() >= deadline:
            raise _expired(message, probe, until, timeout, last)
        time.sleep(interval)


async def async_eventually(
    probe: Callable[[], T | Awaitable[T]],
    until: Callable[[T], object] = bool,
    *,
    message: Message = None,
    timeout: float = 30.0,
    interval: float = 0.1,
    retry_on: tuple[type[BaseException], ...] = (),
) -> T:
    """`eventually` for a test on the event loop: sleeps with `asyncio.sleep`, so the code under
    test runs meanwhile. `probe` may be a coroutine function (awaited, and cut off when the time
    is up, so a hung request fails the wait instead of hanging the test) or a plain function."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value: Any = probe()
            if inspect.isawaitable(value):
                left = max(deadline - time.monotonic(), interval)
                value = await asyncio.wait_for(value, left)
        except Exception as e:
            cut_off = isinstance(e, TimeoutError) and time.monotonic() >= deadline
            if not (cut_off or isinstance(e, retry_on)):
                raise
            last = e
        else:
            if until(value):
                return value
            last = value
        if time.monotonic() >= deadline:
            raise _expired(message, probe, until, timeout, last)
        await asyncio.sleep(interval)


# -- a private MQTT broker ---------------------------------------------------------------------


class Broker:
    """A mosquitto process we own; `restart()` kills it hard and starts it again, same port."""

    def __init__(self, binary: str, workdir: Path, *, persistent: bool = False) -> None:
        self.binary = binary
        self.host = "127.0.0.1"
        self.port = free_port()
        self.config = workdir / "mosquitto.conf"
        self.log = workdir / "mosquitto.log"
        # persistent: sessions, subscriptions and queued messages survive a restart (saved on
        # a clean shutdown, as `systemctl restart mosquitto` does).
        persistence = (
            f"persistence true\npersistence_location {workdir}/\n"
            if persistent
            else "persistence false\n"
        )
        self.config.write_text(
            f"listener {self.port} {self.host}\n"
            # Started as root, mosquitto would become user `mosquitto` and could not write here.
            f"user {getpass.getuser()}\n"
            "allow_anonymous true\n"
            f"{persistence}"
            "max_queued_messages 100000\n"
            f"log_dest file {self.log}\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "-c", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        proc = self.proc

        def listening() -> bool:
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise RuntimeError(f"mosquitto exited with {proc.returncode}: {err}")
            with socket.create_connection((self.host, self.port), timeout=0.2):
                return True

        try:
            eventually(
                listening,
                message=f"mosquitto listens on {self.host}:{self.port}",
                timeout=10,
                interval=0.05,
                retry_on=(OSError,),
            )
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def restart_cleanly(self) -> None:
        """SIGTERM (the broker saves its state) and start again on the same port."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None
        self.start()


def query_routes(gw) -> int:
    """The traffic router's consumers other than the stream's history."""
    index = gw.fjord.streams["traffic"].router.index
    return len(index) - ("__history__" in index)


class ResultRows(threading.Thread):
    """A query's NDJSON result stream (`GET /queries/{id}/results?format=ndjson`), read in the
    background into `rows`."""

    def __init__(self, url: str, *, timeout: float = 600) -> None:
        super().__init__(daemon=True)
        self.resp = urllib.request.urlopen(url, timeout=timeout)
        self.rows: list[dict[str, Any]] = []

    def run(self) -> None:
        try:
            for line in self.resp:
                if line.strip():
                    self.rows.append(json.loads(line))
        except (OSError, ValueError):
            pass

    def of(self, sid: str, column: str = "station") -> int:
        """How many rows so far have `column` equal to `sid`."""
        return sum(1 for r in list(self.rows) if r.get(column) == sid)
