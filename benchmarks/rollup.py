"""ROLLUP over station < segment < all versus the station-level GROUP BY alone (issue 30's
goal: at most 1.3x), and versus one GROUP BY per level, on the METR-LA trace.

  python -m benchmarks.rollup [--rounds N] [--hours H] [--no-record]

The ROLLUP runs one aggregate at the finest level (segment, station) and merges each hour's
segment and total rows from its finished groups at the window's close; one GROUP BY per level
aggregates every reading three times. The contenders run interleaved, round by round, in one
process (these machines are shared and noisy: ratios within one run, medians of the rounds, after a
warm-up round).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import pandas as pd

from benchmarks.common import HERE, console, markdown, record, table, under_load
from fjords.engine import Engine
from fjords.runtime.fjord import Fjord
from fjords.schema import Schema

SCHEMA = Schema(
    [("time", "int"), ("station", "str"), ("speed", "float"), ("segment", "str")], time="time"
)
WINDOW = "FROM traffic [RANGE 1 HOUR]"
CONTENDERS = {
    "GROUP BY segment, station (station level alone)": [
        f"SELECT segment, station, AVG(speed) AS avg_speed {WINDOW} GROUP BY segment, station"
    ],
    "GROUP BY ROLLUP(segment, station) (3 levels)": [
        f"SELECT segment, station, AVG(speed) AS avg_speed {WINDOW} "
        "GROUP BY ROLLUP(segment, station)"
    ],
    "one GROUP BY per level (3 queries)": [
        f"SELECT segment, station, AVG(speed) AS avg_speed {WINDOW} GROUP BY segment, station",
        f"SELECT segment, AVG(speed) AS avg_speed {WINDOW} GROUP BY segment",
        f"SELECT AVG(speed) AS avg_speed {WINDOW}",
    ],
}
BASE = next(iter(CONTENDERS))
CHUNK = 4096
DATA = HERE.parent.parent / "shared" / "data" / "metr-la"


def trace(hours: float | None) -> list[tuple]:
    df = pd.read_csv(DATA / "readings.csv", dtype={"station": str}).merge(
        pd.read_csv(DATA / "stations.csv", dtype={"station": str})[["station", "segment"]],
        on="station",
    )
    df = df.sort_values("time", kind="stable")
    if hours is not None:
        df = df[df.time < df.time.min() + hours * 3600]
    return list(df[["time", "station", "speed", "segment"]].itertuples(index=False, name=None))


def run(queries: list[str], rows: list[tuple]) -> tuple[float, int]:
    """Seconds to push the trace through one Fjord with `queries`, and the rows they gave."""
    f = Engine(Fjord())
    f.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    count = [0]

    def counted(out: list[tuple]) -> None:
        count[0] += len(out)

    for i, sql in enumerate(queries):
        f.add_query(sql, query_id=f"q{i}").sink.add_batch_callback(counted)
    push, go = f.fjord.push, f.fjord.run_until_idle
    gc.collect()
    t0 = time.perf_counter()
    for i, r in enumerate(rows):
        push("traffic", r)
        if i % CHUNK == CHUNK - 1:
            go()
    f.fjord.end_of_stream()
    go()
    return time.perf_counter() - t0, count[0]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.rollup", description=__doc__)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--hours", type=float, default=None, help="only the trace's first hours")
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args(argv)
    if not (DATA / "readings.csv").is_file():
        console.print(f"skipped: the METR-LA data is not in {DATA}")
        return
    note = under_load()
    rows = trace(args.hours)
    times: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    results: dict[str, int] = {}
    for queries in CONTENDERS.values():  # a warm-up round, not counted (imports, caches)
        run(queries, rows[: CHUNK * 4])
    for _ in range(args.rounds):
        for name, queries in CONTENDERS.items():
            seconds, n = run(queries, rows)
            times[name].append(seconds)
            results[name] = n
    base = statistics.median(times[BASE])
    out = []
    for name in CONTENDERS:
        med = statistics.median(times[name])
        out.append([name, results[name], med * 1e6 / len(rows), med / base])
    columns = ["query", "result rows", "us per reading (median)", "x station level"]
    console.print(table(f"ROLLUP vs GROUP BY, {len(rows):,} readings", columns, out))
    if args.no_record:
        return
    ratio = out[1][3]
    body = (
        f"`python -m benchmarks.rollup` ({args.rounds} interleaved rounds, {len(rows):,} METR-LA "
        "readings, 207 stations in 40 segments, hourly windows): the ROLLUP runs one aggregate "
        "at the station level and merges each hour's segment and total rows from its finished "
        f"groups; it costs **{ratio:.2f}x** the station-level GROUP BY alone (goal: at most "
        "1.3x).\n\n" + markdown(columns, out)
    )
    record("rollup", body, note)


if __name__ == "__main__":
    main()
