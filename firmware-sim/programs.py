"""Mote programs as sans-IO state machines with exact per-sample cost accounts.

Each program mirrors an AVR C program in firmware-sim/avr/ operation for operation:
given the same A-to-D readings it emits the same messages, byte for byte (checked by
the simavr measurement). `feed(t, value)` takes one reading and returns the records
the mote sends on that sample; `last` and `total` account the cost (awake cycles from
the measured table, A-to-D conversions, messages and bits), which is what
`energy.EnergyAccount.charge` turns into joules.

Wire format (shared with the firmware): a message is one header byte
(type << 4 | sequence mod 16) then a little-endian payload; times are 16-bit sample
ticks (the proxy unwraps them against its own clock), readings 16-bit.
"""

from __future__ import annotations

import math
import struct
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from firmware_sim.cycles import CycleTable, ProgramCycles, load_cycle_table
from firmware_sim.records import Count, PartialAggregate, Record, Sample, VehicleEvent

MSG_RAW, MSG_VEHICLE_UP, MSG_VEHICLE_DOWN, MSG_COUNT = 1, 2, 3, 4
MSG_FILTER, MSG_AGGREGATE, MSG_DEADBAND = 5, 6, 7
RAW_BATCH = 8  # readings per raw message (the firmware's BATCH)
_EPS = 1e-9  # slack when comparing sample times with window ends


@dataclass(slots=True)
class Cost:
    """What a program spent; `bits` counts message bits (header + payload) only."""

    samples: int = 0
    cycles: float = 0.0
    adc: int = 0
    messages: int = 0
    bits: int = 0
    edges: int = 0

    def add(self, other: Cost) -> None:
        self.samples += other.samples
        self.cycles += other.cycles
        self.adc += other.adc
        self.messages += other.messages
        self.bits += other.bits
        self.edges += other.edges


def _u16(value: float) -> int:
    """A reading as the firmware's 16-bit field (rounded, clamped)."""
    return min(0xFFFF, max(0, round(value)))


class Program(ABC):
    """Base of all programs: tick counter, message framing and cost accounting."""

    name: ClassVar[str]
    cycles_key: ClassVar[str]
    PARAMS: ClassVar[dict[str, Any]] = {}

    def __init__(
        self, params: Mapping[str, Any] | None = None, *, cycles: CycleTable | None = None
    ):
        given = {} if params is None else params
        if not isinstance(given, Mapping):
            raise ValueError(
                f"program {self.name!r}: params must be a mapping, not {type(given).__name__}"
            )
        self.params = self._validate({**self.PARAMS, **given}, given)
        # these are the packed-format programs: their cycles are the packed builds'
        self.cost_model: ProgramCycles = (cycles or load_cycle_table("packed"))[self.cycles_key]
        self.tick = 0
        self.sequence = 0
        self.total = Cost()
        self.last = Cost()
        self.last_messages: list[bytes] = []

    # -- subclass hooks -------------------------------------------------------------
    @abstractmethod
    def _step(self, t: float, value: float) -> tuple[list[Record], int]:
        """Process one reading; return its records and detector edges."""

    def _finish(self, t: float) -> list[Record]:
        return []

    @classmethod
    def _check(cls, params: dict[str, Any]) -> None:
        """Raise ValueError for bad parameter values (subclasses check theirs)."""
        if not isinstance(params, dict):
            raise ValueError(f"program {cls.name!r}: params must be a mapping")

    # -- public ---------------------------------------------------------------------
    def feed(self, t: float, value: float) -> list[Record]:
        """One A-to-D sample taken at `t` seconds; the records sent on it."""
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not math.isfinite(value)
        ):
            raise ValueError(f"{self.name}: reading must be a finite number, not {value!r}")
        self.last_messages = []
        records, edges = self._step(float(t), float(value))
        self._account(samples=1, edges=edges)
        self.tick = (self.tick + 1) & 0xFFFF
        return records

    def flush(self, t: float) -> list[Record]:
        """End of run: records still held (partial batch or window)."""
        self.last_messages = []
        records = self._finish(float(t))
        self._account(samples=0, edges=0)
        return records

    def _account(self, samples: int, edges: int) -> None:
        messages = len(self.last_messages)
        cycles = (self.cost_model.sample if samples else 0.0) + self.cost_model.edge * edges
        cycles += self.cost_model.message * messages
        self.last = Cost(
            samples, cycles, samples, messages, 8 * sum(map(len, self.last_messages)), edges
        )
        self.total.add(self.last)

    def _send(self, msg_type: int, payload: bytes) -> None:
        self.last_messages.append(bytes([(msg_type << 4) | (self.sequence & 0x0F)]) + payload)
        self.sequence += 1

    @classmethod
    def _validate(cls, merged: dict[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(given, Mapping):
            raise ValueError(
                f"program {cls.name!r}: params must be a mapping, not {type(given).__name__}"
            )
        unknown = sorted(set(given) - set(cls.PARAMS))
        if unknown:
            raise ValueError(
                f"program {cls.name!r}: unknown parameter(s) {unknown}; known: {sorted(cls.PARAMS)}"
            )
        missing = sorted(k for k, v in merged.items() if v is _REQUIRED)
        if missing:
            raise ValueError(f"program {cls.name!r}: missing required parameter(s) {missing}")
        cls._check(merged)
        return merged


_REQUIRED = object()


def _number(
    program: str, key: str, value: Any, *, positive: bool = False, minimum: float | None = None
) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"program {program!r}: {key} must be a finite number, not {value!r}")
    if positive and value <= 0:
        raise ValueError(f"program {program!r}: {key} must be > 0, not {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"program {program!r}: {key} must be >= {minimum}, not {value!r}")
    return float(value)


class RawProgram(Program):
    """Every reading, RAW_BATCH per message (the firmware's packet)."""

    name = "raw"
    cycles_key = "raw"
    PARAMS: ClassVar[dict[str, Any]] = {}

    def __init__(
        self, params: Mapping[str, Any] | None = None, *, cycles: CycleTable | None = None
    ):
        super().__init__(params, cycles=cycles)
        self._batch: list[Sample] = []

    def _step(self, t: float, value: float) -> tuple[list[Record], int]:
        self._batch.append(Sample(t, value))
        if len(self._batch) < RAW_BATCH:
            return [], 0
        return self._emit(), 0

    def _finish(self, t: float) -> list[Record]:
        return self._emit() if self._batch else []

    def _emit(self) -> list[Record]:
        batch, self._batch = self._batch, []
        self._send(MSG_RAW, b"".join(struct.pack("<H", _u16(s.value)) for s in batch))
        return list(batch)


class _Detector:
    """The firmware's vehicle detector: dark below threshold, light again at +hysteresis."""

    def __init__(self, threshold: float, hysteresis: float):
        self.threshold = threshold
        self.release = threshold + hysteresis
        self.covered = False

    def step(self, value: float) -> int:
        """0 nothing, 1 covered, 2 uncovered."""
        if not self.covered:
            if value < self.threshold:
                self.covered = True
                return 1
        elif value >= self.release:
            self.covered = False
            return 2
        return 0


def _check_detector(name: str, params: dict[str, Any]) -> None:
    _number(name, "threshold", params["threshold"])
    _number(name, "hysteresis", params["hysteresis"], minimum=0)


class VehicleProgram(Program):
    """One message per vehicle: {t0, t2} upstream, {t1, t3} downstream."""

    name = "vehicle"
    cycles_key = "vehicle"
    PARAMS: ClassVar[dict[str, Any]] = {"role": "upstream", "threshold": 400, "hysteresis": 50}

    def __init__(
        self, params: Mapping[str, Any] | None = None, *, cycles: CycleTable | None = None
    ):
        super().__init__(params, cycles=cycles)
        self._detector = _Detector(self.params["threshold"], self.params["hysteresis"])
        self._on: tuple[float, int] | None = None

    @classmethod
    def _check(cls, params: dict[str, Any]) -> None:
        if params["role"] not in ("upstream", "downstream"):
            raise ValueError(
                f"program 'vehicle': role must be 'upstream' or 'downstream', not {params['role']!r}"
            )
        _check_detector(cls.name, params)

    def _step(self, t: float, value: float) -> tuple[list[Record], int]:
        edge = self._detector.step(value)
        if edge == 1:
            self._on = (t, self.tick)
        elif edge == 2 and self._on is not None:
            t_on, tick_on = self._on
            self._on = None
            up = self.params["role"] == "upstream"
            self._send(
                MSG_VEHICLE_UP if up else MSG_VEHICLE_DOWN, struct.pack("<HH", tick_on, self.tick)
            )
            return [VehicleEvent(self.params["role"], t_on, t)], 1
        return [], 1 if edge else 0


class _Windowed(Program):
    """Time windows [start, start + period) aligned to multiples of the period (mote time), so a
    program loaded mid-stream produces windows on the same boundaries as the gateway's queries."""

    period_key: ClassVar[str]

    def __init__(
        self, params: Mapping[str, Any] | None = None, *, cycles: CycleTable | None = None
    ):
        super().__init__(params, cycles=cycles)
        self._period = self.params[self.period_key] / 1000.0
        self._start: float | None = None

    @classmethod
    def _check(cls, params: dict[str, Any]) -> None:
        _number(cls.name, cls.period_key, params[cls.period_key], positive=True)

    def _roll(self, t: float) -> list[Record]:
        """Close the window if `t` is past its end; windows without readings are skipped."""
        if self._start is None:
            self._start = math.floor(t / self._period + _EPS) * self._period
            return []
        end = self._start + self._period
        if t < end - _EPS:
            return []
        records = self._close(self._start, end)
        skipped = math.floor((t - end) / self._period + _EPS)
        self._start = end + skipped * self._period
        return records

    @abstractmethod
    def _close(self, start: float, end: float) -> list[Record]: ...


class CountProgram(_Windowed):
    """Vehicles that arrived per period (default one second)."""

    name = "count"
    cycles_key = "count"
    period_key = "period_ms"
    PARAMS: ClassVar[dict[str, Any]] = {"period_ms": 1000, "threshold": 400, "hysteresis": 50}

    def __init__(
        self, params: Mapping[str, Any] | None = None, *, cycles: CycleTable | None = None
    ):
        super().__init__(params, cycles=cycles)
        self._detector = _Detector(self.params["threshold"], self.params["hysteresis"])
        self._vehicles = 0

    @classmethod
    def _check(cls, params: dict[str, Any]) -> None:
        super()._check(params)
        _check_detector(cls.name, params)

    def _close(self, start: float, end: float) -> list[Record]:
        self._send(MSG_COUNT, struct.pack("<HH", self.tick, min(self._vehicles, 0xFFFF)))
        record = Count(start, end, self._vehicles)
        self._vehicles = 0
        return [record]

    def _step(self, t: float, value: float) -> tuple[list[Record], int]:
        records = self._roll(t)
        edge = self._detector.step(value)
        if edge == 1:
            self._vehicles += 1
        return records, 1 if edge else 0

    def _finish(self, t: float) -> list[Record]:
        if self._start is None:
            return []
        records = self._close(self._start, t)
        self._start = None
        return records


class AggregateProgram(_Windowed):
    """SUM, COUNT, MIN, MAX per window of window_ms."""

    name = "aggregate"
    cycles_key = "aggregate"
    period_key = "window_ms"
    PARAMS: ClassVar[dict[str, Any]] = {"window_ms": _REQUIRED}

    def __init__(
        self, params: Mapping[str, Any] | None = None, *, cycles: CycleTable | None = None
    ):
        super().__init__(params, cycles=cycles)
        self._values: list[float] = []

    def _close(self, start: float, end: float) -> list[Record]:
        v = self._values
        self._values = []
        if not v:
            return []
        total = sum(v)
        self._send(
            MSG_AGGREGATE,
            struct.pack(
                "<HIHHH",
                self.tick,
                min(0xFFFFFFFF, max(0, round(total))),
                min(len(v), 0xFFFF),
                _u16(min(v)),
                _u16(max(v)),
            ),
        )
        return [PartialAggregate(total, len(v), min(v), max(v), start, end)]

    def _step(self, t: float, value: float) -> tuple[list[Record], int]:
        records = self._roll(t)
        self._values.append(value)
        return records, 0

    def _finish(self, t: float) -> list[Record]:
        if self._start is None:
            return []
        records = self._close(self._start, t)
        self._start = None
        return records


class FilterProgram(Program):
    """Readings inside a union of inclusive ranges (None = open end)."""

    name = "filter"
    cycles_key = "filter"
    PARAMS: ClassVar[dict[str, Any]] = {"ranges": _REQUIRED}

    @classmethod
    def _check(cls, params: dict[str, Any]) -> None:
        ranges = params["ranges"]
        if not isinstance(ranges, list | tuple) or not ranges:
            raise ValueError("program 'filter': ranges must be a non-empty list of [lo, hi]")
        parsed = []
        for r in ranges:
            if not isinstance(r, list | tuple) or len(r) != 2:
                raise ValueError(f"program 'filter': each range must be [lo, hi], not {r!r}")
            lo = -math.inf if r[0] is None else _number("filter", "range bound", r[0])
            hi = math.inf if r[1] is None else _number("filter", "range bound", r[1])
            if lo > hi:
                raise ValueError(f"program 'filter': empty range {list(r)!r} (lo > hi)")
            parsed.append((lo, hi))
        params["ranges"] = parsed

    def _step(self, t: float, value: float) -> tuple[list[Record], int]:
        for lo, hi in self.params["ranges"]:
            if lo <= value <= hi:
                self._send(MSG_FILTER, struct.pack("<HH", self.tick, _u16(value)))
                return [Sample(t, value)], 0
        return [], 0


class DeadbandProgram(Program):
    """A reading when it moved more than epsilon since the last one sent."""

    name = "deadband"
    cycles_key = "deadband"
    PARAMS: ClassVar[dict[str, Any]] = {"epsilon": _REQUIRED}

    def __init__(
        self, params: Mapping[str, Any] | None = None, *, cycles: CycleTable | None = None
    ):
        super().__init__(params, cycles=cycles)
        self._last: float | None = None

    @classmethod
    def _check(cls, params: dict[str, Any]) -> None:
        _number(cls.name, "epsilon", params["epsilon"], minimum=0)

    def _step(self, t: float, value: float) -> tuple[list[Record], int]:
        if self._last is None or abs(value - self._last) > self.params["epsilon"]:
            self._last = value
            self._send(MSG_DEADBAND, struct.pack("<HH", self.tick, _u16(value)))
            return [Sample(t, value)], 0
        return [], 0


PROGRAMS: dict[str, type[Program]] = {
    cls.name: cls
    for cls in (
        RawProgram,
        VehicleProgram,
        CountProgram,
        FilterProgram,
        AggregateProgram,
        DeadbandProgram,
    )
}


def make_program(
    name: str, params: Mapping[str, Any] | None = None, *, cycles: CycleTable | None = None
) -> Program:
    """The program `name` configured by `params` (as carried in a control message)."""
    cls = PROGRAMS.get(name)
    if cls is None:
        raise ValueError(f"unknown program {name!r}; expected one of {sorted(PROGRAMS)}")
    return cls(params, cycles=cycles)


ProgramFactory = Callable[[Mapping[str, Any] | None], Program]
