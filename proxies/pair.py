"""The shared state of a loop-detector pair's two proxies: vehicles from both motes' events.

Each mote of a pair has its own proxy (its own program, listen windows and acks), but a
vehicle's speed needs both: the pair's `PairJoin` zips the upstream and downstream events
(`sensors.reconstruct.VehicleReconstructor`) into one row per vehicle of the pair's stream:
`time` (t0, or t1 when only the downstream mote saw it), the pair id, `speed` (mph) and
`length` (ft). In `count` mode only the upstream mote's counts are pushed (the downstream
counts the same vehicles), and downstream events are ignored until upstream sends events again.
"""

from __future__ import annotations

from dataclasses import dataclass

from fjords.schema import Schema
from sensors.reconstruct import ReconstructedVehicle, VehicleReconstructor

__all__ = ["PAIR_ATTRIBUTES", "PairJoin", "PairStats"]

#: Hello attributes that make a mote one half of a loop pair.
PAIR_ATTRIBUTES = ("pair", "role", "separation_ft")


@dataclass(slots=True)
class PairStats:
    vehicles: int = 0
    matched: int = 0
    ignored_downstream: int = 0


class PairJoin:
    """Vehicles of one pair as tuples of `schema` (needs `time` and the pair column)."""

    def __init__(
        self,
        pair_id: str,
        separation_ft: float,
        *,
        schema: Schema,
        pair_field: str,
        speed_field: str = "speed",
        length_field: str = "length",
        max_travel_s: float = 0.5,
    ) -> None:
        self.pair_id = pair_id
        self.reconstructor = VehicleReconstructor(
            separation_ft, pair=pair_id, max_travel_s=max_travel_s
        )
        self.max_travel_s = max_travel_s
        self.stats = PairStats()
        self.latest: dict[str, float] = {}
        self.mode: dict[str, str] = {}  # role -> "events" | "counts" (what it sends now)
        self._width = len(schema)
        self._time = schema.index(schema.time or "time")
        self._pair = schema.index(pair_field)
        self._speed = schema.index(speed_field) if speed_field in schema else None
        self._length = schema.index(length_field) if length_field in schema else None
        self.heartbeat_time = float("-inf")

    def row(self, vehicle: ReconstructedVehicle) -> tuple:
        r: list[object] = [None] * self._width
        r[self._time] = vehicle.t0 if vehicle.t0 is not None else vehicle.t1
        r[self._pair] = self.pair_id
        if self._speed is not None:
            r[self._speed] = vehicle.speed_mph
        if self._length is not None:
            r[self._length] = vehicle.length_ft
        return tuple(r)

    def event(self, role: str, t_on: float, t_off: float) -> list[tuple]:
        """One vehicle over one sensor; returns the rows it completes."""
        self.mode[role] = "events"
        if role == "downstream" and self.mode.get("upstream") == "counts":
            self.stats.ignored_downstream += 1
            return []
        r = self.reconstructor
        vehicles = r.upstream(t_on, t_off) if role == "upstream" else r.downstream(t_on, t_off)
        return self._rows(vehicles)

    def counts(self, role: str) -> None:
        self.mode[role] = "counts"

    def advance(self, role: str, t: float) -> list[tuple]:
        """`role`'s mote has reached `t`: events that can no longer match come out alone."""
        if t > self.latest.get(role, float("-inf")):
            self.latest[role] = t
        active = [
            self.latest[r] for r, m in self.mode.items() if m == "events" and r in self.latest
        ]
        if not active:
            return []
        now = min(active)
        rows = self._rows(self.reconstructor.advance(now))
        self.heartbeat_time = max(self.heartbeat_time, now - self.max_travel_s)
        return rows

    def flush(self) -> list[tuple]:
        return self._rows(self.reconstructor.flush())

    def _rows(self, vehicles: list[ReconstructedVehicle]) -> list[tuple]:
        if self.mode.get("upstream") == "counts":
            vehicles = [v for v in vehicles if v.t0 is not None]
        self.stats.vehicles += len(vehicles)
        self.stats.matched += sum(1 for v in vehicles if v.speed_fps is not None)
        return [self.row(v) for v in vehicles]
