"""The paper's packed-format programs (avr/mote.c + one file per program): build them one by
one, run them in simavr (avr/harness.c) and fit their cycles table, cycles-packed.json, which
the cost model uses for wire="packed" (the paper's format; the protocol image's table is
cycles.json, firmware_sim.measure).

    python -m firmware_sim.measure_packed [--write] [--build-dir DIR]

Each program runs on the same synthetic loop-pair trace as its Python model; the
run fails if the firmware's transmitted bytes differ from the model's messages, so
the table can only describe code that behaves like the model. Needs avr-gcc,
avr-libc, simavr and libsimavr-dev (scripts/install-system-deps).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from firmware_sim import measure as measure_protocol
from firmware_sim.cycles import CycleTable, ProgramCycles
from firmware_sim.loop import toolchain_missing
from firmware_sim.measure import MeasurementError, _versions
from firmware_sim.programs import make_program
from firmware_sim.traces import vehicle_pair_trace

PACKAGE = Path(__file__).resolve().parent
AVR_DIR = PACKAGE / "avr"
DEFAULT_BUILD = AVR_DIR / "build"
TABLE_PATH = PACKAGE / "cycles-packed.json"
F_CPU = 1_000_000
SAMPLE_HZ = 180
TRACE = {"seconds": 60.0, "vehicles_per_second": 2.0, "seed": 7}


@dataclass(frozen=True)
class Build:
    """One firmware image: the Python model it must match and its compile flags."""

    elf: str
    program: str
    params: dict[str, Any]
    role: str
    cflags: str


# The measured configuration; the C defaults (avr/*.c) equal these parameters.
BUILDS = [
    Build("raw", "raw", {}, "upstream", ""),
    Build(
        "vehicle",
        "vehicle",
        {"role": "upstream", "threshold": 400, "hysteresis": 50},
        "upstream",
        "-DTHRESHOLD=400 -DHYSTERESIS=50",
    ),
    Build(
        "vehicle_down",
        "vehicle",
        {"role": "downstream", "threshold": 400, "hysteresis": 50},
        "downstream",
        "-DTHRESHOLD=400 -DHYSTERESIS=50",
    ),
    Build(
        "count",
        "count",
        {"period_ms": 1000, "threshold": 400, "hysteresis": 50},
        "upstream",
        f"-DPERIOD_SAMPLES={SAMPLE_HZ} -DTHRESHOLD=400 -DHYSTERESIS=50",
    ),
    Build(
        "filter",
        "filter",
        {"ranges": [[None, 299], [820, None]]},
        "upstream",
        "-DRANGES='{{0,299},{820,0xffff}}'",
    ),
    Build(
        "aggregate",
        "aggregate",
        {"window_ms": 100},
        "upstream",
        f"-DWINDOW_SAMPLES={SAMPLE_HZ // 10}",
    ),
    Build("deadband", "deadband", {"epsilon": 20}, "upstream", "-DEPSILON=20"),
]


def build(build_dir: Path = DEFAULT_BUILD) -> None:
    build_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "make",
        "-s",
        "-C",
        str(AVR_DIR),
        f"BUILD={build_dir.resolve()}",
        f"F_CPU={F_CPU}",
        f"SAMPLE_HZ={SAMPLE_HZ}",
    ]
    args += [f"CFLAGS_{b.elf}={b.cflags}" for b in BUILDS if b.cflags and b.elf != "vehicle_down"]
    result = subprocess.run(args, capture_output=True, text=True)
    if result.returncode != 0:
        raise MeasurementError(f"AVR build failed:\n{result.stdout}{result.stderr}")


def run_harness(build_dir: Path, elf: str, counts: list[int]) -> tuple[list[int], dict[int, bytes]]:
    """Awake cycles per sample period and the bytes sent in each period."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(map(str, counts)))
        trace_path = f.name
    try:
        result = subprocess.run(
            [str(build_dir / "harness"), str(build_dir / f"{elf}.elf"), trace_path, str(F_CPU)],
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        os.unlink(trace_path)
    if result.returncode != 0:
        raise MeasurementError(f"harness failed on {elf}: {result.stderr.strip()}")
    cycles: list[int] = []
    sent: dict[int, bytearray] = defaultdict(bytearray)
    for line in result.stdout.splitlines():
        parts = line.split()
        if parts and parts[0] == "p":
            cycles.append(int(parts[2]))
        elif parts and parts[0] == "u":
            sent[int(parts[1])].append(int(parts[2]))
    if len(cycles) != len(counts):
        raise MeasurementError(f"{elf}: {len(cycles)} periods for {len(counts)} readings")
    return cycles, {k: bytes(v) for k, v in sent.items()}


def fit(cycles: list[int], edges: list[int], messages: list[int]) -> tuple[float, float, float]:
    """Class means: quiet periods, edge-only periods, periods that sent a message."""
    quiet = [c for c, e, m in zip(cycles, edges, messages, strict=True) if not e and not m]
    if not quiet:
        raise MeasurementError("no quiet sample period to measure the base cost on")
    base = statistics.fmean(quiet)
    edge_rows = [(c, e) for c, e, m in zip(cycles, edges, messages, strict=True) if e and not m]
    edge = statistics.fmean((c - base) / e for c, e in edge_rows) if edge_rows else 0.0
    msg_rows = [(c, e, m) for c, e, m in zip(cycles, edges, messages, strict=True) if m]
    message = (
        statistics.fmean((c - base - edge * e) / m for c, e, m in msg_rows) if msg_rows else 0.0
    )
    return base, edge, message


def measure(build_dir: Path = DEFAULT_BUILD) -> dict[str, Any]:
    """Build, run every program and return the table (as written to cycles.json)."""
    missing = toolchain_missing()
    if missing:
        raise MeasurementError(f"missing {', '.join(missing)} (run scripts/install-system-deps)")
    build(build_dir)
    trace = vehicle_pair_trace(
        TRACE["seconds"],
        rate_hz=SAMPLE_HZ,
        vehicles_per_second=TRACE["vehicles_per_second"],
        seed=TRACE["seed"],
    )
    # Model cycles are irrelevant here (only behaviour is compared): use a zero table.
    zero = CycleTable("none", F_CPU, {b.program: ProgramCycles(0, 0, 0) for b in BUILDS}, {})
    programs: dict[str, Any] = {}
    for b in BUILDS:
        counts = trace.adc_counts(b.role)
        cycles, sent = run_harness(build_dir, b.elf, counts)
        model = make_program(b.program, b.params, cycles=zero)  # packed messages
        edges, messages, sizes = [], [], set()
        for k, value in enumerate(counts):
            model.feed(k / SAMPLE_HZ, value)
            wire = b"".join(model.last_messages)
            if wire != sent.get(k, b""):
                raise MeasurementError(
                    f"{b.elf}: sample {k}: firmware sent {sent.get(k, b'').hex()} "
                    f"but the model sent {wire.hex()}"
                )
            edges.append(model.last.edges)
            messages.append(model.last.messages)
            sizes.update(len(m) for m in model.last_messages)
        if b.elf == "vehicle_down":
            continue  # same code as `vehicle`: checked for behaviour only
        base, edge, message = fit(cycles, edges, messages)
        programs[b.program] = {
            "sample": round(base, 2),
            "edge": round(edge, 2),
            "message": round(message, 2),
            "message_bytes": max(sizes) if sizes else 0,
            "mean_cycles_per_sample": round(statistics.fmean(cycles), 2),
            "samples": len(cycles),
            "messages": sum(messages),
            "params": b.params,
        }
    return {
        "mcu": "atmega128",
        "f_cpu_hz": F_CPU,
        "sample_hz": SAMPLE_HZ,
        "trace": TRACE,
        "toolchain": _versions(),
        "wire": "packed",
        "model": "awake cycles per sample period = sample + edge * detector edges "
        "+ message * messages sent (class means over the trace)",
        "programs": programs,
    }


def compare(stored: CycleTable, fresh: CycleTable, tolerance: float = 0.02) -> list[str]:
    """Coefficients that drifted by more than `tolerance` (relative) or 1 cycle."""
    return measure_protocol.compare(stored, fresh, tolerance, keys=("sample", "edge", "message"))


def main(argv: list[str] | None = None) -> int:
    return measure_protocol.run_cli(
        argv,
        prog="python -m firmware_sim.measure_packed",
        doc=__doc__,
        measure_fn=measure,
        table_path=TABLE_PATH,
    )


if __name__ == "__main__":
    sys.exit(main())
