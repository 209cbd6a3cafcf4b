"""The proxy manager's counters, and the warning each kind of drop logs once.

Every drop is counted here; only the first of each kind is logged (a fleet misconfigured the
same way for every sensor would otherwise flood the log)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

__all__ = ["DropLog", "ManagerStats", "RateLimitedLog"]


@dataclass(slots=True)
class ManagerStats:
    messages: int = 0
    before_hello: int = 0  # messages from a sensor we had no hello from (held: Discovery)
    no_proxy: int = 0  # data dropped: its sensor's hello was rejected (no stream, catalog full...)
    rejected_hellos: int = 0
    errors: int = 0
    outbox_drops: int = 0
    pushed_tuples: int = 0
    pushed_heartbeats: int = 0
    controls_sent: int = 0
    send_failures: int = 0
    demand_updates: int = 0
    catalog_full: int = 0  # hellos rejected: max_sensors proxies already
    oversize_hellos: int = 0  # hellos rejected: too many or too large attributes
    forgotten: int = 0  # sensors removed after forget_offline_after_s of silence
    stalls: int = 0  # times a sensor's data stopped while the gateway counted on it
    new_id_rate: int = 0  # messages of new sensor ids refused past their source's rate
    forgotten_unknown: int = 0  # ids without a hello forgotten after forget_unknown_after_s
    evicted_unconfirmed: int = 0  # sensors that said hello and little more, forgotten for others


class DropLog:
    """Logs the first drop of each kind as a warning (the counters tell the rest)."""

    __slots__ = ("_log", "_logged")

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._logged: set[str] = set()

    def once(self, kind: str, message: str, *args: object) -> None:
        if kind not in self._logged:
            self._logged.add(kind)
            self._log.warning(message + " (logged once; see the counters)", *args)


class RateLimitedLog:
    """At most `burst` lines per `interval_s` of its clock for one kind of event; past that,
    one line per interval saying how many more there were (a flood of events must not flood
    the log)."""

    __slots__ = ("_log", "burst", "interval_s", "_start", "_lines", "_more", "_what")

    def __init__(
        self, log: logging.Logger, what: str, *, burst: int = 10, interval_s: float = 60.0
    ):
        self._log = log
        self._what = what
        self.burst = burst
        self.interval_s = interval_s
        self._start = -float("inf")
        self._lines = 0
        self._more = 0

    def log(self, now: float, level: int, message: str, *args: object) -> None:
        """One event at `now`: logged, or counted for the interval's summary."""
        self.flush(now)
        if self._lines < self.burst:
            self._lines += 1
            self._log.log(level, message, *args)
        else:
            self._more += 1

    def flush(self, now: float) -> None:
        """The interval is over: say how many went unlogged, and start a new one."""
        if now - self._start < self.interval_s:
            return
        if self._more:
            self._log.warning(
                "%d more %s in the last %g s (not logged one by one)",
                self._more,
                self._what,
                self.interval_s,
            )
        self._start, self._lines, self._more = now, 0, 0
