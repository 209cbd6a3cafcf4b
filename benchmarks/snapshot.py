"""Snapshot queries over the history against DuckDB over an in-memory table of the same readings.

    python -m benchmarks.snapshot            # METR-LA week + 10,000 sensors x 1 Hz x 1 hour
    python -m benchmarks.snapshot --quick    # 1,000 synthetic sensors (a smoke run)

Two data sets: the METR-LA fleet's week (207 sensors, a reading every 300 s) and a synthetic
fleet (1 Hz for an hour, 300 segments). Each query is asked of both contenders in turn
(interleaved, after a warm-up), `--repeat` times: `fjords.snapshot.Snapshots` over
`fjords.runtime.history.History` (what `POST /snapshot` runs, without HTTP), and DuckDB over a
table it holds in memory (its own columnar format, all cores). Memory per retained reading is
what tracemalloc sees the history allocate (numpy reports its buffers to it), against the
readings' count. Results go to benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import csv
import gc
import math
import statistics
import time
import tracemalloc
from collections.abc import Callable, Iterable
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from benchmarks.common import console, markdown, record, table
from fjords.engine import Engine
from fjords.runtime.history import History
from fjords.snapshot import Snapshots
from gateway.daemon import TRAFFIC_SCHEMA
from gateway.history import TRAFFIC_STATIC

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "metr-la"
BATCH = 10_000


def metr_la() -> tuple[list[tuple], str]:
    segment, where = {}, {}
    with (SHARED / "stations.csv").open() as f:
        for r in csv.DictReader(f):
            segment[r["station"]] = r["segment"]
            where[r["station"]] = (float(r["latitude"]), float(r["longitude"]))
    rows = []
    with (SHARED / "readings.csv").open() as f:
        for r in csv.DictReader(f):
            st = r["station"]
            if r["speed"] and st in segment:
                lat, lon = where[st]
                rows.append((float(r["time"]), st, float(r["speed"]), lat, lon, segment[st]))
    return rows, "S14"


def synthetic(sensors: int, seconds: int) -> Callable[[], Iterable[list[tuple]]]:
    """Batches of one second of `sensors` readings each (built lazily: 36M tuples at once would
    be gigabytes)."""
    rng = np.random.default_rng(1)
    base = 1_764_547_200.0
    names = [f"st{i}" for i in range(sensors)]
    segs = [f"S{i % 300}" for i in range(sensors)]

    def batches():
        for sec in range(seconds):
            speeds = (40 + 30 * rng.random(sensors)).round(2).tolist()
            offsets = (rng.random(sensors) * 0.9).tolist()
            yield [
                (base + sec + offsets[i], names[i], speeds[i], 34.0, -118.0, segs[i])
                for i in range(sensors)
            ]

    return batches


def build(
    batches: Callable[[], Iterable[list[tuple]]],
) -> tuple[Snapshots, History, pa.Table, int, float]:
    """The history, DuckDB's table, readings, and bytes per reading that tracemalloc saw the
    history keep. Two passes over `batches` (it makes them anew each time): the history's alone
    under tracemalloc (each batch is freed before the next), then DuckDB's columns."""
    engine = Engine()
    engine.fjord.add_stream("traffic", TRAFFIC_SCHEMA, sensor_field="station")
    history = History(
        "traffic", TRAFFIC_SCHEMA, static=TRAFFIC_STATIC, keep_s=8 * 86_400, max_rows=10**9
    )
    gc.collect()
    tracemalloc.start()
    for batch in batches():
        history.add_many(batch)
        del batch
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    cols: dict[str, list] = {"time": [], "station": [], "speed": [], "segment": []}
    n = 0
    for batch in batches():
        cols["time"].append(pa.array([r[0] for r in batch]))
        cols["station"].append(pa.array([r[1] for r in batch]))
        cols["speed"].append(pa.array([r[2] for r in batch]))
        cols["segment"].append(pa.array([r[5] for r in batch]))
        n += len(batch)
    arrow = pa.table({name: pa.chunked_array(chunks) for name, chunks in cols.items()})
    return Snapshots(engine, {"traffic": history}), history, arrow, n, kept / max(n, 1)


def queries(to: float, segment: str) -> list[tuple[str, str, str]]:
    """(label, snapshot SQL, DuckDB SQL) over the same readings."""
    day0 = to - 86_400
    return [
        (
            "last 30 min per segment",
            "SELECT segment, COUNT(*) AS n, AVG(speed) AS a, MIN(speed) AS lo, MAX(speed) AS hi "
            "FROM traffic [RANGE 30 MINUTES] GROUP BY segment",
            "SELECT segment, COUNT(*), AVG(speed), MIN(speed), MAX(speed) FROM traffic "
            f"WHERE time >= {to - 1800!r} AND time < {to!r} GROUP BY segment",
        ),
        (
            "one segment per station, a day",
            f"SELECT station, AVG(speed) AS a FROM traffic WHERE segment = '{segment}' AND "
            f"time >= {day0!r} AND time < {to!r} GROUP BY station",
            f"SELECT station, AVG(speed) FROM traffic WHERE segment = '{segment}' AND "
            f"time >= {day0!r} AND time < {to!r} GROUP BY station",
        ),
        (
            "whole history, one number",
            "SELECT COUNT(*) AS n, AVG(speed) AS a FROM traffic",
            f"SELECT COUNT(*), AVG(speed) FROM traffic WHERE time < {to!r}",
        ),
    ]


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def run(name: str, batches: Callable[[], Iterable[list[tuple]]], repeat: int) -> list[list[object]]:
    console.print(f"[bold]{name}[/]: loading ...")
    snaps, history, arrow, n, per_reading = build(batches)
    con = duckdb.connect()
    con.register("traffic_arrow", arrow)
    con.execute("CREATE TABLE traffic AS SELECT * FROM traffic_arrow")
    con.unregister("traffic_arrow")
    to = math.nextafter(history.newest, math.inf)  # `partial`: every reading held
    rows = []
    for label, sql, dsql in queries(to, "S14"):
        ours, theirs = [], []
        answer = snaps.answer(sql, partial=True)  # warm-up, and the two answers agree
        want = con.execute(dsql).fetchall()
        assert len(answer.rows) == len(want), (label, len(answer.rows), len(want))
        for _ in range(repeat):
            ours.append(timed(lambda sql=sql: snaps.answer(sql, partial=True)))
            theirs.append(timed(lambda dsql=dsql: con.execute(dsql).fetchall()))
        med = statistics.median(ours) / statistics.median(theirs)
        rows.append(
            [f"{name}: {label}", n, answer.path, *_mmm(ours), *_mmm(theirs), med, per_reading]
        )
    return rows


def _mmm(xs: list[float]) -> list[float]:
    return [min(xs), statistics.median(xs), max(xs)]


COLUMNS = [
    "query",
    "readings",
    "path",
    "fjords min ms",
    "median",
    "max",
    "duckdb min ms",
    "median",
    "max",
    "median ratio",
    "B/reading",
]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.snapshot", description=__doc__)
    p.add_argument("--quick", action="store_true", help="1,000 synthetic sensors, no METR-LA")
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args(argv)
    rows = []
    if not args.quick and (SHARED / "readings.csv").exists():
        data, _ = metr_la()
        week = [data[i : i + BATCH] for i in range(0, len(data), BATCH)]
        rows += run("METR-LA week (207 sensors)", lambda: week, args.repeat)
    sensors = 1_000 if args.quick else 10_000
    rows += run(f"{sensors:,} sensors x 1 Hz x 1 h", synthetic(sensors, 3600), args.repeat)
    console.print(table("Snapshots: fjords history vs DuckDB (ms)", COLUMNS, rows))
    if not args.quick:
        body = (
            "`python -m benchmarks.snapshot`: each query asked of both in turn, "
            f"{args.repeat} times after a warm-up. `path`: cells (per-sensor aggregates per "
            "60 s bucket, edge buckets from readings) or readings. B/reading: what tracemalloc "
            "saw the history allocate per retained reading.\n\n" + markdown(COLUMNS, rows)
        )
        record("snapshot", body)


if __name__ == "__main__":
    main()
