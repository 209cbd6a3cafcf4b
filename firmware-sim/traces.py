"""Synthetic light-sensor traces for a traffic loop pair (paper section 5.1).

Vehicles arrive as a Poisson process (with a minimum gap so they do not overlap over
a sensor), with normally distributed speeds and a car/truck length mix. Two light
sensors lie `separation_ft` apart in one lane; a vehicle darkens a sensor while it is
over it. Used by the tests, by the simavr measurement and by sensors/'s simulated
traffic motes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

MPH_TO_FPS = 5280.0 / 3600.0
ADC_MAX = 1023


@dataclass(frozen=True, slots=True)
class GroundTruthVehicle:
    """Ground truth for one vehicle: t0/t2 over S_u, t1/t3 over S_d (seconds)."""

    t0: float
    t1: float
    t2: float
    t3: float
    speed_fps: float
    length_ft: float


@dataclass(slots=True)
class LoopPairTrace:
    """Readings of both sensors at `rate_hz`, sample k taken at t = k / rate_hz."""

    rate_hz: float
    separation_ft: float
    vehicles: list[GroundTruthVehicle]
    upstream: list[float] = field(repr=False)
    downstream: list[float] = field(repr=False)

    def time(self, k: int) -> float:
        return k / self.rate_hz

    def samples(self, role: str = "upstream") -> Iterator[tuple[float, float]]:
        """(t, value) pairs for one sensor, ready for Program.feed."""
        values = self._values(role)
        return ((k / self.rate_hz, v) for k, v in enumerate(values))

    def adc_counts(self, role: str = "upstream") -> list[int]:
        """The readings as 10-bit A-to-D counts (what the firmware sees)."""
        return [min(ADC_MAX, max(0, round(v))) for v in self._values(role)]

    def _values(self, role: str) -> list[float]:
        if role == "upstream":
            return self.upstream
        if role == "downstream":
            return self.downstream
        raise ValueError(f"role must be 'upstream' or 'downstream', not {role!r}")


def vehicle_pair_trace(
    duration_s: float,
    *,
    rate_hz: float = 180.0,
    vehicles_per_second: float = 1.0,
    separation_ft: float = 6.0,
    speed_mph: tuple[float, float] = (60.0, 8.0),
    truck_fraction: float = 0.08,
    min_gap_s: float = 0.03,
    ambient: float = 800.0,
    dark: float = 150.0,
    noise: float = 8.0,
    seed: int = 0,
    quantize: bool = True,
) -> LoopPairTrace:
    """A trace of `duration_s` seconds; `quantize` rounds readings to A-to-D counts.

    Speeds are normal(mean, sd) mph clipped to 15..100; cars are normal(15, 1.5) ft,
    trucks uniform(40, 70) ft. `min_gap_s` is the shortest time between one vehicle
    leaving a sensor and the next covering it (at 5 vehicles/s and 60 mph the paper's
    "vehicle every 18 feet" leaves about 0.03 s).
    """
    if duration_s <= 0 or rate_hz <= 0:
        raise ValueError("duration_s and rate_hz must be positive")
    if vehicles_per_second < 0 or separation_ft <= 0:
        raise ValueError("vehicles_per_second must be >= 0 and separation_ft > 0")
    rng = random.Random(seed)
    vehicles: list[GroundTruthVehicle] = []
    t = 0.0
    prev: GroundTruthVehicle | None = None
    while vehicles_per_second > 0:
        t += rng.expovariate(vehicles_per_second)
        mean, sd = speed_mph
        speed = min(100.0, max(15.0, rng.gauss(mean, sd))) * MPH_TO_FPS
        if rng.random() < truck_fraction:
            length = rng.uniform(40.0, 70.0)
        else:
            length = max(10.0, rng.gauss(15.0, 1.5))
        t0 = t
        if prev is not None:  # leave min_gap_s over both sensors after the previous one
            t0 = max(t0, prev.t2 + min_gap_s, prev.t3 + min_gap_s - separation_ft / speed)
        t = t0
        dwell = length / speed
        v = GroundTruthVehicle(
            t0,
            t0 + separation_ft / speed,
            t0 + dwell,
            t0 + separation_ft / speed + dwell,
            speed,
            length,
        )
        if v.t3 >= duration_s:
            break
        vehicles.append(v)
        prev = v
    n = math.floor(duration_s * rate_hz)
    up = _render(n, rate_hz, [(v.t0, v.t2) for v in vehicles], ambient, dark, noise, rng, quantize)
    down = _render(
        n, rate_hz, [(v.t1, v.t3) for v in vehicles], ambient, dark, noise, rng, quantize
    )
    return LoopPairTrace(rate_hz, separation_ft, vehicles, up, down)


def _render(
    n: int,
    rate_hz: float,
    covered: list[tuple[float, float]],
    ambient: float,
    dark: float,
    noise: float,
    rng: random.Random,
    quantize: bool,
) -> list[float]:
    values = []
    j = 0
    for k in range(n):
        t = k / rate_hz
        while j < len(covered) and covered[j][1] <= t:
            j += 1
        level = dark if j < len(covered) and covered[j][0] <= t < covered[j][1] else ambient
        v = level + rng.gauss(0.0, noise) if noise else level
        values.append(float(min(ADC_MAX, max(0, round(v)))) if quantize else v)
    return values
