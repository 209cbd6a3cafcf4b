"""Whether a sensor is online, from the gaps between its messages (sans-IO).

`now` is the caller's clock (the manager's: by default the stream's event time). A sensor is
offline after `offline_after` expected message gaps of silence, where the expected gap is the
longest recent gap between its messages and at least a raw packet's worth of its sample periods;
asleep, at least `offline_after` wake checks (scaled by how much faster the caller's clock runs
than the sensor's). A message, or an online status, brings it back; MQTT's last will (an offline
status) takes it offline at once. Stream progress is not decided here (`fjords.runtime.progress`).

Stream time is driven by whichever sensors run fastest (a fleet replayed 60x), so silence in it
alone would make a real-time sensor beside them look silent. When the caller also gives its
wall clock (`wall`: monotonic seconds), a sensor must be silent on that too, for as long as its
own limit (in its own seconds: expected gaps, wake checks) takes at its own pace: sensor seconds
per wall second, measured per sensor from the times its messages reached (`timed`). Until
`PACE_MESSAGES` timed messages gave a pace, it is taken as real time, and the wall limit is at
least `offline_after x unknown_pace_s`. Silence on both clocks, never on one: a replay paused
(stream time still) takes nobody offline, nor does a fast population racing ahead.
"""

from __future__ import annotations

import math
from typing import TypeVar

__all__ = ["PACE_MESSAGES", "UNKNOWN_PACE_S", "Liveness", "Recent"]

#: Timed messages (with a wall clock) before a sensor's pace is trusted (a burst of two says
#: little: a mote may hold readings and send them together).
PACE_MESSAGES = 4
#: Until its pace is known, a sensor is not offline before `offline_after` x this many wall
#: seconds of silence (a new mote's first gaps are a burst: hello, ack, first reading).
UNKNOWN_PACE_S = 2.0

T = TypeVar("T")


class Recent(list[T]):
    """The last `maxlen` items: a list, since an empty deque costs ~600 bytes and a catalog
    holds thousands of proxies with a few of these each."""

    __slots__ = ("maxlen",)

    def __init__(self, maxlen: int) -> None:
        super().__init__()
        self.maxlen = maxlen

    def append(self, item: T) -> None:
        super().append(item)
        if len(self) > self.maxlen:
            del self[0]


class Liveness:
    """See the module docstring. `changed(now, what, why)` hears each online/offline change."""

    def __init__(
        self,
        now: float,
        offline_after: float,
        *,
        wall: float | None = None,
        unknown_pace_s: float = UNKNOWN_PACE_S,
    ) -> None:
        if offline_after <= 0:
            raise ValueError("offline_after must be > 0")
        self.offline_after = offline_after
        self.unknown_pace_s = unknown_pace_s
        self.online = True
        self.last_heard = now
        self.created = now
        self.spells = 0  # times it went offline
        self.gaps: Recent[float] = Recent(8)
        # -- the wall clock and the sensor's own pace against it --------------------------
        self.wall_heard = wall  # the caller's wall clock at its latest message
        self.own_gaps: Recent[float] = Recent(8)  # between its timed messages, its own seconds
        self._timed = 0
        self._first: tuple[float, float] | None = None  # (own time, wall) of its first
        self._latest: tuple[float, float] | None = None  # ... and of its latest timed message

    def heard(self, now: float, *, first: bool, wall: float | None = None) -> None:
        """A message at `now` (`first`: the first since the hello, whose gap means nothing),
        at `wall` on the caller's wall clock if it has one."""
        if now > self.last_heard and not first:
            self.gaps.append(now - self.last_heard)
        self.last_heard = max(self.last_heard, now)
        if wall is not None:
            self.wall_heard = wall if self.wall_heard is None else max(self.wall_heard, wall)

    def timed(self, own: float, wall: float) -> None:
        """Its message reached its own time `own` (later than any before) at `wall`."""
        if not math.isfinite(own):
            return
        if self._latest is not None:
            if own <= self._latest[0]:
                return
            self.own_gaps.append(own - self._latest[0])
        else:
            self._first = (own, wall)
        self._latest = (own, wall)
        self._timed += 1

    def pace(self) -> float | None:
        """Its own seconds per wall second since its first timed message; None until
        `PACE_MESSAGES` of them (then it is taken as real time)."""
        if self._timed < PACE_MESSAGES or self._first is None or self._latest is None:
            return None
        own = self._latest[0] - self._first[0]
        wall = self._latest[1] - self._first[1]
        if own <= 0:
            return None
        return own / wall if wall > 0 else math.inf  # (all at once: as fast as it goes)

    def expected_own_gap(self, min_gap: float) -> float:
        """How long silence is normal in its own seconds: the longest recent gap between its
        timed messages, and at least `min_gap`."""
        return max([min_gap, *self.own_gaps, 1e-9])

    def wall_limit(self, own_limit: float) -> float:
        """`own_limit` of its own seconds in wall seconds, at its pace."""
        pace = self.pace()
        if pace is None:
            return max(own_limit, self.offline_after * self.unknown_pace_s)
        return own_limit / pace

    def expected_gap(self, min_gap: float) -> float:
        """How long silence is normal: the longest recent gap between messages, and at least
        `min_gap` (a raw packet's worth of sample periods: the longest a `raw` mote holds its
        readings)."""
        return max([min_gap, *self.gaps, 1e-9])

    def check(
        self,
        now: float,
        limit: float,
        *,
        wall: float | None = None,
        own_limit: float | None = None,
    ) -> str | None:
        """Offline if silent longer than `limit` on the caller's clock and, given `wall` and
        `own_limit` (its own seconds), longer than that takes at its pace on the wall clock;
        returns why, if it went offline now."""
        silent = now - self.last_heard
        if not self.online or silent <= limit:
            return None
        if wall is None or own_limit is None or self.wall_heard is None:
            return self.go_offline(f"silent for {silent:g} s")
        quiet = wall - self.wall_heard
        if quiet <= self.wall_limit(own_limit):
            return None  # stream time ran ahead of it (a faster population): not silent
        return self.go_offline(f"silent for {silent:g} s ({quiet:.3g} s of wall clock)")

    def go_offline(self, why: str) -> str | None:
        if not self.online:
            return None
        self.online = False
        self.spells += 1
        return why

    def come_back(self, *, keep_last_gap: bool) -> bool:
        """Online again; returns whether it was offline. Asleep (`keep_last_gap`), the silence
        was its listen interval as the caller's clock sees it (which may run faster than the
        sensor's): keep it, or every window would flap offline."""
        if self.online:
            return False
        self.online = True
        keep = self.gaps[-1:] if keep_last_gap else []
        self.gaps.clear()
        self.gaps.extend(keep)
        return True
