"""The heap freezer: the gateway's long-lived objects set aside from the cyclic garbage collector.

A daemon with 1,000 queries holds a few million container objects (plans, operators, indexes,
proxies) that live as long as the process. CPython's full collection (generation 2) walks all
of them: in benchmarks/gateway_load.py each one pauses the event loop for 130-200 ms, several
times a run, about 0.7 s of every 3 s at 10,000 samples/s. That pause is latency for every
sample behind it and, once the gateway is behind, a backlog it never works off.

`gc.freeze()` moves every object alive now into a permanent generation the collector skips
(what the CPython docs recommend for long-lived state; reference counting still frees them as
usual). It is done once the daemon has started (its saved queries restored) and again after
each change of the query set or of the sensor catalog (a sensor's proxy) has been quiet for
`quiet_s`; what a change left to be built lazily (a router's index) is built first
(`prepare`). When a query or a sensor is removed, the frozen objects are unfrozen first, so
that cycles among its objects are collected by the pass before the next freeze: frozen garbage
never accumulates.

A burst of installs (10,000 saved queries restored at start-up, a script registering many) is
not quiet until it ends, and meanwhile every full pass walks all the queries installed so far:
the 10,000th install would cost ~20% more than the 1,000th (benchmarks/fast_path.py). Every `burst`
changes a pass runs at once (collect, freeze: it walks only what came since the last one), so
the cost per install stays flat; the quiet pass after the burst still builds and freezes what
was left lazy.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class HeapFreezer:
    """Freezes the objects alive after startup and after each quiet change of the query set
    or the sensor catalog (`gc.freeze()`), so the collector's full passes skip them."""

    def __init__(self, quiet_s: float = 5.0, enabled: bool = True, burst: int = 500) -> None:
        self.quiet_s = quiet_s
        self.enabled = enabled
        self.burst = burst  # changes in a row after which a pass runs without waiting (0: never)
        self._since = 0  # changes since the last pass of either kind
        self.changes = 0  # query-set changes noted (installs and removals)
        self.freezes = 0  # freeze passes done (for tests and /metrics)
        self.frozen = 0  # objects in the permanent generation after the last pass
        self._done = 0  # `changes` at the last pass
        self._removed = False
        self._last_change = 0.0
        self._wake = asyncio.Event()
        # Run before each freeze: state otherwise built lazily after it (a router's index,
        # rebuilt at the first reading after a change) is built now and frozen with the rest.
        self.prepare: list[Callable[[], None]] = []

    @property
    def pending(self) -> bool:
        """A change not frozen yet (the next pass is at most `quiet_s` away)."""
        return self.enabled and (self.changes != self._done or self._removed)

    def changed(self, *, removed: bool = False) -> None:
        """The query set changed; with `removed`, objects may have become cyclic garbage."""
        self.changes += 1
        self._last_change = time.monotonic()
        if removed and self.enabled:
            self._removed = True
            gc.unfreeze()  # the next collection may reclaim the removed query's cycles
        self._since += 1
        if self.enabled and self.burst and self._since >= self.burst:
            self._pass()  # (`changes` stays ahead of `_done`: the quiet pass still comes)
        self._wake.set()

    def freeze(self) -> None:
        """One pass now: collect what is garbage, then freeze every object that survives."""
        if not self.enabled:
            return
        self._done = self.changes
        for build in self.prepare:
            build()
        self._pass()
        # (counted here only: gc.get_freeze_count() walks every frozen object)
        self.frozen = gc.get_freeze_count()
        log.debug("%d long-lived objects frozen (pass %d)", self.frozen, self.freezes)

    def _pass(self) -> None:
        """Collect what is garbage, then freeze every object that survives."""
        self._removed, self._since = False, 0
        gc.collect()
        gc.freeze()
        self.freezes += 1

    def release(self) -> None:
        """The gateway stopped: what it froze may be collected again."""
        if self.enabled and self.freezes:
            gc.unfreeze()

    async def run(self) -> None:
        """Freeze once the query set has been quiet for `quiet_s` after a change (forever)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while (left := self._last_change + self.quiet_s - time.monotonic()) > 0:
                await asyncio.sleep(left)
            if self.changes != self._done or self._removed:
                self.freeze()
