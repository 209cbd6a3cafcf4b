"""Average power and lifetime of a program at a sample rate, and the proxy's choice.

`predict` charges one second of steady-state work (per-second counts of samples,
detector edges and messages, the measured cycles per each) to an EnergyAccount, so a
prediction and an exact per-sample simulation use the same arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from firmware_sim.cycles import CycleTable, load_cycle_table
from firmware_sim.energy import EnergyAccount
from firmware_sim.profiles import Profile, resolve_profile
from firmware_sim.programs import PROGRAMS, RAW_BATCH

SECONDS_PER_DAY = 86_400.0
# What each need can be served by, cheapest first in the usual case.
NEEDS: dict[str, tuple[str, ...]] = {
    "counts": ("count", "vehicle", "raw"),
    "vehicles": ("vehicle", "raw"),
    "raw": ("raw",),
}
# Slowest useful sample rate per need: vehicles need 180 Hz for one-foot lengths at
# 60 mph (paper section 5.1); counts need two readings inside the shortest gap between
# vehicles (about 0.03 s at 5 vehicles/s), so 60 Hz; raw data has no floor.
MIN_RATE_HZ = {"vehicles": 180.0, "counts": 60.0, "raw": 1.0}


@dataclass(frozen=True)
class Prediction:
    program: str
    rate_hz: float
    profile: str
    power_mw: float
    current_ma: float
    lifetime_s: float
    lifetime_days: float
    breakdown_mw: dict[str, float]
    cycles_per_s: float
    messages_per_s: float
    bits_per_s: float
    workload: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if math.isinf(self.lifetime_s):
            d["lifetime_s"] = d["lifetime_days"] = None
        return d


def predict(
    program: str,
    rate_hz: float,
    profile: str | Profile = "paper",
    *,
    vehicles_per_second: float | None = None,
    listen_ms_per_s: float | None = None,
    period_ms: float = 1000.0,
    window_ms: float = 1000.0,
    selectivity: float = 0.1,
    change_fraction: float = 0.1,
    cycles: CycleTable | None = None,
) -> Prediction:
    """Steady-state power of `program` sampling at `rate_hz`.

    Workload: vehicles_per_second (vehicle, count; default the profile's), period_ms
    (count), window_ms (aggregate), selectivity (filter: fraction of readings sent),
    change_fraction (deadband: fraction sent), listen_ms_per_s (receive window per
    second; default the profile's).
    """
    prof = resolve_profile(profile)
    if program not in PROGRAMS:
        raise ValueError(f"unknown program {program!r}; expected one of {sorted(PROGRAMS)}")
    if (
        isinstance(rate_hz, bool)
        or not isinstance(rate_hz, int | float)
        or not (math.isfinite(rate_hz) and rate_hz > 0)
    ):
        raise ValueError(f"sample rate must be a positive number of Hz, not {rate_hz!r}")
    vps = prof.vehicles_per_second if vehicles_per_second is None else vehicles_per_second
    listen = prof.listen_ms_per_s if listen_ms_per_s is None else listen_ms_per_s
    _check_range("vehicles_per_second", vps, 0, math.inf)
    _check_range("listen_ms_per_s", listen, 0, 1000)
    _check_range("period_ms", period_ms, 1e-9, math.inf)
    _check_range("window_ms", window_ms, 1e-9, math.inf)
    _check_range("selectivity", selectivity, 0, 1)
    _check_range("change_fraction", change_fraction, 0, 1)
    table = cycles or load_cycle_table()
    cost = table[PROGRAMS[program].cycles_key]
    edges = 0.0
    workload: dict[str, float] = {"listen_ms_per_s": listen}
    if program == "raw":
        messages = rate_hz / RAW_BATCH
    elif program in ("vehicle", "count"):
        if 2 * vps > rate_hz:
            raise ValueError(
                f"{rate_hz:g} Hz is too slow to see {vps:g} vehicles/s "
                f"(each vehicle needs a covered and an uncovered reading)"
            )
        edges = 2 * vps
        messages = vps if program == "vehicle" else 1000.0 / period_ms
        workload["vehicles_per_second"] = vps
        if program == "count":
            workload["period_ms"] = period_ms
    elif program == "aggregate":
        messages = min(rate_hz, 1000.0 / window_ms)
        workload["window_ms"] = window_ms
    elif program == "filter":
        messages = rate_hz * selectivity
        workload["selectivity"] = selectivity
    else:  # deadband
        messages = rate_hz * change_fraction
        workload["change_fraction"] = change_fraction
    cycles_per_s = rate_hz * cost.sample + edges * cost.edge + messages * cost.message
    bits_per_s = messages * cost.message_bytes * 8
    if program == "raw":
        bits_per_s = rate_hz * (16 + 8 / RAW_BATCH)  # partial batches cost their share
    active_s = cycles_per_s * prof.cycles_scale / prof.clock_hz
    if active_s > 1.0:
        raise ValueError(
            f"{program} at {rate_hz:g} Hz needs {cycles_per_s:.0f} cycles/s, more than the "
            f"{prof.clock_hz:.0f} Hz CPU of profile {prof.name!r}"
        )
    account = EnergyAccount(prof)
    account.charge(1.0, cycles=cycles_per_s, adc=0, bits=0, messages=0, listen_s=listen / 1000.0)
    # fractional per-second counts: add them directly rather than through int fields
    account.joules["adc"] += rate_hz * prof.adc_joules
    account.joules["radio"] += (
        bits_per_s + messages * prof.packet_overhead_bits
    ) * prof.tx_joules_per_bit
    power = account.power_mw
    lifetime = account.lifetime_s
    return Prediction(
        program=program,
        rate_hz=float(rate_hz),
        profile=prof.name,
        power_mw=power,
        current_ma=account.current_ma,
        lifetime_s=lifetime,
        lifetime_days=lifetime / SECONDS_PER_DAY,
        breakdown_mw=account.breakdown_mw(),
        cycles_per_s=cycles_per_s,
        messages_per_s=messages,
        bits_per_s=bits_per_s,
        workload=workload,
    )


@dataclass(frozen=True)
class Choice:
    """The proxy's decision; `program` is None when no program meets the lifetime."""

    needs: str
    lifetime_s: float
    program: str | None
    rate_hz: float | None
    prediction: Prediction | None
    reason: str
    candidates: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["prediction"] = self.prediction.to_dict() if self.prediction else None
        return d


def choose(
    needs: str,
    lifetime_s: float,
    profile: str | Profile = "paper",
    rates: Iterable[float] | None = None,
    *,
    min_rate_hz: float | None = None,
    **workload: Any,
) -> Choice:
    """Cheapest program serving `needs`, at the highest rate that still lasts `lifetime_s`."""
    if needs not in NEEDS:
        raise ValueError(f"unknown need {needs!r}; expected one of {sorted(NEEDS)}")
    _check_range("lifetime", lifetime_s, 1e-9, math.inf)
    grid = sorted({float(r) for r in (rates if rates is not None else range(1, 1001))})
    if not grid or grid[0] <= 0:
        raise ValueError("rates must be a non-empty set of positive sample rates")
    floor = MIN_RATE_HZ[needs] if min_rate_hz is None else min_rate_hz
    usable = [r for r in grid if r >= floor]
    if not usable:
        raise ValueError(f"no rate in the grid reaches the {floor:g} Hz that {needs} need")
    rows: list[tuple[Prediction, Prediction | None]] = []
    for program in NEEDS[needs]:
        lasting: Prediction | None = None
        cheapest: Prediction | None = None
        for rate in usable:
            try:
                p = predict(program, rate, profile, **workload)
            except ValueError:
                continue  # e.g. too slow to see the vehicles, or CPU saturated
            cheapest = cheapest or p
            if p.lifetime_s >= lifetime_s:
                lasting = p  # rates ascend: the last one that lasts is the highest
        if cheapest is not None:
            rows.append((cheapest, lasting))
    rows.sort(key=lambda row: row[0].power_mw)
    chosen = next((lasting for _, lasting in rows if lasting is not None), None)
    candidates = [
        {
            "program": cheapest.program,
            "power_mw_at_min_rate": cheapest.power_mw,
            "lifetime_days_at_min_rate": cheapest.lifetime_days,
            "best_rate_hz": lasting.rate_hz if lasting else None,
            "chosen": chosen is not None and lasting is chosen,
        }
        for cheapest, lasting in rows
    ]
    if chosen is None:
        longest = max(candidates, key=lambda c: c["lifetime_days_at_min_rate"], default=None)
        detail = (
            f"; the longest-lived, {longest['program']} at {floor:g} Hz, lasts "
            f"{longest['lifetime_days_at_min_rate']:.2f} days"
            if longest
            else ""
        )
        return Choice(
            needs,
            lifetime_s,
            None,
            None,
            None,
            f"none does: no program serving {needs} lasts "
            f"{lifetime_s / SECONDS_PER_DAY:.2f} days at >= {floor:g} Hz{detail}",
            candidates,
        )
    reason = (
        f"{chosen.program} is the cheapest program serving {needs}; {chosen.rate_hz:g} Hz is "
        f"the highest rate lasting {lifetime_s / SECONDS_PER_DAY:.2f} days "
        f"({chosen.lifetime_days:.2f} days at {chosen.power_mw:.3f} mW)"
    )
    return Choice(needs, lifetime_s, chosen.program, chosen.rate_hz, chosen, reason, candidates)


def _check_range(name: str, value: Any, lo: float, hi: float) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) or value == math.inf == hi)
        or not lo <= value <= hi
    ):
        raise ValueError(f"{name} must be a number in [{lo:g}, {hi:g}], not {value!r}")
