"""`fjords-power calibrate`: the cost model's energy against the firmware's own, in the loop.

Every program of the protocol image runs in simavr (firmware_sim.loop) on a synthetic
loop-pair trace at several sample rates. *Measured* energy is what the runner counted on the
firmware (awake cycles, conversions, UART bytes and frames, receiver-on time) at the profile's
costs (:func:`firmware_sim.loop.measured_energy`). *Predicted* energy is the cost model's:
the workload comes from the Python model of the program on the same trace (messages, detector
edges, listen windows, each message encoded and framed by the gateway's own protocol code for
its size on the air), and awake cycles from a per-program linear fit,
``cycles = base + sample * samples + edge * edges + message * messages + window * windows``,
made on *other* traces (training seeds) than the ones compared, so the table is a test of the
model, not of the fit.
"""

from __future__ import annotations

import asyncio
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from firmware_sim.energy import EnergyAccount
from firmware_sim.loop import (
    DEFAULT_BUILD,
    FirmwareMote,
    Image,
    MoteConfig,
    build_image,
    measured_energy,
)
from firmware_sim.profiles import Profile, resolve_profile
from firmware_sim.programs import make_program
from firmware_sim.traces import vehicle_pair_trace

__all__ = ["PROGRAM_PARAMS", "Row", "calibrate"]

#: Each program's parameters in the calibration (values in A-to-D counts: scale 1).
PROGRAM_PARAMS: dict[str, dict[str, Any]] = {
    "raw": {},
    "filter": {"ranges": [[None, 299], [820, None]]},
    "deadband": {"epsilon": 20},
    "aggregate": {"window_ms": 1000},
    "count": {"period_ms": 1000},
    "vehicle": {"role": "upstream"},
}
#: The firmware's extra parameters (raw batches as the Python model does).
FIRMWARE_EXTRA: dict[str, dict[str, Any]] = {"raw": {"batch": 8}}
#: Rates whose periods are whole ms dividing the 1 s windows, so that the firmware's windows
#: (whole samples) and the model's (time) agree; the training rates are other rates.
RATES = (10.0, 20.0, 50.0)
TRAIN_RATES = (5.0, 8.0, 25.0, 40.0)
TRAIN_SEEDS = (7, 8)
TEST_SEED = 11
SECONDS = 30.0
VEHICLES_PER_SECOND = 1.0
LISTEN_MS = 20
LISTEN_EVERY_MS = 1000
SENSOR = "calib"
SHUTDOWN_S = 0.05  # the runner's power-fail tail (avr/loop.c)


@dataclass(frozen=True)
class Workload:
    """What the model says a run does (from the Python program, not from the firmware)."""

    samples: int
    edges: int
    messages: int  # data messages
    windows: int
    frames: int  # every frame: hello, data, bare listens, status
    tx_bytes: int


@dataclass(frozen=True)
class Row:
    program: str
    rate_hz: float
    predicted_j: float
    measured_j: float

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
        }


def _whole(t: float) -> float | int:
    """Times as the firmware encodes them: integers when whole seconds."""
    ms = round(t * 1000)
    return ms // 1000 if ms % 1000 == 0 else ms / 1000


def workload(program: str, counts: list[int], rate_hz: float) -> Workload:
    """Run the Python model of `program` on `counts`; size its frames with the protocol."""
    import msgspec

    from sensors.framing import encode_frame
    from sensors.motes.mote import records_to_messages
    from sensors.protocol import Hello, Listen, Status

    model = make_program(program, PROGRAM_PARAMS[program])
    seq = iter(range(1 << 30))
    hello = Hello(
        sensor_id=SENSOR,
        seq=next(seq),
        schema=(("value", "float"),),
        programs=("aggregate", "count", "deadband", "filter", "raw", "vehicle"),
        program=program,
        sample_period_ms=round(1000 / rate_hz),
    )
    frames, tx = 1, len(encode_frame(hello))
    edges = messages = windows = 0
    period_ms = round(1000 / rate_hz)
    next_listen = LISTEN_EVERY_MS
    for k, value in enumerate(counts):
        t_ms = k * period_ms
        records = model.feed(t_ms / 1000, value)
        edges += model.last.edges
        out = records_to_messages(SENSOR, program, records, seq)
        out = [_canonical(m) for m in out]
        listen = False
        if t_ms >= next_listen and (out or t_ms >= next_listen + LISTEN_EVERY_MS):
            next_listen = t_ms + LISTEN_EVERY_MS
            listen = True
        if listen:
            windows += 1
            if out:
                out[-1] = msgspec.structs.replace(out[-1], listen_ms=LISTEN_MS)
            else:
                out.append(Listen(sensor_id=SENSOR, seq=next(seq), duration_ms=LISTEN_MS))
        messages += sum(1 for m in out if not isinstance(m, Listen))
        for m in out:
            frames += 1
            tx += len(encode_frame(m))
    status = Status(sensor_id=SENSOR, seq=next(seq), online=False, reason="power failing")
    return Workload(
        len(counts), edges, messages, windows, frames + 1, tx + len(encode_frame(status))
    )


def _int(v: Any) -> Any:
    """Readings in counts (scale 1) go as integers, as the firmware sends them."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _canonical(msg: Any) -> Any:
    """The firmware's encoding of the same message: whole-second times as integers."""
    import msgspec

    from sensors.protocol import Aggregate, Events, Samples

    if isinstance(msg, Samples):
        rows = tuple(tuple(_int(v) for v in row) for row in msg.rows)
        return msgspec.structs.replace(msg, times=tuple(_whole(t) for t in msg.times), rows=rows)
    if isinstance(msg, Events):
        times = tuple(tuple(_whole(t) for t in ts) for ts in msg.times)
        return msgspec.structs.replace(msg, times=times)
    if isinstance(msg, Aggregate):
        values = {k: _int(v) for k, v in msg.values.items()}
        return msgspec.structs.replace(
            msg, start=_whole(msg.start), end=_whole(msg.end), values=values
        )
    return msg


def lstsq(rows: list[list[float]], y: list[float]) -> list[float]:
    """Least squares by the normal equations with a tiny ridge (collinear features, e.g. a
    window with every message, share their cost); all-zero features get 0."""
    n = len(rows[0])
    used = [j for j in range(n) if any(r[j] for r in rows)]
    a = [[sum(r[i] * r[j] for r in rows) for j in used] for i in used]
    b = [sum(r[i] * v for r, v in zip(rows, y, strict=True)) for i in used]
    ridge = 1e-9 * sum(a[k][k] for k in range(len(used))) / max(1, len(used))
    for k in range(len(used)):
        a[k][k] += ridge
    m = len(used)
    for col in range(m):  # Gaussian elimination with partial pivoting
        pivot = max(range(col, m), key=lambda r: abs(a[r][col]))
        a[col], a[pivot] = a[pivot], a[col]
        b[col], b[pivot] = b[pivot], b[col]
        for r in range(col + 1, m):
            f = a[r][col] / a[col][col]
            for c in range(col, m):
                a[r][c] -= f * a[col][c]
            b[r] -= f * b[col]
    sol = [0.0] * m
    for r in range(m - 1, -1, -1):
        sol[r] = (b[r] - sum(a[r][c] * sol[c] for c in range(r + 1, m))) / a[r][r]
    coef = [0.0] * n
    for j, v in zip(used, sol, strict=True):
        coef[j] = v
    return coef


def _features(w: Workload) -> list[float]:
    return [1.0, w.samples, w.edges, w.messages, w.windows]


async def _run(image: Image, program: str, rate_hz: float, seed: int) -> tuple[Workload, dict]:
    trace = vehicle_pair_trace(
        SECONDS, rate_hz=rate_hz, vehicles_per_second=VEHICLES_PER_SECOND, seed=seed
    )
    role = "downstream" if PROGRAM_PARAMS[program].get("role") == "downstream" else "upstream"
    counts = trace.adc_counts(role)
    period_ms = round(1000 / rate_hz)
    config = MoteConfig(
        SENSOR,
        period_ms=period_ms,
        program=program,
        params={**PROGRAM_PARAMS[program], **FIRMWARE_EXTRA.get(program, {})},
        listen_ms=LISTEN_MS,
        listen_every_ms=LISTEN_EVERY_MS,
    )
    async with FirmwareMote(config, counts, period_ms, image=image, window_wall_ms=0) as mote:
        while await mote.read():
            pass
        stats = await mote.wait()
    return workload(program, counts, rate_hz), stats


def predicted_energy(w: Workload, cycles: float, rate_hz: float, profile: Profile) -> EnergyAccount:
    """The model's account of a run (the same five terms as `model.predict`)."""
    account = EnergyAccount(profile)
    elapsed = w.samples * round(1000 / rate_hz) / 1000 + SHUTDOWN_S
    active = account.add_cycles(cycles)
    account.add_adc(w.samples)
    account.add_bits_sent(8 * w.tx_bytes, w.frames)
    account.add_listen(w.windows * LISTEN_MS / 1000)
    account.add_idle(max(0.0, elapsed - active))
    account.advance(elapsed)
    return account


async def _calibrate(
    image: Image, profile: Profile, rates: tuple[float, ...], programs: list[str]
) -> tuple[list[Row], dict[str, list[float]]]:
    rows: list[Row] = []
    fits: dict[str, list[float]] = {}
    for program in programs:
        train = [await _run(image, program, r, s) for s in TRAIN_SEEDS for r in TRAIN_RATES]
        coef = lstsq([_features(w) for w, _ in train], [st["awake_cycles"] for _, st in train])
        fits[program] = coef
        for rate in rates:
            w, stats = await _run(image, program, rate, TEST_SEED)
            cycles = sum(f * c for f, c in zip(_features(w), coef, strict=True))
            predicted = predicted_energy(w, max(0.0, cycles), rate, profile).total_j
            measured = measured_energy(stats, profile).total_j
            rows.append(Row(program, rate, predicted, measured))
    return rows, fits


def calibrate(
    profile: str | Profile = "paper",
    rates: tuple[float, ...] = RATES,
    programs: list[str] | None = None,
    build_dir: Path = DEFAULT_BUILD,
) -> dict[str, Any]:
    """Run the calibration; returns the rows and the summary (mean and worst |error|)."""
    prof = resolve_profile(profile)
    image = build_image(build_dir)
    rows, fits = asyncio.run(_calibrate(image, prof, rates, programs or list(PROGRAM_PARAMS)))
    errors = [abs(r.error) for r in rows]
    return {
        "profile": prof.name,
        "seconds": SECONDS,
        "train": {"rates_hz": list(TRAIN_RATES), "seeds": list(TRAIN_SEEDS)},
        "test_seed": TEST_SEED,
        "rows": [r.to_dict() for r in rows],
        "cycle_fits": {
            p: dict(zip(("base", "sample", "edge", "message", "window"), c, strict=True))
            for p, c in fits.items()
        },
        "mean_abs_error": statistics.fmean(errors) if errors else math.nan,
        "max_abs_error": max(errors, default=math.nan),
    }
