"""Vehicle speed and length from a loop pair's events (paper section 5.1), sans-IO.

S_u reports (t0, t2) per vehicle (covers, leaves), S_d reports (t1, t3), `d` feet apart:

    speed  = d / (t1 - t0)          ft/s
    length = speed x (t2 - t0)      ft   (the paper prints t0 - t2; the sign is a typo)

Matching is the zipper join of the paper's Figure 4: both streams arrive in time order, and an
upstream event pairs with the first downstream event whose t1 falls in (t0, t0 + max_travel_s].
An event that finds no partner in its window comes out alone (outer join: speed and length
None), so a lost packet costs one vehicle's speed, never the alignment of all later ones.
Both pending lists are bounded (drop oldest, counted).

:class:`PairStreams` sits on the transport's messages: it learns pairs from hellos (attributes
`pair`, `role`, `separation_ft`) and turns `events` messages into vehicles.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

from sensors.protocol import Events, Hello, Message

__all__ = [
    "FPS_TO_MPH",
    "VEHICLE_COLUMNS",
    "PairStreams",
    "ReconstructedVehicle",
    "VehicleReconstructor",
]

FPS_TO_MPH = 3600.0 / 5280.0
VEHICLE_COLUMNS = ("pair", "t0", "speed_mph", "length_ft")


@dataclass(frozen=True, slots=True)
class ReconstructedVehicle:
    """A vehicle as the pair's events show it: matched over both sensors (speed and length
    known), or seen by one of them only."""

    pair: str
    t0: float | None  # None: only the downstream sensor saw it
    t1: float | None
    t2: float | None
    t3: float | None
    speed_fps: float | None
    length_ft: float | None

    @property
    def speed_mph(self) -> float | None:
        return None if self.speed_fps is None else self.speed_fps * FPS_TO_MPH

    @property
    def matched(self) -> bool:
        return self.speed_fps is not None

    def as_row(self) -> tuple[str, float | None, float | None, float | None]:
        """(pair, t0, speed_mph, length_ft): the row the query runtime consumes."""
        return (
            self.pair,
            self.t0 if self.t0 is not None else self.t1,
            self.speed_mph,
            self.length_ft,
        )


@dataclass
class ReconstructStats:
    matched: int = 0
    upstream_only: int = 0
    downstream_only: int = 0
    dropped_full: int = 0
    bad: int = 0


@dataclass
class VehicleReconstructor:
    """Zipper join of one pair's upstream and downstream events."""

    separation_ft: float
    pair: str = ""
    max_travel_s: float = 0.5
    bound: int = 1024
    stats: ReconstructStats = field(default_factory=ReconstructStats)

    def __post_init__(self) -> None:
        if self.separation_ft <= 0 or self.max_travel_s <= 0:
            raise ValueError("separation_ft and max_travel_s must be positive")
        self._up: list[tuple[float, float]] = []
        self._down: list[tuple[float, float]] = []

    def upstream(self, t0: float, t2: float) -> list[ReconstructedVehicle]:
        self._add(self._up, (t0, t2))
        return self._zip()

    def downstream(self, t1: float, t3: float) -> list[ReconstructedVehicle]:
        self._add(self._down, (t1, t3))
        return self._zip()

    def feed(self, msg: Events) -> list[ReconstructedVehicle]:
        """An `events` message from either mote; its name says which (upstream/downstream)."""
        add = {"upstream": self.upstream, "downstream": self.downstream}.get(msg.name)
        out: list[ReconstructedVehicle] = []
        for times in msg.times:
            if add is None or len(times) != 2 or times[1] < times[0]:
                self.stats.bad += 1
                continue
            out += add(times[0], times[1])
        return out

    def advance(self, now: float) -> list[ReconstructedVehicle]:
        """Time has reached `now` on both motes: close windows that can no longer match."""
        out: list[ReconstructedVehicle] = []
        while self._up and self._up[0][0] + self.max_travel_s < now:
            out.append(self._alone_up(self._up.pop(0)))
        while self._down and self._down[0][0] + self.max_travel_s < now:
            out.append(self._alone_down(self._down.pop(0)))
        return out + self._zip()

    def flush(self) -> list[ReconstructedVehicle]:
        out = self._zip()
        events = [(u[0], 0, u) for u in self._up] + [(d[0], 1, d) for d in self._down]
        self._up.clear()
        self._down.clear()
        for _, side, ev in sorted(events):
            out.append(self._alone_up(ev) if side == 0 else self._alone_down(ev))
        return out

    def _add(self, pending: list[tuple[float, float]], ev: tuple[float, float]) -> None:
        bisect.insort(pending, ev)  # a reordered packet still lands in time order
        if len(pending) > self.bound:
            pending.pop(0)
            self.stats.dropped_full += 1

    def _zip(self) -> list[ReconstructedVehicle]:
        out: list[ReconstructedVehicle] = []
        up, down = self._up, self._down
        while up and down:
            t0, t2 = up[0]
            t1, t3 = down[0]
            if t1 <= t0:  # downstream saw a vehicle upstream never reported
                out.append(self._alone_down(down.pop(0)))
            elif t1 - t0 > self.max_travel_s:  # no downstream partner for this one
                out.append(self._alone_up(up.pop(0)))
            else:
                up.pop(0)
                down.pop(0)
                speed = self.separation_ft / (t1 - t0)
                self.stats.matched += 1
                out.append(
                    ReconstructedVehicle(self.pair, t0, t1, t2, t3, speed, speed * (t2 - t0))
                )
        return out

    def _alone_up(self, ev: tuple[float, float]) -> ReconstructedVehicle:
        self.stats.upstream_only += 1
        return ReconstructedVehicle(self.pair, ev[0], None, ev[1], None, None, None)

    def _alone_down(self, ev: tuple[float, float]) -> ReconstructedVehicle:
        self.stats.downstream_only += 1
        return ReconstructedVehicle(self.pair, None, ev[0], None, ev[1], None, None)


class PairStreams:
    """Vehicles from a transport's messages: pairs are learned from the motes' hellos."""

    def __init__(self, *, max_travel_s: float = 0.5) -> None:
        self.max_travel_s = max_travel_s
        self.pairs: dict[str, VehicleReconstructor] = {}
        self._sensor_pair: dict[str, str] = {}

    def feed(self, sensor_id: str, msg: Message) -> list[ReconstructedVehicle]:
        if isinstance(msg, Hello):
            pair, sep = msg.attributes.get("pair"), msg.attributes.get("separation_ft")
            if isinstance(pair, str) and isinstance(sep, int | float) and sep > 0:
                self._sensor_pair[sensor_id] = pair
                if pair not in self.pairs:
                    self.pairs[pair] = VehicleReconstructor(
                        float(sep), pair=pair, max_travel_s=self.max_travel_s
                    )
            return []
        if isinstance(msg, Events):
            pair = self._sensor_pair.get(sensor_id)
            if pair is not None:
                return self.pairs[pair].feed(msg)
        return []

    def feed_all(self, items: Iterable[tuple[str, Message]]) -> list[ReconstructedVehicle]:
        out: list[ReconstructedVehicle] = []
        for sensor_id, msg in items:
            out += self.feed(sensor_id, msg)
        return out

    def flush(self) -> list[ReconstructedVehicle]:
        return [v for r in self.pairs.values() for v in r.flush()]
