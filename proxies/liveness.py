"""Whether a sensor is online, from the gaps between its messages (sans-IO).

`now` is the caller's clock (the manager's: by default the stream's event time). A sensor is
offline after `offline_after` expected message gaps of silence, where the expected gap is the
longest recent gap between its messages and at least a raw packet's worth of its sample periods;
asleep, at least `offline_after` wake checks (scaled by how much faster the caller's clock runs
than the sensor's). A message, or an online status, brings it back; MQTT's last will (an offline
status) takes it offline at once. Stream progress is not decided here (`fjords.progress`).
"""

from __future__ import annotations

from typing import TypeVar

__all__ = ["Liveness", "Recent"]

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

    def __init__(self, now: float, offline_after: float) -> None:
        if offline_after <= 0:
            raise ValueError("offline_after must be > 0")
        self.offline_after = offline_after
        self.online = True
        self.last_heard = now
        self.created = now
        self.spells = 0  # times it went offline
        self.gaps: Recent[float] = Recent(8)

    def heard(self, now: float, *, first: bool) -> None:
        """A message at `now` (`first`: the first since the hello, whose gap means nothing)."""
        if now > self.last_heard and not first:
            self.gaps.append(now - self.last_heard)
        self.last_heard = max(self.last_heard, now)

    def expected_gap(self, min_gap: float) -> float:
        """How long silence is normal: the longest recent gap between messages, and at least
        `min_gap` (a raw packet's worth of sample periods: the longest a `raw` mote holds its
        readings)."""
        return max([min_gap, *self.gaps, 1e-9])

    def check(self, now: float, limit: float) -> str | None:
        """Offline if silent longer than `limit`; returns why, if it went offline now."""
        silent = now - self.last_heard
        if self.online and silent > limit:
            return self.go_offline(f"silent for {silent:g} s")
        return None

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
