"""`fjords-power calibrate`: the cost model's prediction against the firmware's own energy.

Every program of the protocol image runs in simavr (firmware_sim.loop) on a synthetic
loop-pair trace at several sample rates. *Measured* energy is what the runner counted on the
firmware (awake cycles, conversions, UART bytes and frames, receiver-on time) at the profile's
costs (:func:`firmware_sim.loop.measured_energy`). *Predicted* energy is the cost model's,
:func:`firmware_sim.model.predict_run` (``predict`` for the protocol wire, plus the run's
hello and last status): frame sizes from firmware_sim.wire, receive windows from the
firmware's listen rule, cycles from cycles.json (measured by `fjords-power measure` on other
traces). What the model is told is the workload, taken from the trace alone: the vehicles in
it, and the fraction of its readings the Python model of the program sends (selectivity,
change fraction, how they bunch), their typical size. Nothing comes from the firmware's run.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from firmware_sim import measure, model
from firmware_sim.cycles import CycleTable
from firmware_sim.loop import DEFAULT_BUILD, Image, build_image, measured_energy
from firmware_sim.profiles import Profile, resolve_profile
from firmware_sim.programs import make_program
from firmware_sim.records import PartialAggregate, Sample
from firmware_sim.wire import EPOCH_S, Mote, uint_bytes

__all__ = ["RATES", "Row", "calibrate", "trace_workload"]

#: Rates whose periods are whole ms dividing the 1 s windows (the firmware's periods are whole
#: ms); the cycles were measured at other rates (measure.PERIODS_MS) on other traces.
RATES = (10.0, 20.0, 50.0)
TEST_SEED = 11
SENSOR = "calib"
SHUTDOWN_S = 0.05  # the runner's power-fail tail (avr/loop.c)
SECONDS = 60.0


@dataclass(frozen=True)
class Row:
    program: str
    rate_hz: float
    predicted_j: float
    measured_j: float
    workload: dict[str, Any]

    @property
    def error(self) -> float:
        return self.predicted_j / self.measured_j - 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "program": self.program,
            "rate_hz": self.rate_hz,
            "predicted_j": self.predicted_j,
            "measured_j": self.measured_j,
            "error": self.error,
            "workload": self.workload,
        }


def trace_workload(program: str, counts: list[int], rate_hz: float) -> dict[str, Any]:
    """The model's workload parameters, from the trace and the Python model of the program
    (vehicles: those a detector sampling at `rate_hz` sees)."""
    prog = make_program(program, measure.PROGRAM_PARAMS[program])
    detector = make_program("vehicle", measure.PROGRAM_PARAMS["vehicle"])
    sent_at: list[int] = []
    values: list[float] = []
    vehicles = 0
    for k, value in enumerate(counts):
        vehicles += len(detector.feed(k / rate_hz, value))
        records = prog.feed(k / rate_hz, value)
        if records:
            sent_at.append(k)
        for r in records:
            if isinstance(r, Sample):
                values.append(r.value)
            elif isinstance(r, PartialAggregate):
                values += [r.min, r.max]
    seconds = len(counts) / rate_hz
    work: dict[str, Any] = {
        "vehicles_per_second": vehicles / seconds,
        "reading_counts": statistics.fmean(counts),
    }
    if values:
        work["value_bytes"] = statistics.fmean(uint_bytes(v) for v in values)
    if program in ("filter", "deadband"):
        share = len(sent_at) / len(counts)
        work["selectivity" if program == "filter" else "change_fraction"] = share
        work["burst"] = burst(sent_at, len(counts), rate_hz)
    params = measure.PROGRAM_PARAMS[program]
    if program == "aggregate":
        work["window_ms"] = params["window_ms"]
    if program == "count":
        work["period_ms"] = params["period_ms"]
    if program == "raw":
        work["batch"] = measure.FIRMWARE_EXTRA["raw"]["batch"]
    return work


def burst(sent_at: list[int], n: int, rate_hz: float) -> float:
    """Mean messages per arrival as the listen rule sees them: the arrival rate c for which a
    Poisson process leaves a listen period empty as often as these messages do (the fraction
    of start samples with no message in the next listen period is exp(-c L)); 1 for
    messages that never bunch."""
    if not sent_at:
        return 1.0
    span = max(1, round(measure.LISTEN_EVERY_MS / 1000 * rate_hz))
    flags = [0] * (n + 1)
    for k in sent_at:
        flags[k + 1] = 1
    prefix = list(itertools.accumulate(flags))
    starts = n - span + 1
    if starts <= 0:
        return 1.0
    empty = sum(prefix[k + span] == prefix[k] for k in range(starts)) / starts
    if empty <= 0:
        return 1.0
    per_s = -math.log(empty) * rate_hz / span  # arrivals per second
    messages_per_s = len(sent_at) / n * rate_hz
    return max(1.0, messages_per_s / per_s) if per_s > 0 else 1.0


def predicted(
    program: str,
    rate_hz: float,
    counts: list[int],
    profile: Profile,
    cycles: CycleTable | None = None,
) -> tuple[float, dict[str, Any]]:
    """The cost model's joules for a calibration run of `program` on `counts`."""
    work = trace_workload(program, counts, rate_hz)
    joules = model.predict_run(
        program,
        rate_hz,
        len(counts) / rate_hz,
        profile,
        mote=Mote(sensor_id=SENSOR, clock_s=EPOCH_S),
        tail_s=SHUTDOWN_S,
        listen_ms_per_s=measure.LISTEN_MS * 1000 / measure.LISTEN_EVERY_MS,
        listen_every_ms=measure.LISTEN_EVERY_MS,
        cycles=cycles,
        **work,
    )
    return joules, work


async def _calibrate(
    image: Image, profile: Profile, rates: tuple[float, ...], programs: list[str]
) -> list[Row]:
    rows: list[Row] = []
    for program in programs:
        for rate in rates:
            period_ms = round(1000 / rate)
            cfg = measure.config(program, period_ms, sensor_id=SENSOR)
            run = await measure.run_program(image, program, period_ms, TEST_SEED, cfg, SECONDS)
            counts = measure.trace_counts(program, period_ms, TEST_SEED, SECONDS)
            joules, work = predicted(program, rate, counts, profile)
            measured = measured_energy(run.stats, profile).total_j
            rows.append(Row(program, rate, joules, measured, work))
    return rows


def calibrate(
    profile: str | Profile = "paper",
    rates: tuple[float, ...] = RATES,
    programs: list[str] | None = None,
    build_dir: Path = DEFAULT_BUILD,
) -> dict[str, Any]:
    """Run the calibration; returns the rows and the summary (mean and worst |error|)."""
    prof = resolve_profile(profile)
    image = build_image(build_dir)
    names = programs or list(measure.PROGRAM_PARAMS)
    rows = asyncio.run(_calibrate(image, prof, rates, names))
    errors = [abs(r.error) for r in rows]
    return {
        "profile": prof.name,
        "seconds": SECONDS,
        "test_seed": TEST_SEED,
        "rows": [r.to_dict() for r in rows],
        "mean_abs_error": statistics.fmean(errors) if errors else math.nan,
        "max_abs_error": max(errors, default=math.nan),
    }
