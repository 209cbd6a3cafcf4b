"""Spark over a fleet: two gateways' archives under one root (the METR-LA trace, its stations
split between gateways A and B), read per gateway with the stream's declared schema (the session's `local[2]` SparkSession:
tests/conftest.py `spark`).

Batch and streaming results per (gateway, window) are checked exactly against a brute force in
pyarrow; a gateway a day behind the other loses nothing (one watermark per gateway, `min`);
late readings are counted per gateway, in readings, against what the results lack; segments
that drift from the declared schema are read (NULL, cast) or refused and counted, never a
failed job; the CLI takes `--gateway` and several `--archive`.
"""

from __future__ import annotations

import io
import json
import logging
from collections import defaultdict
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.support import shared_file

pytestmark = pytest.mark.needs_spark

WINDOW = 3600.0
DAY = 86_400
Q_COUNT = (
    "SELECT gateway, COUNT(*) AS n, SUM(speed) AS total FROM traffic [RANGE 1 HOUR] "
    "GROUP BY gateway"
)


@pytest.fixture(scope="module")
def two_days() -> pa.Table:
    """Two days of the METR-LA trace as the gateways archive it, with a gateway per station:
    the first half of the stations (sorted) is A's, the rest B's."""
    from gateway.spark.sources import trace_table

    week = trace_table(
        shared_file("data/metr-la/readings.csv"), shared_file("data/metr-la/stations.csv")
    )
    t0 = week["time"][0].as_py()
    t = week.filter(pc.less(week["time"], t0 + 2 * DAY))
    stations = sorted(set(t["station"].to_pylist()))
    a = pa.array(stations[: len(stations) // 2])
    gw = pc.if_else(pc.is_in(t["station"], value_set=a), "A", "B")
    return t.append_column("gw", gw)


def of(t: pa.Table, gateway: str) -> pa.Table:
    return t.filter(pc.equal(t["gw"], gateway)).drop_columns(["gw"])


def brute(t: pa.Table, gateway: str) -> dict[tuple[str, float], tuple[int, float]]:
    """(gateway, window_start) -> (readings, sum of speed) of one gateway's rows."""
    acc: dict[tuple[str, float], list[float]] = defaultdict(lambda: [0, 0.0])
    for time, speed in zip(t["time"].to_pylist(), t["speed"].to_pylist(), strict=True):
        a = acc[(gateway, (time // WINDOW) * WINDOW)]
        a[0] += 1
        a[1] += speed if speed is not None else 0.0
    return {k: (int(n), s) for k, (n, s) in acc.items()}


def as_counts(rows: list[dict]) -> dict[tuple[str, float], tuple[int, float]]:
    out = {}
    for r in rows:
        key = (r["gateway"], r["window_start"])
        assert key not in out, f"window {key} output twice"
        out[key] = (r["n"], r["total"] or 0.0)
    return out


def assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k, (n, s) in want.items():
        assert got[k][0] == n, k
        assert got[k][1] == pytest.approx(s, rel=1e-9, abs=1e-6), k


def test_batch_reads_every_gateway_exactly(spark, two_days: pa.Table, tmp_path: Path) -> None:
    from gateway.spark.batch import result_rows, run_archive
    from gateway.spark.sources import archive_table

    root = tmp_path / "archive"
    for g in ("A", "B"):
        archive_table(of(two_days, g), root, gateway=g, segments=4)
    want = {**brute(of(two_days, "A"), "A"), **brute(of(two_days, "B"), "B")}
    _, df = run_archive(spark, Q_COUNT, root)
    assert_same(as_counts(result_rows(df)), want)
    _, df = run_archive(spark, Q_COUNT, root, gateways=["B"])
    assert_same(as_counts(result_rows(df)), brute(of(two_days, "B"), "B"))


def _late_gateway_run(spark, two_days: pa.Table, tmp_path: Path, *, per_gateway: bool) -> tuple:
    """A has both days archived, B one segment; the job runs; then B's backlog arrives and
    the job runs again from its checkpoint; then both send a reading ten days later, which
    closes every window of the two days. Returns (rows of the two days' windows, status)."""
    from gateway.spark.sinks import CallbackSink
    from gateway.spark.sources import archive_table, write_segment
    from gateway.spark.streaming import StreamingJob

    root, ckpt = tmp_path / "archive", tmp_path / "ckpt"
    a, b = of(two_days, "A"), of(two_days, "B")
    archive_table(a, root, gateway="A", segments=4)
    step = -(-b.num_rows // 6)
    b_parts = [b.slice(i * step, step) for i in range(6)]
    write_segment(root, b_parts[0], 0, gateway="B")
    rows: list[dict] = []

    def run() -> dict:
        job = StreamingJob(
            spark,
            Q_COUNT,
            root,
            sink=CallbackSink(lambda _id, got: rows.extend(got)),
            checkpoint=ckpt,
            available_now=True,
            max_files_per_trigger=1,
        )
        job.per_gateway_watermarks = per_gateway
        job.start()
        job.await_termination()
        return job.status()

    run()
    for i, part in enumerate(b_parts[1:], start=1):  # B's backlog, after A's day ahead
        write_segment(root, part, i, gateway="B")
    run()
    t_end = two_days["time"][0].as_py() + 10 * DAY
    for g, seq in (("A", 4), ("B", 6)):
        flush = a.slice(0, 1).set_column(0, "time", pa.array([t_end], a.schema.field("time").type))
        write_segment(root, flush, seq, gateway=g)
    status = run()
    return [r for r in rows if r["window_start"] < t_end - WINDOW], status


def test_a_gateway_a_day_behind_loses_nothing(spark, two_days: pa.Table, tmp_path: Path) -> None:
    rows, status = _late_gateway_run(spark, two_days, tmp_path, per_gateway=True)
    want = {**brute(of(two_days, "A"), "A"), **brute(of(two_days, "B"), "B")}
    assert_same(as_counts(rows), want)
    assert status["late_readings_dropped"] == {"A": 0, "B": 0}
    assert status["segments_refused"] == 0
    assert status["gateways"] == ["A", "B"]


def test_late_readings_are_counted_per_gateway_in_readings(
    spark, two_days: pa.Table, tmp_path: Path
) -> None:
    """With ONE watermark for the union (the job before per-gateway sources), B's backlog is
    dropped as late: the count says how many readings, exactly what the results lack."""
    rows, status = _late_gateway_run(spark, two_days, tmp_path, per_gateway=False)
    got = as_counts(rows)
    want = {**brute(of(two_days, "A"), "A"), **brute(of(two_days, "B"), "B")}
    lost = {g: 0 for g in ("A", "B")}
    for (g, ws), (n, _) in want.items():
        lost[g] += n - got.get((g, ws), (0, 0.0))[0]
    assert lost["B"] > 10_000  # the case: most of B's backlog
    assert lost["A"] == 0
    assert status["late_readings_dropped"] == lost
