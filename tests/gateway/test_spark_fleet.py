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
    lost = dict.fromkeys(("A", "B"), 0)
    for (g, ws), (n, _) in want.items():
        lost[g] += n - got.get((g, ws), (0, 0.0))[0]
    assert lost["B"] > 10_000  # the case: most of B's backlog
    assert lost["A"] == 0
    assert status["late_readings_dropped"] == lost


# -- schema drift ----------------------------------------------------------------------------


def test_classify_reads_nulls_and_safe_casts_and_refuses_the_rest() -> None:
    from gateway.spark.sources import classify

    declared = pa.schema([("time", pa.float64()), ("speed", pa.float64()), ("n", pa.int64())])
    assert classify(pa.schema([("time", pa.int64()), ("speed", pa.float32())]), declared) is None
    assert classify(pa.schema([("time", pa.float64()), ("n", pa.int32())]), declared) is None
    assert classify(pa.schema([("time", pa.float64()), ("extra", pa.string())]), declared) is None
    why = classify(pa.schema([("time", pa.float64()), ("speed", pa.string())]), declared)
    assert why is not None and "speed" in why
    assert classify(pa.schema([("time", pa.float64()), ("n", pa.float64())]), declared)
    assert classify(pa.schema([("speed", pa.float64())]), declared) == "no 'time' column"


@pytest.fixture
def drifted(two_days: pa.Table, tmp_path: Path) -> tuple[Path, pa.Table]:
    """Gateway A as declared; gateway B with one segment that has a new column, one with
    int64 speed and one with speed as text (refused). Returns (root, what is read, with `gw`)."""
    from gateway.spark.sources import archive_table, write_segment

    root = tmp_path / "archive"
    a, b = of(two_days, "A"), of(two_days, "B")
    archive_table(a, root, gateway="A", segments=2)
    step = -(-b.num_rows // 4)
    parts = [b.slice(i * step, step) for i in range(4)]
    write_segment(root, parts[0], 0, gateway="B")
    extra = parts[1].append_column("lane", pa.array(["1"] * parts[1].num_rows))
    write_segment(root, extra, 1, gateway="B")
    i = parts[2].schema.get_field_index("speed")
    ints = pc.cast(pc.fill_null(pc.round(parts[2]["speed"]), 0.0), pa.int64())
    write_segment(root, parts[2].set_column(i, "speed", ints), 2, gateway="B")
    text = parts[3].set_column(i, "speed", pc.cast(parts[3]["speed"], pa.string()))
    write_segment(root, text, 3, gateway="B")
    as_read = parts[2].set_column(i, "speed", pc.cast(ints, pa.float64()))
    b_read = pa.concat_tables([parts[0], parts[1], as_read])
    gw = pa.array(["A"] * a.num_rows + ["B"] * b_read.num_rows)
    return root, pa.concat_tables([a, b_read]).append_column("gw", gw)


def test_batch_survives_schema_drift(spark, drifted, caplog: pytest.LogCaptureFixture) -> None:
    from fjords.errors import FjordsError
    from gateway.spark.batch import result_rows, run_archive
    from gateway.spark.sources import Refusals

    root, read = drifted
    refusals = Refusals("traffic")
    with caplog.at_level(logging.WARNING, logger="gateway.spark.sources"):
        _, df = run_archive(spark, Q_COUNT, root, refusals=refusals)
        rows = result_rows(df)
    want = {**brute(of(read, "A"), "A"), **brute(of(read, "B"), "B")}
    assert_same(as_counts(rows), want)
    assert refusals.count == 1
    [(path, why)] = refusals.paths.items()
    assert "part-00000003" in path and "speed" in why
    assert "part-00000003" in caplog.text
    # traffic's declared schema (the gateway's own) has no `lane`: a query naming it is an error
    with pytest.raises(FjordsError):
        run_archive(spark, "SELECT lane FROM traffic", root)


def test_streaming_survives_schema_drift(spark, drifted, tmp_path: Path) -> None:
    from gateway.spark.sinks import CallbackSink
    from gateway.spark.sources import write_segment
    from gateway.spark.streaming import StreamingJob

    root, read = drifted
    t_end = read["time"][0].as_py() + 10 * DAY
    flush = of(read, "A").slice(0, 1)
    flush = flush.set_column(0, "time", pa.array([t_end], flush.schema.field("time").type))
    write_segment(root, flush, 2, gateway="A")
    write_segment(root, flush, 4, gateway="B")
    rows: list[dict] = []
    job = StreamingJob(
        spark,
        Q_COUNT,
        root,
        sink=CallbackSink(lambda _id, got: rows.extend(got)),
        checkpoint=tmp_path / "ckpt",
        available_now=True,
        max_files_per_trigger=2,
    )
    job.start()
    job.await_termination()
    st = job.status()
    assert st["state"] == "stopped" and st["error"] is None
    got = as_counts([r for r in rows if r["window_start"] < t_end - WINDOW])
    assert_same(got, {**brute(of(read, "A"), "A"), **brute(of(read, "B"), "B")})
    assert st["segments_refused"] == 1
    assert any("part-00000003" in p for p in st["refused_segments"])


def test_a_new_column_reads_as_null_where_absent(spark, two_days: pa.Table, tmp_path: Path) -> None:
    """A stream without a built-in declaration takes the newest segment's: the column it adds
    is NULL in the older segments."""
    from gateway.spark.batch import result_rows, run_archive
    from gateway.spark.sources import write_segment

    root = tmp_path / "archive"
    t = of(two_days, "A").select(["time", "station", "speed"]).slice(0, 500)
    write_segment(root, t.slice(0, 200), 0, gateway="A", stream="loops")
    newer = t.slice(200).append_column("lane", pa.array(["2"] * 300))
    write_segment(root, newer, 1, gateway="A", stream="loops")
    _, df = run_archive(spark, "SELECT gateway, lane FROM loops", root, stream="loops")
    rows = result_rows(df)
    assert len(rows) == 500
    assert sum(r["lane"] is None for r in rows) == 200
    assert {r["gateway"] for r in rows} == {"A"}


def test_a_legacy_flat_segment_reads_with_gateway_null(
    spark, two_days: pa.Table, tmp_path: Path
) -> None:
    from gateway.spark.batch import result_rows, run_archive
    from gateway.spark.sources import write_segment

    root = tmp_path / "archive"
    t = of(two_days, "A").slice(0, 300)
    write_segment(root, t.slice(0, 100), 0, gateway=None)
    write_segment(root, t.slice(100), 0, gateway="A")
    _, df = run_archive(spark, "SELECT gateway, station FROM traffic", root)
    got = [r["gateway"] for r in result_rows(df)]
    assert (got.count(None), got.count("A"), len(got)) == (100, 200, 300)


# -- the CLI -----------------------------------------------------------------------------------


def _cli(*argv: str) -> tuple[int, str]:
    from gateway.cli import main

    out = io.StringIO()
    with redirect_stdout(out):
        code = main(list(argv))
    return code, out.getvalue()


def test_cli_reads_several_roots_and_filters_gateways(
    spark, two_days: pa.Table, tmp_path: Path
) -> None:
    from gateway.spark.sources import archive_table

    first, second = tmp_path / "site1", tmp_path / "site2"
    archive_table(of(two_days, "A").slice(0, 300), first, gateway="A", segments=2)
    archive_table(of(two_days, "B").slice(0, 200), second, gateway="B", segments=2)
    q = "SELECT gateway, station FROM traffic"
    code, out = _cli(
        "spark", "batch", "--archive", str(first), "--archive", str(second), "--query", q, "--json"
    )
    assert code == 0
    lines = [json.loads(x) for x in out.splitlines()]
    assert lines[-1] == {"summary": {"segments_refused": 0, "refused_segments": {}}}
    got = [r["gateway"] for r in lines[:-1]]
    assert (got.count("A"), got.count("B"), len(got)) == (300, 200, 500)

    code, out = _cli(
        "spark", "batch", "--archive", str(first), "--archive", str(second),
        "--gateway", "B", "--query", q,
    )  # fmt: skip
    assert code == 0
    assert {json.loads(x)["gateway"] for x in out.splitlines()} == {"B"}
    code, _ = _cli("spark", "batch", "--archive", str(first), "--gateway", "Z", "--query", q)
    assert code == 2
    code, _ = _cli("spark", "batch", "--archive", str(first), "--archive", str(first), "--query", q)
    assert code == 2
    # `replay --engine spark` takes the fleet's roots too (the Fjord engine replays a trace)
    code, out = _cli(
        "replay", "--engine", "spark", "--archive", str(first), "--archive", str(second),
        "--gateway", "A", "--query", q,
    )  # fmt: skip
    assert code == 0
    got = [json.loads(x)["gateway"] for x in out.splitlines()]
    assert (got.count("A"), len(got)) == (300, 300)
    code, _ = _cli("replay", "--archive", str(first), "--query", q)
    assert code == 2


def test_cli_run_prints_the_per_gateway_summary(spark, two_days: pa.Table, tmp_path: Path) -> None:
    from gateway.spark.sources import archive_table

    root = tmp_path / "archive"
    archive_table(of(two_days, "A").slice(0, 2000), root, gateway="A", segments=2)
    archive_table(of(two_days, "B").slice(0, 2000), root, gateway="B", segments=2)
    code, out = _cli(
        "spark", "run", "--archive", str(root), "--query", Q_COUNT,
        "--available-now", "--json", "--sink", f"parquet:{tmp_path / 'out'}",
    )  # fmt: skip
    assert code == 0
    summary = json.loads(out.splitlines()[-1])["summary"]
    assert summary["late_readings_dropped"] == {"A": 0, "B": 0}
    assert summary["gateways"] == ["A", "B"]
    assert summary["segments_refused"] == 0


def test_a_gateway_appearing_later_is_named_and_left_unread(
    spark, two_days: pa.Table, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Spark cannot add a source to a query restarted from its checkpoint: the gateways are
    those of the checkpoint's first start; a new one is logged and listed, never read."""
    from gateway.spark.sinks import CallbackSink
    from gateway.spark.sources import write_segment
    from gateway.spark.streaming import StreamingJob

    root, ckpt = tmp_path / "archive", tmp_path / "ckpt"
    write_segment(root, of(two_days, "A").slice(0, 100), 0, gateway="A")
    rows: list[dict] = []
    q = "SELECT gateway, station FROM traffic"

    def job() -> StreamingJob:
        return StreamingJob(
            spark, q, root, sink=CallbackSink(lambda _i, got: rows.extend(got)),
            checkpoint=ckpt, available_now=True,
        )  # fmt: skip

    first = job()
    first.start()
    first.await_termination()
    write_segment(root, of(two_days, "B").slice(0, 100), 0, gateway="B")
    with caplog.at_level(logging.WARNING, logger="gateway.spark.streaming"):
        st = first.status()
        assert st["gateways_unread"] == ["B"]
        second = job()
        second.start()
        second.await_termination()
    assert "gateway B" in caplog.text
    assert second.status()["gateways"] == ["A"]
    assert {r["gateway"] for r in rows} == {"A"} and len(rows) == 100


def test_metrics_export_late_readings_per_query_and_gateway() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from gateway.metrics import SparkFleetCollector

    registry = CollectorRegistry(auto_describe=False)
    st = {"q1": {"late_readings_dropped": {"A": 0, "B": 7}, "segments_refused": 2}}
    registry.register(SparkFleetCollector(st))
    text = generate_latest(registry).decode()
    assert 'fjords_spark_late_readings_dropped_total{gateway="B",query="q1"} 7.0' in text
    assert 'fjords_spark_late_readings_dropped_total{gateway="A",query="q1"} 0.0' in text
    assert 'fjords_spark_segments_refused_total{query="q1"} 2.0' in text


def test_conform_casts_fills_nulls_and_names_the_gateway() -> None:
    from gateway.spark.sources import conform, gateway_of_path

    declared = pa.schema([("time", pa.float64()), ("speed", pa.float64()), ("lane", pa.string())])
    declared = declared.append(pa.field("gateway", pa.string()))
    t = pa.table({"time": pa.array([1, 2], pa.int64()), "speed": pa.array([3, 4], pa.int32())})
    path = "/r/traffic/gateway=B/date=2012-03-01/part-00000001-abc.parquet"
    assert gateway_of_path(path) == "B"
    assert gateway_of_path("/r/traffic/part-00000001-abc.parquet") is None
    out = conform(t, declared, gateway_of_path(path))
    assert out.schema == declared
    assert out.to_pylist() == [
        {"time": 1.0, "speed": 3.0, "lane": None, "gateway": "B"},
        {"time": 2.0, "speed": 4.0, "lane": None, "gateway": "B"},
    ]


def test_late_readings_counts_readings_whose_earliest_window_closed() -> None:
    from gateway.spark.progress import late_readings, window_slide

    times = pa.array([0.0, 59.0, 60.0, 119.0, 120.0, None])
    # windows of 60 s: [0, 60) ends at 60 s, [60, 120) at 120 s
    assert late_readings(times, 60.0, 60_000) == 2
    assert late_readings(times, 60.0, 119_999) == 2
    assert late_readings(times, 60.0, 120_000) == 4
    assert late_readings(times, 60.0, 0) == 0
    assert window_slide((300.0, 60.0)) == 60.0
    assert window_slide(None) is None
