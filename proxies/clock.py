"""What time it is for the proxies, and which of the times sensors claim are believable.

`StreamClock` gives "now" for liveness (offline after missed periods, sleep, energy
estimates): the caller's clock, or by default stream time, the latest admitted sample time any
sensor reported, which suits both replays at any speed and live sensors with synchronised
clocks. Since the fastest sensors drive it, a sensor is offline only if also silent on the wall
clock for as long as its limit takes at its own measured pace (`proxies.liveness`).

`ClockGuards` keeps, per stream, the future bound on readings' times: a
`fjords.runtime.progress.ProgressTracker` of its own, which sees every claim, admitted or not,
before a proxy can take an outlier as its latest time (or stream time as "now"). A rejected
reading is counted per sensor (`clock_rejects`, `clock_suspect` in the catalog).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fjords.runtime.fjord import Fjord
from fjords.runtime.progress import ProgressPolicy, ProgressTracker
from sensors.protocol import AggregateReport, Events, Listen, Message, Samples

if TYPE_CHECKING:
    from proxies.proxy import SensorProxy

__all__ = ["ClockGuards", "StreamClock", "claimed_time"]


class StreamClock:
    """ "now" for the proxies: `clock()` if given, else stream time (0 before any reading)."""

    __slots__ = ("clock", "stream_time")

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self.clock = clock
        self.stream_time = -math.inf  # the latest admitted time any sensor reported

    def now(self) -> float:
        if self.clock is not None:
            return self.clock()
        return self.stream_time if self.stream_time > -math.inf else 0.0

    def advance(self, t: float) -> bool:
        """A sensor reported `t`, later than stream time. True when this starts stream time as
        "now": whoever was heard before was heard "at 0", and is to be dated `t` instead."""
        began = self.stream_time == -math.inf and self.clock is None
        self.stream_time = t
        return began


class ClockGuards:
    """Per stream, the future bound on the times its sensors claim (see the module docstring)."""

    def __init__(self, fjord: Fjord, policy: ProgressPolicy) -> None:
        self._fjord = fjord
        self._policy = policy
        self._trackers: dict[str, ProgressTracker] = {}

    def admit_for(self, stream: str) -> Callable[[object, float], bool]:
        """The stream's check of one reading, `admit(sensor_key, t)`: records the claim and
        says whether it is plausible (the stream's bound is made with its first sensor)."""
        tracker = self._trackers.get(stream)
        if tracker is None:
            tracker = self._trackers[stream] = ProgressTracker(policy=self._policy)
        return tracker.observe

    def screen(self, stream: str, key: object, t: float | None) -> float | None:
        """A message arrives from sensor `key` claiming time `t`: the clocks are read once for
        its readings' checks, and `t` comes back if plausible (an outlier is never "now", and
        its readings are rejected as the proxy admits them)."""
        tracker = self._trackers.get(stream)
        if tracker is not None:
            tracker.begin()
            if t is not None and not tracker.plausible(key, t):
                return None
        return t

    def pace(self, stream: str, key: object, gap_s: float) -> None:
        """The sensor sends about every `gap_s`: the bound allows a message gap too."""
        tracker = self._trackers.get(stream)
        if tracker is not None:
            tracker.pace(key, gap_s)

    def forget(self, stream: str, key: object) -> None:
        tracker = self._trackers.get(stream)
        if tracker is not None:
            tracker.forget(key)

    def report(self, proxy: SensorProxy) -> dict[str, Any]:
        """`clock_rejects` (readings dated implausibly far ahead, dropped), `clock_suspect` and
        the offset of the sensor's latest reading from the gateway's clock and its peers."""
        tracker = self._trackers.get(proxy.stream)
        report: dict[str, Any] = (
            tracker.clock_report(proxy.progress_key)
            if tracker is not None
            else {"clock_rejects": 0, "clock_suspect": False}
        )
        stream = self._fjord.streams.get(proxy.stream)
        if stream is not None:  # rejected by the router itself (pushed around the proxies)
            s = stream.router.progress.sensors.get(proxy.progress_key)
            if s is not None:
                report["clock_rejects"] += s.rejects
        report["clock_rejects"] = max(report["clock_rejects"], proxy.stats.clock_rejects)
        return report


def claimed_time(msg: Message) -> float | None:
    """The latest sample time a message carries, or a listen's clock (None for hello, ack,
    a listen without time...)."""
    t: float | None = None
    if isinstance(msg, Listen):
        t = msg.time
    elif isinstance(msg, Samples) and msg.times:
        t = max(msg.times)
    elif isinstance(msg, Events) and msg.times:
        t = max((x[-1] for x in msg.times if x), default=None)
    elif isinstance(msg, AggregateReport):
        t = msg.end
    if t is None or not math.isfinite(t):
        return None
    return t
