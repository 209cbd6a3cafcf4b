"""Whether a sensor's data stopped while the gateway counts on it (sans-IO).

Liveness (`proxies.liveness`) asks whether a sensor is heard at all; a mote that still opens
its receive windows, acknowledges or says hello but sends no readings (it obeyed a forged
`sleep` or `filter` the gateway never sent, or its sampling is stuck) stays online there. This
watch asks the other question: the gateway's proxy says how often data should come
(`expect(gap)`, in the sensor's own seconds, from what the gateway itself asked the mote to
run; None when it cannot count on any: asleep, a filter that may send nothing, no known rate),
and a sensor without data for `stall_after` such gaps is stalled, until its data resumes.

Like liveness, silence must hold on two clocks: the caller's (`now`: by default stream time,
which the fastest sensors drive) and, given `wall`, the wall clock for as long as that many of
its own seconds take at its own pace (`Liveness.wall_limit`) and at least `min_wall_s`: a trace
replayed as fast as it goes runs hours of its time in a second of wall clock, and a mote behind
the others in such a replay is not stalled.

A new expectation (the gap changed from none, or grew) starts counting at that moment: a mote
just woken, or just loaded with `raw`, owes no data from before.
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["DEFAULT_STALL_AFTER", "DEFAULT_STALL_MIN_S", "StallWatch"]

#: Expected data gaps without data before a sensor is stalled.
DEFAULT_STALL_AFTER = 3.0
#: Wall seconds without data before a sensor can be stalled, whatever its pace.
DEFAULT_STALL_MIN_S = 10.0


class StallWatch:
    """See the module docstring."""

    __slots__ = (
        "stall_after",
        "min_wall_s",
        "gap",
        "stalled",
        "since",
        "spells",
        "why",
        "data_at",
        "data_wall",
        "last_gap",
    )

    def __init__(
        self,
        now: float,
        *,
        wall: float | None = None,
        stall_after: float = DEFAULT_STALL_AFTER,
        min_wall_s: float = DEFAULT_STALL_MIN_S,
    ) -> None:
        if not stall_after > 0 or not min_wall_s >= 0:
            raise ValueError("stall_after must be > 0 and min_wall_s >= 0")
        self.stall_after = stall_after
        self.min_wall_s = min_wall_s
        self.gap: float | None = None  # own seconds between data messages it owes; None: none
        self.stalled = False
        self.since: float | None = None  # the caller's clock when it stalled
        self.spells = 0  # times it stalled
        self.why = ""
        self.data_at = now  # the caller's clock at its latest data (or the expectation's start)
        self.data_wall = wall
        self.last_gap = 0.0  # between its latest two data messages, on the caller's clock

    def expect(self, gap: float | None, now: float, wall: float | None = None) -> bool:
        """The gateway now counts on data every `gap` own seconds (None: on none). Returns
        whether that cleared a stall (nothing is owed any more)."""
        if gap is not None and not (gap > 0 and math.isfinite(gap)):
            gap = None
        old, self.gap = self.gap, gap
        if gap is not None and (old is None or gap > old):
            self._restart(now, wall)  # owed from now on
        if gap is None and self.stalled:
            self._clear()
            return True
        return False

    def data(self, now: float, wall: float | None = None) -> bool:
        """A data message (readings, events, a window) at `now`. Returns whether it ended a
        stall."""
        if now > self.data_at and not self.stalled:
            self.last_gap = now - self.data_at
        self.data_at = max(self.data_at, now)
        if wall is not None:
            self.data_wall = wall if self.data_wall is None else max(self.data_wall, wall)
        if self.stalled:
            self._clear()
            return True
        return False

    def limit(self) -> float:
        """How long the caller's clock may run without data: `stall_after` times the gap it
        owes or the latest gap between its data messages, whichever is longer."""
        if self.gap is None:
            return math.inf
        return self.stall_after * max(self.gap, self.last_gap)

    def check(
        self,
        now: float,
        *,
        wall: float | None = None,
        wall_limit: Callable[[float], float] | None = None,
    ) -> str | None:
        """Stalled if its data is overdue on the caller's clock and, given `wall`, on the wall
        clock (`wall_limit(own seconds)`: their wall seconds at its pace). Returns why, if it
        stalled now."""
        if self.stalled or self.gap is None:
            return None
        silent = now - self.data_at
        if silent <= self.limit():
            return None
        own = self.stall_after * self.gap
        why = f"no data for {silent:g} s, {self.stall_after:g} x the {self.gap:g} s it should send"
        if wall is not None and self.data_wall is not None:
            quiet = wall - self.data_wall
            allowed = max(self.min_wall_s, wall_limit(own) if wall_limit is not None else own)
            if quiet <= allowed:
                return None
            why += f" ({quiet:.3g} s of wall clock)"
        self.stalled = True
        self.since = now
        self.spells += 1
        self.why = why
        return why

    def _restart(self, now: float, wall: float | None) -> None:
        self.data_at = max(self.data_at, now)
        if wall is not None:
            self.data_wall = wall if self.data_wall is None else max(self.data_wall, wall)

    def _clear(self) -> None:
        self.stalled = False
        self.since = None
        self.why = ""
        self.last_gap = 0.0
