"""Which firmware program, parameters and sample rate a sensor should run (pure).

The rule (paper section 3.2 and 5): the cheapest program that still answers every query
exactly. Nobody needs the sensor: it sleeps until woken, opening a short receive window every
`sleep_s` (the wake check: a new query is served within it). A loop pair
runs `count` when every query only counts vehicles, `vehicle` when some need speeds or
lengths, and `raw` only when the mote cannot run either (the proxy then detects vehicles
itself). A scalar sensor runs `aggregate` when every query rolls up windows of one pushed
window W, else `filter` when the queries' value ranges leave something out, else `raw`.

With a LIFETIME, the rate is the highest on the grid whose lifetime predicted by
`firmware_sim.model.predict` meets it; when even the slowest useful rate does not, the
choice says so (`lifetime_met=False`) and runs that slowest rate, the longest-lived option.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from firmware_sim.model import MIN_RATE_HZ, SECONDS_PER_DAY, Prediction, predict

from proxies.demand import SensorDemand

__all__ = ["DEFAULT_SLEEP_S", "ProgramChoice", "choose_program", "rate_grid"]

#: While asleep, a receive window this often (s): how long a new query may wait for the sensor.
#: Longer than any sample period it might skip, so sleeping saves more than it costs.
DEFAULT_SLEEP_S = 30.0
#: A pushed count window longer than this would misplace whole windows of vehicles when the
#: mote's windows are not aligned with the queries' (firmware windows start at the first reading).
MAX_COUNT_WINDOW_MS = 1000


@dataclass(frozen=True)
class ProgramChoice:
    """What the sensor should run; `program` "sleep" means: sleep until woken, listening for a
    wake every `sleep_s`."""

    program: str
    params: dict[str, Any] = field(default_factory=dict)
    rate_hz: float | None = None  # None: keep the sensor's own rate
    reason: str = ""
    prediction: Prediction | None = None
    lifetime_met: bool | None = None  # None: no LIFETIME asked
    sleep_s: float = DEFAULT_SLEEP_S
    gateway_detects: bool = False  # pair running raw: the proxy runs the vehicle detector
    # The rate is the sensor's own divided by this, for SAMPLE EVERY n ROWS (1: not lowered):
    # each reading it sends then stands for this many (the router counts on from there).
    every_rows: int = 1

    @property
    def period_s(self) -> float | None:
        return None if self.rate_hz is None else 1.0 / self.rate_hz

    def key(self) -> tuple:
        """What must match on the mote (program, parameters, rate) for it to be current."""
        return (self.program, _freeze(self.params), self.rate_hz)


def _freeze(v: Any) -> Any:
    if isinstance(v, dict):
        return tuple(sorted((k, _freeze(x)) for k, x in v.items()))
    if isinstance(v, list | tuple):
        return tuple(_freeze(x) for x in v)
    return v


def rate_grid(max_hz: float = 1000.0) -> list[float]:
    """Rates tried for a LIFETIME, ascending: whole periods of 3600..2 s, then 1..max_hz Hz."""
    slow = [1.0 / p for p in (3600, 1800, 1200, 900, 600, 300, 120, 60, 30, 20, 10, 5, 2)]
    return slow + [float(r) for r in range(1, int(max_hz) + 1)]


def choose_program(
    demand: SensorDemand,
    *,
    kind: str = "scalar",
    capabilities: Iterable[str] = (),
    role: str | None = None,
    current_rate_hz: float | None = None,
    rate_adjustable: bool = True,
    max_rate_hz: float | None = None,
    profile: str = "paper",
    listen_ms_per_s: float | None = None,
    vehicles_per_second: float | None = None,
    selectivity: float = 0.1,
    sleep_s: float = DEFAULT_SLEEP_S,
    grid: Sequence[float] | None = None,
) -> ProgramChoice:
    """The program for `demand` (see the module docstring). `capabilities` = hello programs;
    `max_rate_hz`: the fastest the sensor can sample (a trace replay: its trace's rate)."""
    caps = set(capabilities)
    if demand.idle:
        return ProgramChoice(
            "sleep", {}, None, "neither a query nor the archive needs this sensor", sleep_s=sleep_s
        )
    wanted_rate = 1.0 / demand.sample_period_s if demand.sample_period_s else current_rate_hz
    every = demand.sample_every_rows if kind != "pair" and rate_adjustable and wanted_rate else None
    if every is not None and wanted_rate is not None:
        wanted_rate /= every  # every query takes each n-th reading: sample that much slower
    lowered = wanted_rate if every is not None else None
    workload: dict[str, Any] = {}
    if listen_ms_per_s is not None:
        workload["listen_ms_per_s"] = min(1000.0, listen_ms_per_s)
    gateway_detects = False
    if kind == "pair":
        need = demand.needs or "vehicles"
        options = ("count", "vehicle", "raw") if need == "counts" else ("vehicle", "raw")
        program = next((p for p in options if not caps or p in caps), "raw")
        floor = MIN_RATE_HZ["counts" if need == "counts" else "vehicles"]
        params: dict[str, Any] = {}
        if program == "count":
            w = round((demand.window_s or 1.0) * 1000)
            params["period_ms"] = _largest_divisor_at_most(w, MAX_COUNT_WINDOW_MS)
            workload["period_ms"] = float(params["period_ms"])
            why = f"every query only counts vehicles, in windows of {w} ms"
        elif program == "vehicle":
            params["role"] = role or "upstream"
            why = "some query needs vehicle speeds or lengths"
        else:
            gateway_detects = True
            why = "the mote runs neither count nor vehicle: the proxy detects vehicles"
        if vehicles_per_second is not None and program in ("count", "vehicle"):
            workload["vehicles_per_second"] = vehicles_per_second
        rate: float | None = max(wanted_rate or floor, floor)
    else:
        floor = None
        # Every program that answers all the queries exactly; the cheapest by the cost model wins.
        candidates: list[tuple[str, dict[str, Any], dict[str, Any], str]] = []
        if demand.window_s is not None and (not caps or "aggregate" in caps):
            w = round(demand.window_s * 1000)
            candidates.append(
                (
                    "aggregate",
                    {"window_ms": w},
                    {"window_ms": float(w)},
                    f"every query aggregates windows that are multiples of {demand.window_s:g} s: "
                    "the mote sends one partial per window",
                )
            )
        if demand.ranges is not None and (not caps or "filter" in caps):
            candidates.append(
                (
                    "filter",
                    {"ranges": [list(r) for r in demand.ranges]},
                    {"selectivity": selectivity},
                    "every query filters readings: the mote sends only the union of their ranges",
                )
            )
        candidates.append(("raw", {}, {}, "a query or the archive needs every reading"))
        program, params, extra, why = _cheapest(candidates, wanted_rate, profile, workload)
        workload.update(extra)
        rate = wanted_rate
    if not rate_adjustable:
        rate = current_rate_hz
    elif max_rate_hz is not None and rate is not None and rate > max_rate_hz:
        rate = max_rate_hz
    if max_rate_hz is not None and grid is None:
        grid = [r for r in rate_grid() if r <= max_rate_hz * (1 + 1e-9)] or [max_rate_hz]
    if demand.lifetime_s is None or not rate_adjustable:
        prediction = _predict(program, rate, profile, workload)
        choice = ProgramChoice(
            program, params, rate, why, prediction, None, sleep_s, gateway_detects
        )
    else:
        choice = _for_lifetime(
            program,
            params,
            demand,
            rate,
            floor,
            profile,
            workload,
            why,
            sleep_s,
            gateway_detects,
            grid,
        )
    if every is not None and choice.rate_hz is not None and lowered is not None:
        if math.isclose(choice.rate_hz, lowered, rel_tol=1e-9):
            choice = replace(
                choice,
                every_rows=every,
                reason=f"{choice.reason}; {every} times slower than its own rate: every query "
                f"takes each {every}th reading (SAMPLE EVERY n ROWS)",
            )
    return choice


def _for_lifetime(
    program: str,
    params: dict[str, Any],
    demand: SensorDemand,
    wanted: float | None,
    floor: float | None,
    profile: str,
    workload: dict[str, Any],
    why: str,
    sleep_s: float,
    gateway_detects: bool,
    grid: Sequence[float] | None,
) -> ProgramChoice:
    lifetime = demand.lifetime_s
    assert lifetime is not None
    days = lifetime / SECONDS_PER_DAY
    rates = [r for r in (grid or rate_grid()) if floor is None or r >= floor]
    if floor is not None and (not rates or rates[0] > floor):
        rates.insert(0, floor)
    best: Prediction | None = None
    slowest: Prediction | None = None
    for r in rates:
        p = _predict(program, r, profile, workload)
        if p is None:
            continue
        slowest = slowest or p
        if p.lifetime_s >= lifetime:
            best = p  # rates ascend and power grows with the rate: keep the last that lasts
        else:
            break
    if best is not None:
        rate = best.rate_hz
        capped = False
        asked = demand.sample_period_s is not None or demand.sample_every_rows is not None
        if wanted is not None and asked and wanted < rate:
            # A faster rate than any query asked for buys nothing: keep the asked one.
            capped = True
            rate = wanted
            best = _predict(program, rate, profile, workload) or best
        reason = (
            f"{why}; {rate:g} Hz is the "
            + ("rate asked for, within" if capped else "highest rate lasting")
            + f" {days:g} days ({best.lifetime_days:.1f} days predicted at {best.power_mw:.3f} mW)"
        )
        return ProgramChoice(
            program,
            params,
            rate,
            reason,
            best,
            True,
            gateway_detects=gateway_detects,
            sleep_s=sleep_s,
        )
    if slowest is None:
        return ProgramChoice(
            program,
            params,
            wanted,
            f"{why}; none does: the cost model rejects every rate",
            None,
            False,
            sleep_s,
            gateway_detects,
        )
    reason = (
        f"{why}; none does: no rate of {program} lasts {days:g} days; the slowest useful, "
        f"{slowest.rate_hz:g} Hz, lasts {slowest.lifetime_days:.2f} days"
    )
    return ProgramChoice(
        program, params, slowest.rate_hz, reason, slowest, False, sleep_s, gateway_detects
    )


def _cheapest(
    candidates: list[tuple[str, dict[str, Any], dict[str, Any], str]],
    rate: float | None,
    profile: str,
    workload: dict[str, Any],
) -> tuple[str, dict[str, Any], dict[str, Any], str]:
    """The candidate with the lowest predicted power at `rate` (the first one when the rate is
    unknown). A pushdown that would cost more than sending raw readings (e.g. one partial per
    reading of a slow sensor) is not made."""
    if rate is None or len(candidates) == 1:
        return candidates[0]
    best, best_mw = candidates[-1], math.inf
    for c in candidates:
        p = _predict(c[0], rate, profile, {**workload, **c[2]})
        if p is not None and p.power_mw < best_mw:
            best, best_mw = c, p.power_mw
    program, params, extra, why = best
    if best is not candidates[0]:
        skipped = candidates[0][0]
        why = f"{why} ({skipped} would cost more at {rate:g} Hz)"
    return program, params, extra, why


def _predict(
    program: str, rate: float | None, profile: str, workload: dict[str, Any]
) -> Prediction | None:
    if rate is None or not (rate > 0 and math.isfinite(rate)):
        return None
    try:
        return predict(program, rate, profile, **workload)
    except ValueError:
        return None  # e.g. too slow to see the vehicles, or more cycles than the CPU has


def _largest_divisor_at_most(n: int, cap: int) -> int:
    if n <= cap:
        return max(1, n)
    for d in range(cap, 0, -1):
        if n % d == 0:
            return d
    return 1
