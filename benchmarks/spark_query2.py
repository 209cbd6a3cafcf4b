"""The paper's Query 2 over the METR-LA week and the week replicated 10x: Spark vs Fjord vs pandas.

  python -m benchmarks.spark_query2 [--master local[2]] [--copies 10] [--repeat 2]

The 10x data set is the week with ten times the sensors (station ids suffixed, same segments and
readings), about 4.2 million readings: the averages and so Query 2's rows are the same as for
the week, which the run checks. All three engines read the same Parquet data (Spark as an
archive of segments, the Fjord as a Parquet trace, pandas with pyarrow); times are wall clock
from reading to the collected result, best of `--repeat`, with the Spark session already up.
"""

from __future__ import annotations

import argparse
import io
import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from benchmarks.common import OUT, console, drawn, markdown, record, table

Q2 = (
    "SELECT i.incident_id, i.description, s.segment, AVG(s.speed) AS avg_speed "
    "FROM traffic AS s [RANGE 30 MINUTES], incidents AS i "
    "WHERE i.segment = s.segment AND i.time >= NOW - 30 MINUTES AND i.time < NOW "
    "GROUP BY i.incident_id, i.description, s.segment HAVING AVG(s.speed) < 40"
)
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "metr-la"  # beside the clone


def _replicate(week: pa.Table, copies: int) -> pa.Table:
    if copies == 1:
        return week
    parts = []
    for k in range(copies):
        station = pc.binary_join_element_wise(week["station"], pa.scalar(f"r{k}"), "-")
        parts.append(week.set_column(week.schema.get_field_index("station"), "station", station))
    t = pa.concat_tables(parts)
    return t.take(pc.sort_indices(t, sort_keys=[("time", "ascending")]))  # time order


def _prepare(copies: int, segments: int) -> tuple[Path, Path, int]:
    from gateway.spark.sources import trace_table, write_segment

    base = OUT / "spark_query2" / f"x{copies}"
    trace, archive = base / "trace.parquet", base / "archive"
    if not trace.exists():
        t = _replicate(trace_table(DATA / "readings.csv", DATA / "stations.csv"), copies)
        base.mkdir(parents=True, exist_ok=True)
        pq.write_table(t, trace)
        step = -(-t.num_rows // segments)
        for i in range(segments):
            write_segment(archive, t.slice(i * step, step), i, gateway="gw")
    return trace, archive, pq.ParquetFile(trace).metadata.num_rows


def _fjord(trace: Path) -> list[dict]:
    from fjords.__main__ import run_file

    out = io.StringIO()
    run_file(str(trace), [Q2], tables=[("incidents", str(DATA / "incidents-sample.csv"))], out=out)
    return [json.loads(x) for x in out.getvalue().splitlines()]


def _pandas(trace: Path) -> list[dict]:
    import pandas as pd

    df = pd.read_parquet(trace, columns=["time", "speed", "segment"])
    inc = pd.read_csv(DATA / "incidents-sample.csv", dtype={"incident_id": str})
    ws = (df.time // 1800) * 1800
    seg = df.assign(window_start=ws).groupby(["segment", "window_start"]).speed.mean()
    j = seg.reset_index().merge(inc, on="segment")
    j = j[(j.time >= j.window_start) & (j.time < j.window_start + 1800) & (j.speed < 40)]
    return j.to_dict("records")


def _spark(spark, archive: Path) -> list[dict]:
    from gateway.spark.batch import result_rows, run_archive
    from gateway.spark.sources import StaticTable

    tables = {"incidents": StaticTable("incidents", DATA / "incidents-sample.csv")}
    _, df = run_archive(spark, Q2, archive, tables=tables)
    return result_rows(df)


def _best(fn, repeat: int) -> tuple[float, list[dict]]:
    best, rows = float("inf"), []
    for _ in range(repeat):
        t = time.perf_counter()
        rows = fn()
        best = min(best, time.perf_counter() - t)
    return best, rows


def _signature(rows: list[dict]) -> list[tuple]:
    return sorted(
        (str(r["incident_id"]), round(float(r.get("avg_speed", r.get("speed"))), 6)) for r in rows
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.spark_query2", description=__doc__)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--copies", type=int, default=10)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args(argv)

    from gateway.spark.session import SparkConfig, get_session

    spark = get_session(SparkConfig(master=args.master, shuffle_partitions=4))
    results = []
    for copies in (1, args.copies):
        trace, archive, n = _prepare(copies, segments=8 * copies)
        timings = {}
        answers = {}
        _spark(spark, archive)  # warm-up: JIT, file listing, broadcast
        for name, fn in (
            ("Spark " + args.master, lambda a=archive: _spark(spark, a)),
            ("Fjord", lambda t=trace: _fjord(t)),
            ("pandas", lambda t=trace: _pandas(t)),
        ):
            repeat = 1 if name == "Fjord" and copies > 1 else args.repeat
            timings[name], rows = _best(fn, repeat)
            answers[name] = _signature(rows)
        same = len({tuple(a) for a in answers.values()}) == 1
        fj = timings["Fjord"]
        for name, secs in timings.items():
            results.append(
                [
                    f"x{copies} ({n:,} readings)",
                    name,
                    secs,
                    n / secs,
                    fj / secs,
                    "yes" if same else "NO",
                ]
            )
    cols = ["data", "engine", "wall s", "rows/s", "speed-up vs Fjord", "same rows"]
    console.print(table("Query 2 (windowed AVG per segment x incidents)", cols, results))
    _plot(results)
    record(
        "spark_query2",
        "`python -m benchmarks.spark_query2` (Spark "
        f"`{args.master}`, best of {args.repeat}; the Fjord once at 10x). Query 2 of the paper over "
        "the METR-LA week and the week with 10x the sensors; all engines read the same Parquet "
        "data and give the same rows (checked). "
        + drawn("Plot", "spark_query2.png")
        + "\n\n"
        + markdown(cols, results)
        + "\n\nSpark's time is mostly per-job overhead (x1 and x10 take about as long): the "
        "partial aggregate by (window, segment) runs columnar in the JVM before the join. pandas "
        "is in-memory and single-node, fastest at this size. The Fjord runs tuple by tuple in "
        "Python, as built for live streams; history at scale is what the Spark path is for. "
        "Streaming is not timed here (its rows are checked in tests/gateway/test_spark.py).",
    )


def _plot(results: list[list]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    datasets = sorted({r[0] for r in results}, key=lambda d: int(d.split()[0][1:]))
    engines = list(dict.fromkeys(r[1] for r in results))
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / len(engines)
    for k, e in enumerate(engines):
        ys = [next(r[3] for r in results if r[0] == d and r[1] == e) for d in datasets]
        ax.bar([i + k * width for i in range(len(datasets))], ys, width, label=e)
    ax.set_xticks([i + width * (len(engines) - 1) / 2 for i in range(len(datasets))], datasets)
    ax.set_ylabel("readings per second")
    ax.set_yscale("log")
    ax.set_title("Query 2: throughput")
    ax.legend()
    fig.tight_layout()
    OUT.mkdir(exist_ok=True)
    fig.savefig(OUT / "spark_query2.png", dpi=120)


if __name__ == "__main__":
    main()
