"""Supervision every layer shares: sessions restarted with backoff, and tasks that never fail
silently.

A link to a device or broker, or a coroutine the gateway keeps running, is a *session* that is
opened, used until it is lost, and opened again. :class:`Supervised` runs one session after
another in a task it owns (an async context manager: entering starts the task, leaving cancels
and awaits it) with capped exponential backoff between attempts, and keeps what an operator
needs to know: is it connected (an event and a flag), how many times it connected, and why it
is down. An expected loss (the broker went away, the device was unplugged) is a warning; an
unexpected exception in the session is logged with its traceback, counted in ``restarts`` and
the session is started again: no bug in one session ends the service for good. ``health()``
names the reason while it is down, for ``/healthz``.

:func:`log_task_failure` is the done-callback for any other background task, so that its
exception is logged when it happens rather than lost (or found at shutdown), and
:func:`cancel_and_wait` stops such a task without swallowing a cancellation of the caller.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar, Self

__all__ = [
    "Backoff",
    "SessionStats",
    "Supervised",
    "SupervisedTask",
    "cancel_and_wait",
    "log_task_failure",
]

log = logging.getLogger("fjords.supervision")


@dataclass
class Backoff:
    """Capped exponential backoff (sans-IO): `next()` is the delay before the next attempt."""

    initial: float = 0.1
    maximum: float = 5.0
    factor: float = 2.0

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.maximum < self.initial or self.factor < 1:
            raise ValueError(f"bad backoff {self.initial}..{self.maximum} x{self.factor}")
        self._delay = self.initial

    def reset(self) -> None:
        self._delay = self.initial

    def next(self) -> float:
        delay = self._delay
        self._delay = min(self._delay * self.factor, self.maximum)
        return delay


@dataclass(slots=True)
class SessionStats:
    """What a supervised session reports; transports extend it with their counters."""

    reconnects: int = 0
    connected: bool = False
    #: time.monotonic() when the current session became usable
    connected_at: float = 0.0
    last_error: str = ""
    #: why the session is down ("" while connected), for /healthz
    down_reason: str = ""
    #: unexpected failures of the session (each restarted with backoff)
    restarts: int = 0


class Supervised:
    """Runs `session()` again and again in a task it owns; see the module docstring.

    Subclasses implement `session()`: open the link, call `mark_connected()` when it is usable,
    and return or raise when it is lost. `expected` lists the exceptions that mean "the link was
    lost" (logged as a warning, not counted as a failure).
    """

    expected: tuple[type[BaseException], ...] = (ConnectionError, OSError, TimeoutError)
    #: A session that stayed up this long resets the backoff when it ends; one that fails
    #: sooner (a bug hit at once, a broker that accepts and drops us) backs off further.
    healthy_after: float = 10.0
    #: Where losses and failures are logged.
    logger: ClassVar[logging.Logger] = log

    def __init__(
        self,
        name: str,
        *,
        backoff: Backoff | None = None,
        stats: SessionStats | None = None,
    ) -> None:
        self.name = name
        self.stats = stats if stats is not None else SessionStats()
        self.backoff = backoff if backoff is not None else Backoff()
        self.stats.down_reason = "not started"
        self._connected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._sessions = 0

    # -- lifecycle ---------------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        if self._task is not None:
            raise RuntimeError(f"{self.name} is already running")
        self.stats.down_reason = "connecting"
        self._task = asyncio.create_task(self._supervise(), name=self.name)
        self._task.add_done_callback(log_task_failure)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task, self._task = self._task, None
        try:
            await cancel_and_wait(task)
        finally:
            self._mark_down("closed")

    @property
    def running(self) -> bool:
        return self._task is not None

    async def wait_connected(self, timeout: float | None = None) -> None:
        await asyncio.wait_for(self._connected.wait(), timeout)

    def health(self) -> list[str]:
        """Why this link is down (empty while it is up)."""
        if self.stats.connected:
            return []
        return [f"{self.name}: {self.stats.down_reason or 'down'}"]

    # -- what subclasses call and implement -----------------------------------------------------
    async def session(self) -> None:
        raise NotImplementedError

    def explain_failure(self, exc: BaseException) -> str:
        """An expected failure as logged and shown by `health()`; a link that knows its peer
        says more (a broker's refusal, a certificate that did not verify)."""
        return repr(exc)

    def mark_connected(self) -> None:
        """The link is usable: count the (re)connect, wake waiters."""
        if self._sessions:
            self.stats.reconnects += 1
        self._sessions += 1
        self.stats.connected = True
        self.stats.connected_at = time.monotonic()
        self.stats.down_reason = ""
        self._connected.set()

    def _mark_down(self, reason: str) -> None:
        self.stats.connected = False
        self.stats.down_reason = reason
        self._connected.clear()

    async def _supervise(self) -> None:
        while True:
            try:
                await self.session()
                reason = "session ended"
            except asyncio.CancelledError:
                self._mark_down("closed")
                raise
            except self.expected as exc:
                reason = f"link lost: {self.explain_failure(exc)}"
                # Once per kind of failure, not every retry of a device that stays away.
                level = logging.DEBUG if reason == self.stats.last_error else logging.WARNING
                self.logger.log(level, "%s: %s; retrying", self.name, reason)
            except Exception as exc:  # any bug: log it, count it, start again
                self.stats.restarts += 1
                reason = f"restarting after an unexpected error: {exc!r}"
                self.logger.error("%s failed; restarting", self.name, exc_info=exc)
            self.stats.last_error = reason
            if self.stats.connected and (
                time.monotonic() - self.stats.connected_at >= self.healthy_after
            ):
                self.backoff.reset()
            self._mark_down(reason)
            await asyncio.sleep(self.backoff.next())


class SupervisedTask(Supervised):
    """A coroutine the gateway keeps running: restarted with backoff whenever it ends or fails.

    It counts as connected while it runs; one that kept running for `healthy_after` seconds
    starts again from the shortest delay. The default backoff (0.5 s to 30 s) is slower than a
    link's: a task that fails at once should not flood the log.
    """

    expected = ()

    def __init__(
        self,
        name: str,
        factory: Callable[[], Awaitable[None]],
        *,
        backoff: Backoff | None = None,
    ) -> None:
        super().__init__(name, backoff=backoff if backoff is not None else Backoff(0.5, 30.0))
        self.factory = factory

    async def session(self) -> None:
        self.mark_connected()
        await self.factory()


def log_task_failure(
    task: asyncio.Task[Any], *, logger: logging.Logger = log, consequence: str = ""
) -> None:
    """Done-callback for background tasks: log the exception one ended with (with its
    traceback, naming the task and, when given, what its failure means), so that no failure
    vanishes silently. Bind `logger` and `consequence` with `functools.partial`."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        note = f"; {consequence}" if consequence else ""
        logger.error("background task %s failed%s", task.get_name(), note, exc_info=exc)


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel a background task and wait for it; re-raise its failure if it had one."""
    if task is None:
        return
    if not task.done():
        task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
