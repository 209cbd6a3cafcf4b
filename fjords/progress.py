"""Event-time progress: watermarks, heartbeats, and the per-sensor tracker that makes them.

Windows close when the stream's progress passes their end. Progress is the latest sample time
every sensor feeding the stream has reached (a sensor with nothing to send advances it with a
heartbeat from its proxy), except that a silent or offline sensor may hold it back by at most
`max_lag` seconds; after that its samples older than the watermark are late, dropped and counted.
"""

from __future__ import annotations

from dataclasses import dataclass

INF = float("inf")


@dataclass(frozen=True, slots=True)
class Watermark:
    """In-band progress: no later item carries a sample time below `time`."""

    time: float


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A proxy's word that `sensor` has reached `time` though it sent no sample."""

    sensor: object
    time: float


class ProgressTracker:
    """Latest time per sensor -> the stream's watermark, bounded by `max_lag` seconds."""

    __slots__ = ("latest", "max_lag", "watermark", "max_time", "late")

    def __init__(self, max_lag: float = 60.0) -> None:
        self.latest: dict[object, float] = {}
        self.max_lag = max_lag
        self.watermark = -INF
        self.max_time = -INF
        self.late = 0

    def observe(self, sensor: object, time: float) -> None:
        latest = self.latest
        cur = latest.get(sensor)
        if cur is None or time > cur:
            latest[sensor] = time  # a sensor announced at -inf holds progress until it reports
            if time > self.max_time:
                self.max_time = time

    def forget(self, sensor: object) -> None:
        """A sensor removed for good (not merely offline) stops holding progress back."""
        self.latest.pop(sensor, None)

    def advance(self) -> float | None:
        """Recompute the watermark; return it if it moved forward, else None."""
        if not self.latest:
            return None
        floor = self.max_time - self.max_lag
        wm = min(self.latest.values())
        if wm < floor:
            wm = floor
        if wm > self.watermark:
            self.watermark = wm
            return wm
        return None

    def close(self) -> float:
        """End of input: everything is complete."""
        self.watermark = INF
        return INF
