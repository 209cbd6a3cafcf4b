"""Measure the protocol image's awake cycles in simavr and fit the cycles table.

    python -m firmware_sim.measure [--write] [--build-dir DIR]     (fjords-power measure)

Every program of the protocol image (avr/image.c, the firmware the gateway talks to) runs in
the loop runner (firmware_sim.loop) on synthetic loop-pair traces at several sample rates.
Its frames are decoded with the gateway's own protocol code; the run fails if the firmware's
data messages are not the ones its Python model sends on the same trace, so the table can only
describe code that behaves like the model. Per program the awake cycles of a run are fitted as

    cycles = boot + sample * conversions + edge * detector edges + message * data messages
           + window * receive windows + listen * bare listen frames + byte * bytes sent

(least squares over the runs), which is what `firmware_sim.model.predict` charges; and what
authentication adds (`auth`: firmware_sim.measure_auth), which `predict(..., mac=True)`
charges. Needs
avr-gcc, avr-libc and libsimavr-dev (scripts/install-system-deps).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from firmware_sim.cycles import CycleTable, parse_cycle_table
from firmware_sim.loop import (
    DEFAULT_BUILD,
    F_CPU,
    FirmwareMote,
    Image,
    LoopError,
    MoteConfig,
    build_image,
    toolchain_missing,
)
from firmware_sim.programs import make_program
from firmware_sim.traces import vehicle_pair_trace
from firmware_sim.wire import EPOCH_S

__all__ = [
    "COEFFICIENTS",
    "PROGRAM_PARAMS",
    "MeasurementError",
    "Run",
    "compare",
    "lstsq",
    "measure",
    "run_program",
    "toolchain_missing",
]

PACKAGE = Path(__file__).resolve().parent
TABLE_PATH = PACKAGE / "cycles.json"

#: Each program's parameters when measured (values in A-to-D counts: scale 1).
PROGRAM_PARAMS: dict[str, dict[str, Any]] = {
    "raw": {},
    "filter": {"ranges": [[None, 299], [820, None]]},
    "deadband": {"epsilon": 20},
    "aggregate": {"window_ms": 1000},
    "count": {"period_ms": 1000},
    "vehicle": {"role": "upstream"},
}
#: What the firmware needs beyond the Python model's parameters (raw batches as the model's).
FIRMWARE_EXTRA: dict[str, dict[str, Any]] = {"raw": {"batch": 8}}
#: Sample periods (whole ms) and trace seeds of the fit; calibration uses other seeds.
PERIODS_MS = (200, 125, 40, 25)
SEEDS = (7, 8)
SECONDS = 30.0
VEHICLES_PER_SECOND = 1.0
LISTEN_MS = 20
LISTEN_EVERY_MS = 1000
SENSOR = "measure"
#: Coefficients shared by every program (the runtime's: boot, receive window, bare listen frame,
#: byte sent, a time encoded as float64 or as an integer), then each program's own.
SHARED = ("boot", "window", "listen", "byte", "message", "float_time", "int_time", "reading")
OWN = ("sample", "edge")
COEFFICIENTS = SHARED + OWN


class MeasurementError(RuntimeError):
    """The toolchain failed, or the firmware disagreed with its Python model."""


@dataclass(frozen=True)
class Run:
    """One firmware run: what it did (from its own output) and what it cost (its counts)."""

    program: str
    period_ms: int
    seed: int
    conversions: int
    edges: int
    messages: int  # data messages (samples, events, aggregate)
    windows: int
    listens: int  # bare listen frames
    tx_bytes: int
    float_times: int  # times in data messages that are not whole seconds (float64)
    int_times: int  # whole-second times (msgpack integers)
    readings: int  # values in data messages (readings, partials' sum/min/max, counts)
    stats: dict[str, Any]

    def features(self, programs: list[str]) -> list[float]:
        """Shared columns (SHARED), then sample and edge of each program in turn."""
        own = [0.0] * (len(OWN) * len(programs))
        i = len(OWN) * programs.index(self.program)
        own[i : i + len(OWN)] = [self.conversions, self.edges]
        shared = [1.0, self.windows, self.listens, self.tx_bytes, self.messages]
        return shared + [self.float_times, self.int_times, self.readings] + own


def config(
    program: str, period_ms: int, sensor_id: str = SENSOR, start_ms: int = EPOCH_S * 1000
) -> MoteConfig:
    """The mote a measurement or calibration runs: an epoch clock, as a flashed mote has."""
    return MoteConfig(
        sensor_id,
        period_ms=period_ms,
        start_ms=start_ms,
        program=program,
        params={**PROGRAM_PARAMS[program], **FIRMWARE_EXTRA.get(program, {})},
        listen_ms=LISTEN_MS,
        listen_every_ms=LISTEN_EVERY_MS,
    )


def trace_counts(program: str, period_ms: int, seed: int, seconds: float = SECONDS) -> list[int]:
    """The A-to-D readings a program is measured on (the loop pair, upstream but for
    a downstream vehicle role)."""
    trace = vehicle_pair_trace(
        seconds, rate_hz=1000 / period_ms, vehicles_per_second=VEHICLES_PER_SECOND, seed=seed
    )
    role = "downstream" if PROGRAM_PARAMS[program].get("role") == "downstream" else "upstream"
    return trace.adc_counts(role)


async def run_program(
    image: Image,
    program: str,
    period_ms: int,
    seed: int,
    mote: MoteConfig | None = None,
    seconds: float = SECONDS,
) -> Run:
    """Run `program` on its trace in the loop; check its data messages against the model."""
    from sensors.framing import FrameDecoder, FrameError
    from sensors.protocol import AggregateReport, Events, Listen, Samples

    counts = trace_counts(program, period_ms, seed, seconds)
    cfg = mote or config(program, period_ms)
    decoder = FrameDecoder()
    out: list[Any] = []
    async with FirmwareMote(cfg, counts, period_ms, image=image, window_wall_ms=0) as fw:
        while chunk := await fw.read():
            out += decoder.feed(chunk)
        stats = await fw.wait()
    bad = [m for m in out if isinstance(m, FrameError)]
    if bad:
        raise MeasurementError(f"{program}: {len(bad)} frames did not decode: {bad[0]}")
    data = [m for m in out if isinstance(m, Samples | Events | AggregateReport)]
    model = make_program(program, PROGRAM_PARAMS[program])
    edges = sent = 0
    for k, value in enumerate(counts[: stats["conversions"]]):
        sent += len(model.feed(k * period_ms / 1000, value)) > 0
        edges += model.last.edges
    if len(data) != sent:
        raise MeasurementError(
            f"{program} at {period_ms} ms: the firmware sent {len(data)} data messages, "
            f"its Python model {sent}"
        )
    times = [t for m in data for t in _times(m)]
    whole = sum(float(t).is_integer() for t in times)
    return Run(
        program,
        period_ms,
        seed,
        stats["conversions"],
        edges,
        len(data),
        stats["windows"],
        sum(isinstance(m, Listen) for m in out),
        stats["tx_bytes"],
        len(times) - whole,
        whole,
        sum(_readings(m) for m in data),
        stats,
    )


def _readings(msg: Any) -> int:
    from sensors.protocol import AggregateReport, Events

    if isinstance(msg, AggregateReport):
        return len(msg.values)
    if isinstance(msg, Events):
        return 0
    return sum(len(row) for row in msg.rows)


def _times(msg: Any) -> list[float]:
    from sensors.protocol import AggregateReport, Events

    if isinstance(msg, AggregateReport):
        return [msg.start, msg.end]
    if isinstance(msg, Events):
        return [t for pair in msg.times for t in pair]
    return list(msg.times)


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


async def _measure(image: Image) -> tuple[dict[str, float], dict[str, Any]]:
    names = list(PROGRAM_PARAMS)
    runs = [
        await run_program(image, program, p, s)
        for program in names
        for s in SEEDS
        for p in PERIODS_MS
    ]
    coef = lstsq([r.features(names) for r in runs], [r.stats["awake_cycles"] for r in runs])
    shared = {k: round(v, 3) for k, v in zip(SHARED, coef, strict=False)}
    programs: dict[str, Any] = {}
    for i, program in enumerate(names):
        at = len(SHARED) + len(OWN) * i
        own = coef[at : at + len(OWN)]
        mine = [r for r in runs if r.program == program]
        errors = [
            sum(f * c for f, c in zip(r.features(names), coef, strict=True))
            / r.stats["awake_cycles"]
            - 1
            for r in mine
        ]
        programs[program] = {
            **{k: round(v, 3) for k, v in zip(OWN, own, strict=True)},
            "fit_worst_error": round(max(map(abs, errors)), 5),
            "runs": len(mine),
            "params": {**PROGRAM_PARAMS[program], **FIRMWARE_EXTRA.get(program, {})},
        }
    return shared, programs


def measure(build_dir: Path = DEFAULT_BUILD) -> dict[str, Any]:
    """Build the image, run every program and return the table (as written to cycles.json)."""
    from firmware_sim.measure_auth import measure_auth

    try:
        image = build_image(build_dir)
        shared, programs = asyncio.run(_measure(image))
        auth = measure_auth(image)
    except LoopError as exc:
        raise MeasurementError(str(exc)) from exc
    return {
        "mcu": "atmega128",
        "f_cpu_hz": F_CPU,
        "image": "avr/image.c (fjords-mote.elf): the protocol image",
        "runs": {
            "periods_ms": list(PERIODS_MS),
            "seeds": list(SEEDS),
            "seconds": SECONDS,
            "vehicles_per_second": VEHICLES_PER_SECOND,
            "listen_ms": LISTEN_MS,
            "listen_every_ms": LISTEN_EVERY_MS,
        },
        "toolchain": _versions(),
        "model": "awake cycles of a run = boot + window * receive windows + listen * bare listen "
        "frames + byte * bytes sent + float_time * float64 times + int_time * integer times "
        "(shared) + sample * conversions + edge * detector edges + message * data messages "
        "(per program); least squares over every run",
        "shared": shared,
        "programs": programs,
        "auth": auth,
    }


def _versions() -> dict[str, str]:
    def first_line(cmd: list[str]) -> str:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True).stdout
        except OSError:
            return "unknown"
        return out.splitlines()[0].strip() if out.strip() else "unknown"

    def dpkg(package: str) -> str:
        return first_line(["dpkg-query", "-W", "-f=${Version}\n", package])

    return {
        "avr-gcc": first_line(["avr-gcc", "--version"]),
        "avr-libc": dpkg("avr-libc"),
        "libsimavr-dev": dpkg("libsimavr-dev"),
        "gcc": first_line(["gcc", "--version"]),
    }


def compare(
    stored: CycleTable,
    fresh: CycleTable,
    tolerance: float = 0.02,
    keys: tuple[str, ...] = COEFFICIENTS,
) -> list[str]:
    """Coefficients (`keys`) that drifted by more than `tolerance` (relative) or 1 cycle."""
    drift = []
    for name, old in stored.programs.items():
        new = fresh.programs.get(name)
        if new is None:
            drift.append(f"{name}: no longer measured")
            continue
        for key in keys:
            a, b = getattr(old, key), getattr(new, key)
            if abs(a - b) > max(1.0, tolerance * abs(a)):
                drift.append(f"{name}.{key}: stored {a} measured {b}")
    drift += [
        f"{name}: measured but not stored" for name in set(fresh.programs) - set(stored.programs)
    ]
    return drift


def run_cli(
    argv: list[str] | None,
    *,
    prog: str,
    doc: str | None,
    measure_fn: Callable[[Path], dict[str, Any]],
    table_path: Path,
) -> int:
    """`--write` the measured table to `table_path`, else print it; exit 1 if it cannot be
    measured (shared by this module and measure_packed)."""
    parser = argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--write", action="store_true", help=f"write {table_path.name}")
    parser.add_argument("--build-dir", type=Path, default=DEFAULT_BUILD)
    args = parser.parse_args(argv)
    try:
        table = measure_fn(args.build_dir)
    except MeasurementError as exc:
        print(f"measure: {exc}", file=sys.stderr)
        return 1
    parse_cycle_table(table)  # the table must load
    text = json.dumps(table, indent=2) + "\n"
    if args.write:
        table_path.write_text(text)
        print(f"wrote {table_path}")
    else:
        sys.stdout.write(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(
        argv,
        prog="python -m firmware_sim.measure",
        doc=__doc__,
        measure_fn=measure,
        table_path=TABLE_PATH,
    )


if __name__ == "__main__":
    sys.exit(main())
