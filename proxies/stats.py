"""The proxy manager's counters, and the warning each kind of drop logs once.

Every drop is counted here; only the first of each kind is logged (a fleet misconfigured the
same way for every sensor would otherwise flood the log)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

__all__ = ["DropLog", "ManagerStats"]


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
