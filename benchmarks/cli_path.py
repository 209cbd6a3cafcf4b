"""`python -m fjords` over the METR-LA CSV, start-up included, against plain Python loops.

1. Query 1 shape (tumbling 15-minute AVG(speed) per segment, the stations file joined for the
   segment) against a plain `csv.reader` loop computing the same rows from the same files.
   Goal: within 3x of the plain loop.
2. 1,000 narrow range filters on speed (~0.1% of the readings each), every matching row printed
   as NDJSON, against a plain loop testing every filter on every reading and printing the rows.
   Goal: at least 20x faster than the plain loop.
3. 100 windowed aggregates (tumbling 15-minute AVG(speed) per segment, each query with its own
   speed range passing ~5% of the readings) against a plain `csv.reader` loop testing every
   filter on every reading and updating one dict per window, printing the same NDJSON rows.
   Goal: faster than the plain loop. `--only windowed` runs this part alone (recorded as its
   own section, "cli_path (windowed)").

Every engine runs as its own process (`python -m fjords ...`, `python -m benchmarks.cli_path
--plain ...`), its output written to a file and parsed: the same rows are checked equal. Best of
`--repeat` runs. With `--before DIR` (a checkout of older code, e.g. the lead's main) the same
`python -m fjords` commands also run on that code, side by side.

  python -m benchmarks.cli_path [--quick] [--no-record] [--before /work/main] [--only windowed]

Skips with a message where the METR-LA data is absent (../shared/data/metr-la/).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from benchmarks.common import HERE, console, markdown, record, table

DATA = HERE.parent.parent / "shared" / "data" / "metr-la"
Q1 = "SELECT segment, AVG(speed) AS avg_speed FROM traffic [RANGE 15 MINUTES] GROUP BY segment"
WINDOW = 15 * 60
N_FILTERS = 1000
SELECTIVITY = 0.001
N_WINDOWED = 100
WINDOWED_SELECTIVITY = 0.05


# -- the plain loops (run in their own process by `--plain`) ---------------------------------------


def plain_q1(readings: str, stations: str, out: str) -> None:
    """Query 1 by hand: csv.reader, a dict station -> segment, one dict of sums per window."""
    segment = _segments(stations)
    with open(readings, newline="") as f, open(out, "w") as o:
        rd = csv.reader(f)
        header = next(rd)
        ti, si, vi = header.index("time"), header.index("station"), header.index("speed")
        current, acc = None, {}
        for r in rd:
            t = int(r[ti])
            w = t - t % WINDOW
            if w != current:
                _flush_q1(current, acc, o)
                current, acc = w, {}
            g = segment.get(r[si])
            a = acc.get(g)
            if a is None:
                acc[g] = [float(r[vi]), 1]
            else:
                a[0] += float(r[vi])
                a[1] += 1
        _flush_q1(current, acc, o)


def _segments(stations: str) -> dict[str, str]:
    with open(stations, newline="") as f:
        rd = csv.reader(f)
        header = next(rd)
        si, gi = header.index("station"), header.index("segment")
        return {r[si]: r[gi] for r in rd}


def _flush_q1(w: int | None, acc: dict, o) -> None:
    _flush_windowed(w, {(0, g): a for g, a in acc.items()}, o)


def plain_filters(readings: str, bounds_file: str, out: str) -> None:
    """Every filter tested on every reading; each match printed as one JSON line."""
    bounds = [tuple(b) for b in json.loads(Path(bounds_file).read_text())]
    with open(readings, newline="") as f, open(out, "w") as o:
        rd = csv.reader(f)
        next(rd)
        for r in rd:
            t, station, speed = int(r[0]), r[1], float(r[2])
            for i, (lo, hi) in enumerate(bounds):
                if lo <= speed < hi:
                    o.write(
                        json.dumps({"query": i, "time": t, "station": station, "speed": speed})
                        + "\n"
                    )


def plain_windowed(readings: str, stations: str, bounds_file: str, out: str) -> None:
    """The 100 windowed aggregates by hand: csv.reader, a dict station -> segment, every filter
    tested on every reading, one dict of sums per window keyed by (query, segment); each
    window's rows printed as JSON lines when the next window starts."""
    bounds = [tuple(b) for b in json.loads(Path(bounds_file).read_text())]
    preds = list(enumerate(bounds))
    segment = _segments(stations)
    with open(readings, newline="") as f, open(out, "w") as o:
        rd = csv.reader(f)
        header = next(rd)
        ti, si, vi = header.index("time"), header.index("station"), header.index("speed")
        current, acc = None, {}
        for r in rd:
            t = int(r[ti])
            w = t - t % WINDOW
            if w != current:
                _flush_windowed(current, acc, o)
                current, acc = w, {}
            speed = float(r[vi])
            g = None
            for i, (lo, hi) in preds:
                if lo <= speed < hi:
                    if g is None:
                        g = segment.get(r[si])
                    a = acc.get((i, g))
                    if a is None:
                        acc[(i, g)] = [speed, 1]
                    else:
                        a[0] += speed
                        a[1] += 1
        _flush_windowed(current, acc, o)


def _flush_windowed(w: int | None, acc: dict, o) -> None:
    if w is None:
        return
    for (i, g), (s, n) in acc.items():
        o.write(
            json.dumps(
                {
                    "query": i,
                    "segment": g,
                    "avg_speed": s / n,
                    "window_start": float(w),
                    "window_end": float(w + WINDOW),
                }
            )
            + "\n"
        )


# -- the measured runs ----------------------------------------------------------------------------


def narrow_ranges(readings: Path, n: int, selectivity: float, seed: int = 3) -> list[list[float]]:
    """n speed ranges [lo, hi) passing about `selectivity` of the readings each: from a random
    distinct value, widened to the next distinct values until that share is reached (values
    repeated more often than twice the share, such as 0 for a missing reading, are skipped)."""
    with readings.open(newline="") as f:
        rd = csv.reader(f)
        next(rd)
        speeds = sorted(float(r[2]) for r in rd)
    target = selectivity * len(speeds)
    distinct = sorted(set(speeds))
    count = Counter(speeds)
    starts = [v for v in distinct[:-1] if count[v] <= 2 * target]
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        i = distinct.index(rng.choice(starts))
        got, j = 0, i
        while j < len(distinct) - 1 and got + count[distinct[j]] <= 2 * target and got < target:
            got += count[distinct[j]]
            j += 1
        out.append([distinct[i], distinct[max(j, i + 1)]])
    return out


def filter_sql(lo: float, hi: float) -> str:
    return f"SELECT * FROM traffic WHERE speed >= {lo!r} AND speed < {hi!r}"


def windowed_sql(lo: float, hi: float) -> str:
    return (
        "SELECT segment, AVG(speed) FROM traffic [RANGE 15 MINUTES] "
        f"WHERE speed >= {lo!r} AND speed < {hi!r} GROUP BY segment"
    )


def compile_code(trees: list[str]) -> None:
    """Bytecode for every engine's code first, as an installed package has it: where
    PYTHONDONTWRITEBYTECODE is set (as on CI machines), each run would compile its modules
    from source again (~70 ms of `python -m fjords`), a cost no deployed copy pays."""
    import compileall

    for tree in trees:
        for pkg in ("fjords", "benchmarks"):
            if (Path(tree) / pkg).is_dir():
                compileall.compile_dir(str(Path(tree) / pkg), quiet=2)


def timed(cmd: list[str], out: Path, pythonpath: str, repeat: int) -> tuple[float, float]:
    """Best wall time and best CPU time (user + system, of the child process) of `repeat` runs
    of `cmd` (stdout to `out`), start-up included. On a shared machine the CPU time is the
    figure to compare: the wall time counts the time other processes had the cores."""
    env = {**os.environ, "PYTHONPATH": pythonpath}
    best, best_cpu = math.inf, math.inf
    for _ in range(repeat):
        with out.open("w") as o:
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            # cwd: `python -m` puts it first on sys.path, before PYTHONPATH
            subprocess.run(cmd, stdout=o, env=env, check=True, cwd=pythonpath)
            best = min(best, time.perf_counter() - t0)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
            best_cpu = min(best_cpu, cpu)
    return best, best_cpu


def rows_q1(path: Path) -> Counter:
    return Counter(
        (r["segment"], r["window_start"], r["window_end"], round(r["avg_speed"], 9))
        for r in map(json.loads, path.open())
    )


def rows_filters(path: Path) -> Counter:
    return Counter(
        (r["query"], r["time"], r["station"], r["speed"]) for r in map(json.loads, path.open())
    )


def rows_windowed(path: Path) -> Counter:
    """(query, segment, window, average to 1e-9): the plain loop and the Fjord sum each
    group's speeds in the same order, but the check allows for another order's rounding."""
    return Counter(
        (r["query"], r["segment"], r["window_start"], r["window_end"], round(r["avg_speed"], 9))
        for r in map(json.loads, path.open())
    )


def experiment_windowed(
    readings: Path,
    stations: Path,
    codes: list[tuple[str, str]],
    repeat: int,
    tmp: Path,
    n_readings: int,
) -> tuple[list[object], list[str]]:
    """Part 3: the table row (as main's) and the goal lines of the 100 windowed aggregates."""
    py, here = sys.executable, str(HERE.parent)
    bounds = narrow_ranges(readings, N_WINDOWED, WINDOWED_SELECTIVITY, seed=4)
    (tmp / "wbounds.json").write_text(json.dumps(bounds))
    fjords_w = [py, "-m", "fjords", "--trace", str(readings), "--stations", str(stations)]
    for lo, hi in bounds:
        fjords_w += ["--query", windowed_sql(lo, hi)]
    plain = [py, "-m", "benchmarks.cli_path", "--plain", "windowed", str(readings)]
    plain += [str(stations), str(tmp / "wbounds.json"), str(tmp / "w.plain")]
    seconds = {}
    with console.status(f"{N_WINDOWED} windowed aggregates: python -m fjords and the plain loop"):
        seconds["plain"] = timed(plain, tmp / "ignored", here, repeat)
        expect = rows_windowed(tmp / "w.plain")
        for label, code in codes:
            seconds[label] = timed(fjords_w, tmp / f"w.{label}", code, repeat)
            assert rows_windowed(tmp / f"w.{label}") == expect, f"windowed rows differ ({label})"
    plain_s, plain_cpu = seconds["plain"]
    row: list[object] = [
        f"{N_WINDOWED} windowed aggregates (~5% each, 15-min AVG per segment)",
        n_readings,
        sum(expect.values()),
        plain_s,
        plain_cpu,
    ]
    for label, _ in codes:
        s, cpu = seconds[label]
        row += [s, cpu, n_readings / cpu, cpu / plain_cpu]
    ratio = plain_cpu / seconds["after"][1]
    goals = [
        f"- {N_WINDOWED} windowed aggregates: `python -m fjords` {ratio:.2f}x the plain "
        f"csv.reader loop's speed (CPU time; goal: > 1): {'met' if ratio > 1 else 'NOT met'}"
    ]
    if len(codes) > 1:
        goals.append(
            f"- windowed aggregates: after / before {seconds['after'][1] / seconds['before'][1]:.2f}x"
            " of the CPU time"
        )
    return row, goals


def head(src: Path, dst: Path, n: int) -> Path:
    with src.open() as f, dst.open("w") as o:
        for _, line in zip(range(n + 1), f, strict=False):
            o.write(line)
    return dst


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="50,000 readings, one run each")
    p.add_argument("--no-record", action="store_true", help="do not write benchmarks/RESULTS.md")
    p.add_argument("--repeat", type=int, default=None, help="runs per engine, best kept (3)")
    p.add_argument("--before", help="a checkout of older code to run side by side (e.g. main)")
    p.add_argument("--plain", nargs="+", help=argparse.SUPPRESS)  # the plain loops' processes
    p.add_argument(
        "--only",
        choices=["windowed"],
        help="run one part alone: windowed (the 100 windowed aggregates), recorded apart",
    )
    args = p.parse_args(argv)
    if args.plain:
        kind, *rest = args.plain
        {"q1": plain_q1, "filters": plain_filters, "windowed": plain_windowed}[kind](*rest)
        return
    if not (DATA / "readings.csv").is_file():
        console.print(f"skipped: the METR-LA data is not in {DATA}")
        return
    repeat = args.repeat or (1 if args.quick else 3)
    py = sys.executable
    here = str(HERE.parent)
    codes = [("after", here)] + ([("before", args.before)] if args.before else [])
    compile_code([here, *(code for _, code in codes)])
    if args.only == "windowed":
        windowed_only(args, codes, repeat)
        return
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        readings = DATA / "readings.csv"
        if args.quick:
            readings = head(readings, tmp / "readings.csv", 50_000)
        stations = DATA / "stations.csv"
        n_readings = sum(1 for _ in readings.open()) - 1
        bounds = narrow_ranges(readings, N_FILTERS, SELECTIVITY)
        (tmp / "bounds.json").write_text(json.dumps(bounds))
        fjords_q1 = [py, "-m", "fjords", "--trace", str(readings), "--stations", str(stations)]
        fjords_q1 += ["--query", Q1]
        fjords_f = [py, "-m", "fjords", "--trace", str(readings)]
        for lo, hi in bounds:
            fjords_f += ["--query", filter_sql(lo, hi)]
        plain = [py, "-m", "benchmarks.cli_path", "--plain"]
        rows, goals, seconds = [], [], {}
        with console.status("Query 1 shape: python -m fjords and the plain csv.reader loop"):
            seconds["q1 plain"] = timed(
                plain + ["q1", str(readings), str(stations), str(tmp / "q1.plain")],
                tmp / "ignored",
                here,
                repeat,
            )
            expect = rows_q1(tmp / "q1.plain")
            for label, code in codes:
                seconds[f"q1 {label}"] = timed(fjords_q1, tmp / f"q1.{label}", code, repeat)
                assert rows_q1(tmp / f"q1.{label}") == expect, f"Query 1 rows differ ({label})"
        with console.status(f"{N_FILTERS:,} range filters: python -m fjords and the plain loop"):
            seconds["f plain"] = timed(
                plain + ["filters", str(readings), str(tmp / "bounds.json"), str(tmp / "f.plain")],
                tmp / "ignored",
                here,
                repeat,
            )
            expect_f = rows_filters(tmp / "f.plain")
            for label, code in codes:
                seconds[f"f {label}"] = timed(fjords_f, tmp / f"f.{label}", code, repeat)
                assert rows_filters(tmp / f"f.{label}") == expect_f, f"filter rows differ ({label})"
        matched = sum(expect_f.values())
        for work, key, n_out in (
            ("Query 1 shape (15-min AVG per segment)", "q1", sum(expect.values())),
            (f"{N_FILTERS:,} range filters (~0.1% each), NDJSON", "f", matched),
        ):
            plain_s, plain_cpu = seconds[f"{key} plain"]
            row: list[object] = [work, n_readings, n_out, plain_s, plain_cpu]
            for label, _ in codes:
                s, cpu = seconds[f"{key} {label}"]
                row += [s, cpu, n_readings / cpu, cpu / plain_cpu]
            rows.append(row)
        q1_ratio = seconds["q1 after"][1] / seconds["q1 plain"][1]
        f_ratio = seconds["f plain"][1] / seconds["f after"][1]
        goals.append(
            f"- Query 1 shape: `python -m fjords` {q1_ratio:.2f}x the plain csv.reader loop's CPU time "
            f"(goal: within 3x): {'met' if q1_ratio <= 3 else 'NOT met'}"
        )
        goals.append(
            f"- {N_FILTERS:,} range filters (each passing {matched / n_readings / N_FILTERS:.3%} of "
            f"the readings on average): `python -m fjords` {f_ratio:.1f}x faster than the plain "
            f"loop (goal: at least 20x): {'met' if f_ratio >= 20 else 'NOT met'}"
        )
        row_w, goals_w = experiment_windowed(readings, stations, codes, repeat, tmp, n_readings)
        rows.append(row_w)
        goals += goals_w
        if args.before:
            for key, name in (("q1", "Query 1 shape"), ("f", "range filters")):
                goals.append(
                    f"- {name}: after / before {seconds[f'{key} after'][1] / seconds[f'{key} before'][1]:.2f}x"
                    " of the CPU time"
                )
    cols = _columns(codes)
    console.print(table("python -m fjords over the METR-LA CSV, start-up included", cols, rows))
    for g in goals:
        console.print(g)
    if not args.no_record:
        before = f" Before: `{args.before}` (its `python -m fjords`)." if args.before else ""
        body = (
            "`python -m benchmarks.cli_path"
            + (" --quick" if args.quick else "")
            + (f" --before {args.before}" if args.before else "")
            + "`: every engine is its own process, start-up included, output to a file, the same "
            f"rows checked equal; best of {repeat}. Ratios are of CPU time (user + system of each "
            f"process): the wall times also count other processes on a shared machine. After: "
            f"this tree.{before}\n\n" + markdown(cols, rows) + "\n\n" + "\n".join(goals)
        )
        record("cli_path", body)


def _columns(codes: list[tuple[str, str]]) -> list[str]:
    cols = ["work", "readings", "rows out", "plain loop s", "plain loop CPU s"]
    for label, _ in codes:
        cols += [
            f"fjords {label} s",
            f"fjords {label} CPU s",
            f"{label} readings/CPU s",
            f"{label} / plain (CPU)",
        ]
    return cols


def windowed_only(args: argparse.Namespace, codes: list[tuple[str, str]], repeat: int) -> None:
    """`--only windowed`: part 3 alone, recorded as the section "cli_path (windowed)"."""
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        readings = DATA / "readings.csv"
        if args.quick:
            readings = head(readings, tmp / "readings.csv", 50_000)
        n_readings = sum(1 for _ in readings.open()) - 1
        row, goals = experiment_windowed(
            readings, DATA / "stations.csv", codes, repeat, tmp, n_readings
        )
    cols = _columns(codes)
    console.print(table("python -m fjords over the METR-LA CSV, start-up included", cols, [row]))
    for g in goals:
        console.print(g)
    if not args.no_record:
        before = f" Before: `{args.before}` (its `python -m fjords`)." if args.before else ""
        body = (
            "`python -m benchmarks.cli_path --only windowed"
            + (" --quick" if args.quick else "")
            + (f" --before {args.before}" if args.before else "")
            + "`: every engine is its own process, start-up included, output to a file, the same "
            f"rows checked equal; best of {repeat}. Ratios are of CPU time (user + system of each "
            f"process). After: this tree.{before}\n\n"
            + markdown(cols, [row])
            + "\n\n"
            + "\n".join(goals)
        )
        record("cli_path (windowed)", body)


if __name__ == "__main__":
    main()
