"""Instructions executed (valgrind's cachegrind) by this tree and, with `--before DIR`, by
another checkout, on the same work, interleaved.

On a shared machine CPU time varies by a third from run to run; the count of instructions does
not (the hash seed is fixed, so dictionaries grow alike), which makes it the figure to compare
two versions of the code by: a refactor that changes no algorithm should change it by little.

1. `python -m fjords` over the METR-LA CSV, start-up included: Query 1's shape, 1,000 narrow
   range filters and 100 windowed aggregates (the queries of `cli_path`).
2. Installing 1,000 queries into an engine (filters; windowed aggregates, each its own), the
   same process without them subtracted: instructions per query.

  python -m benchmarks.instructions [--before /path/to/checkout] [--quick] [--no-record]

Needs valgrind (Debian's package); skips with a message where it or the METR-LA data is absent.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.cli_path import (
    DATA,
    N_FILTERS,
    N_WINDOWED,
    Q1,
    SELECTIVITY,
    WINDOWED_SELECTIVITY,
    compile_code,
    filter_sql,
    head,
    narrow_ranges,
    windowed_sql,
)
from benchmarks.common import console, markdown, record, table

HERE = Path(__file__).resolve().parent
TREE = str(HERE.parent)

# Run by this file as a script, in the tree under test (PYTHONPATH): installs the first N of
# 1,000 queries of KIND ("f" filters, "w" windowed aggregates) into a fresh engine.
INSTALL = """
import random, sys
from fjords.schema import Schema
try:
    from fjords.compile.sql.parser import parse
    from fjords.engine import Engine
    from fjords.runtime.fjord import Fjord
    engine = Engine(Fjord())
    fjord = engine.fjord
except ImportError:  # a checkout from before the engine: the Fjord compiled its queries
    from fjords.fjord import Fjord
    from fjords.sql.parser import parse
    engine = fjord = Fjord()
n, kind = int(sys.argv[1]), sys.argv[2]
rng = random.Random(1)
def sql(lo):
    where = f"speed >= {lo:.3f} AND speed < {lo + 0.7:.3f}"
    if kind == "w":
        return f"SELECT segment, AVG(speed) FROM traffic [RANGE 15 MINUTES] WHERE {where} GROUP BY segment"
    return f"SELECT * FROM traffic WHERE {where}"
trees = [parse(sql(rng.uniform(0, 69))) for _ in range(1000)]
schema = Schema([("time", "int"), ("station", "str"), ("speed", "float"), ("segment", "str")], time="time")
fjord.add_stream("traffic", schema, sensor_field="station")
for t in trees[:n]:
    engine.add_query(t)
"""


def instructions(cmd: list[str], tree: str) -> int:
    """The instructions `cmd` executes in `tree` (cwd and PYTHONPATH), under cachegrind."""
    env = {**os.environ, "PYTHONPATH": tree, "PYTHONHASHSEED": "0"}
    grind = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]
    p = subprocess.run(
        [*grind, *cmd],
        cwd=tree,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=True,
    )
    m = re.search(r"I\s+refs:\s+([\d,]+)", p.stderr)
    if m is None:
        raise RuntimeError(f"no instruction count from cachegrind:\n{p.stderr[-2000:]}")
    return int(m.group(1).replace(",", ""))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.instructions",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--before", help="another checkout to count side by side")
    p.add_argument("--quick", action="store_true", help="50,000 readings")
    p.add_argument("--no-record", action="store_true", help="do not write benchmarks/RESULTS.md")
    args = p.parse_args(argv)
    if shutil.which("valgrind") is None:
        console.print("skipped: valgrind is not installed (Debian package valgrind)")
        return
    if not (DATA / "readings.csv").exists():
        console.print(f"skipped: no METR-LA data at {DATA}")
        return
    trees = [("after", TREE)] + (
        [("before", str(Path(args.before).resolve()))] if args.before else []
    )
    compile_code([t for _, t in trees])
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        readings = DATA / "readings.csv"
        if args.quick:
            readings = head(readings, tmp / "readings.csv", 50_000)
        stations = str(DATA / "stations.csv")
        script = tmp / "install.py"
        script.write_text(INSTALL)
        filters = narrow_ranges(readings, N_FILTERS, SELECTIVITY)
        windowed = narrow_ranges(readings, N_WINDOWED, WINDOWED_SELECTIVITY, seed=4)
        cli = [py, "-m", "fjords", "--trace", str(readings)]
        work: list[tuple[str, list[str], list[str] | None]] = [
            (
                "Query 1 shape, `python -m fjords`",
                [*cli, "--stations", stations, "--query", Q1],
                None,
            ),
            (
                f"{N_FILTERS:,} range filters, `python -m fjords`",
                [*cli, *(a for lo, hi in filters for a in ("--query", filter_sql(lo, hi)))],
                None,
            ),
            (
                f"{N_WINDOWED} windowed aggregates, `python -m fjords`",
                [
                    *cli,
                    "--stations",
                    stations,
                    *(a for lo, hi in windowed for a in ("--query", windowed_sql(lo, hi))),
                ],
                None,
            ),
            (
                "install a filter query (per query)",
                [py, str(script), "1000", "f"],
                [py, str(script), "0", "f"],
            ),
            (
                "install a windowed query (per query)",
                [py, str(script), "1000", "w"],
                [py, str(script), "0", "w"],
            ),
        ]
        rows: list[list[object]] = []
        notes: list[str] = []
        with console.status("counting instructions under cachegrind (minutes)"):
            for name, cmd, base in work:
                counts = {}
                for label, tree in trees:  # interleaved: each work on every tree in turn
                    n = instructions(cmd, tree)
                    if base is not None:
                        n = (n - instructions(base, tree)) // 1000
                    counts[label] = n
                row: list[object] = [name, f"{counts['after']:,}"]
                if args.before:
                    ratio = counts["after"] / counts["before"]
                    row += [f"{counts['before']:,}", f"{ratio:.4f}"]
                    notes.append(f"- {name}: after / before {ratio:.3f}x the instructions")
                rows.append(row)
    cols = ["work", "instructions after"] + (
        ["instructions before", "after / before"] if args.before else []
    )
    console.print(table("instructions executed (cachegrind, PYTHONHASHSEED=0)", cols, rows))
    for line in notes:
        console.print(line)
    if not args.no_record:
        before = f" Before: `{args.before}`." if args.before else ""
        body = (
            "`python -m benchmarks.instructions"
            + (" --quick" if args.quick else "")
            + (f" --before {args.before}" if args.before else "")
            + "`: valgrind's cachegrind counts the instructions each process executes, start-up "
            "included (one run each: the count repeats; the hash seed is fixed). Installs: the "
            f"process with 1,000 queries less the same without, per query. After: this tree.{before}"
            "\n\n" + markdown(cols, rows) + ("\n\n" + "\n".join(notes) if notes else "")
        )
        record("instructions", body)


if __name__ == "__main__":
    main()
