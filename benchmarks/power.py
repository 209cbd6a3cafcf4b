"""Mote power (paper section 5.2, Figure 11): ours vs the paper, profiles side by side,
and how fast the Python program models run (the simulated motes in sensors/ use them).

    python -m benchmarks.power
"""

from __future__ import annotations

import argparse
import time

from firmware_sim.cli import PAPER, _plot, paper_rows
from firmware_sim.cycles import load_cycle_table
from firmware_sim.model import predict
from firmware_sim.programs import make_program
from firmware_sim.traces import vehicle_pair_trace

from benchmarks.common import OUT, console, drawn, markdown, record, table, under_load

PROGRAMS = ("raw", "vehicle", "count")
PARAMS = {
    "aggregate": {"window_ms": 100},
    "filter": {"ranges": [[None, 299]]},
    "deadband": {"epsilon": 20},
}


def _whole(x: float) -> float | int:
    """A byte count as an integer when it is one (the table stores floats: some are means)."""
    return int(x) if float(x).is_integer() else x


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__).parse_args(argv)  # --help
    load = under_load()  # before this process adds its own
    sections = []
    rows = [
        [
            r["program"],
            r["power_mw"],
            r["paper_power_mw"],
            r["power_mw"] / r["paper_power_mw"],
            r["lifetime_days"],
            PAPER[r["program"]][1],
            r["breakdown_mw"]["radio"],
            r["breakdown_mw"]["cpu"],
        ]
        for r in paper_rows()
    ]
    cols = [
        "program",
        "ours mW",
        "paper mW",
        "ours/paper",
        "lifetime d",
        "paper lifetime",
        "radio mW",
        "cpu mW",
    ]
    console.print(table("Paper profile at 180 Hz, 5 vehicles/s", cols, rows))
    sections.append(
        "### Section 5.2 at 180 Hz (paper profile, 5 vehicles/s)\n\n" + markdown(cols, rows)
    )

    cycles = load_cycle_table("packed")  # the paper's packed-format programs
    rows = [
        [name, c.sample, c.edge, c.message, _whole(c.message_bytes)]
        for name, c in cycles.programs.items()
    ]
    cols = ["program", "cycles/sample", "cycles/edge", "cycles/message", "message bytes"]
    console.print(table("Awake ATmega128 cycles measured in simavr", cols, rows))
    sections.append(
        "### Cycles measured in simavr (ATmega128, avr-gcc -Os)\n\n" + markdown(cols, rows)
    )

    rows = []
    for rate in (10, 60, 180, 400, 1000):
        preds = {p: predict(p, rate) for p in PROGRAMS}
        rows.append(
            [
                rate,
                *(preds[p].power_mw for p in PROGRAMS),
                preds["raw"].power_mw / preds["vehicle"].power_mw,
                preds["vehicle"].power_mw / preds["count"].power_mw,
                (preds["count"].breakdown_mw["cpu"] + preds["count"].breakdown_mw["adc"])
                / preds["count"].power_mw,
            ]
        )
    cols = [
        "rate Hz",
        "raw mW",
        "vehicle mW",
        "count mW",
        "raw/vehicle",
        "vehicle/count",
        "count cpu+adc share",
    ]
    console.print(table("Figure 11: power against sample rate", cols, rows))
    sections.append(
        "### Figure 11: power against sample rate (paper profile)\n\n" + markdown(cols, rows)
    )

    rows = []
    for profile in ("paper", "mica2", "telosb"):
        preds = [predict(p, 180, profile) for p in PROGRAMS]
        rows.append([profile, *(p.power_mw for p in preds), *(p.lifetime_days for p in preds)])
    cols = ["profile", "raw mW", "vehicle mW", "count mW", "raw days", "vehicle days", "count days"]
    console.print(
        table("Profiles at 180 Hz (mica2/telosb include a 20 ms/s listen window)", cols, rows)
    )
    sections.append(
        "### Profiles at 180 Hz (MICA2 and TelosB listen 20 ms/s)\n\n" + markdown(cols, rows)
    )

    trace = vehicle_pair_trace(120.0, rate_hz=180, vehicles_per_second=2.0, seed=1)
    samples = list(trace.samples())
    rows = []
    for name in ("raw", "vehicle", "count", "filter", "aggregate", "deadband"):
        program = make_program(name, PARAMS.get(name))
        start = time.perf_counter()
        for t, v in samples:
            program.feed(t, v)
        elapsed = time.perf_counter() - start
        rows.append(
            [
                name,
                len(samples) / elapsed,
                elapsed / len(samples) * 1e9,
                len(samples) / elapsed / 180,
            ]
        )
    cols = ["program", "samples/s", "ns/sample", "motes at 180 Hz per core"]
    console.print(table("Python program models: feed() throughput", cols, rows))
    sections.append(
        f"### Python program models: feed() throughput ({len(samples):,} samples)\n\n"
        + markdown(cols, rows)
    )

    png = OUT / "power_fig11.png"
    _plot({p: [predict(p, r) for r in range(10, 401, 5)] for p in PROGRAMS}, "paper", png)
    console.print(f"wrote {png}")
    record(
        "power",
        "`python -m benchmarks.power` (also `fjords-power paper`). "
        + drawn("Plot", "power_fig11.png")
        + "\n\n"
        + "\n\n".join(sections),
        note=load and f"feed() throughput {load}",
    )


if __name__ == "__main__":
    main()
