"""Typed records a mote program emits; they are what the proxy receives, decoded."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading (raw, filter and deadband programs)."""

    t: float
    value: float


@dataclass(frozen=True, slots=True)
class VehicleEvent:
    """A vehicle over one sensor of a loop pair.

    Upstream: t_on = t0 (covers S_u), t_off = t2 (leaves S_u); downstream: t_on = t1,
    t_off = t3 (paper section 5.1).
    """

    role: str
    t_on: float
    t_off: float


@dataclass(frozen=True, slots=True)
class Count:
    """Vehicles that arrived in [window_start, window_end)."""

    window_start: float
    window_end: float
    count: int


@dataclass(frozen=True, slots=True)
class PartialAggregate:
    """A window's partial aggregate: SUM/COUNT/MIN/MAX roll up exactly, AVG = sum / count."""

    sum: float
    count: int
    min: float
    max: float
    window_start: float
    window_end: float

    @property
    def avg(self) -> float:
        return self.sum / self.count

    def merge(self, other: PartialAggregate) -> PartialAggregate:
        """Combine two partials (e.g. windows of one mote, or motes of one window)."""
        return PartialAggregate(
            self.sum + other.sum,
            self.count + other.count,
            min(self.min, other.min),
            max(self.max, other.max),
            min(self.window_start, other.window_start),
            max(self.window_end, other.window_end),
        )


Record = Sample | VehicleEvent | Count | PartialAggregate
RECORD_TYPES: dict[str, type] = {
    "sample": Sample,
    "vehicle": VehicleEvent,
    "count": Count,
    "partial": PartialAggregate,
}
_KIND = {cls: kind for kind, cls in RECORD_TYPES.items()}


def record_to_dict(record: Record) -> dict[str, Any]:
    """A JSON/msgpack-friendly dict with a "kind" tag."""
    return {"kind": _KIND[type(record)], **dataclasses.asdict(record)}


def record_from_dict(data: dict[str, Any]) -> Record:
    """Inverse of record_to_dict; ValueError on an unknown kind or wrong fields."""
    fields = dict(data)
    kind = fields.pop("kind", None)
    cls = RECORD_TYPES.get(kind)  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown record kind {kind!r}; expected one of {sorted(RECORD_TYPES)}")
    try:
        return cls(**fields)
    except TypeError as exc:
        raise ValueError(f"bad {kind} record {data!r}: {exc}") from None
