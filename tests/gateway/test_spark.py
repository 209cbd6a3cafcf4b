"""Spark batch and streaming give the Fjord's rows; exactly-once across a crash and a restart.

One SparkSession (`local[2]`) for the whole file. Outside CI the tests skip without pyspark or
a JDK; under CI=true they fail instead.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from fjords.__main__ import run_file
from gateway.spark.batch import replay, result_rows, run_archive
from gateway.spark.session import SparkConfig
from gateway.spark.sinks import CallbackSink, ParquetSink
from gateway.spark.sources import StaticTable, trace_table, write_segment
from gateway.spark.streaming import StreamingJob
from tests.support import Broker, async_eventually, shared_file

pytestmark = pytest.mark.needs_spark

Q1 = (
    "SELECT segment, AVG(speed) AS avg_speed FROM traffic [RANGE 15 MINUTES] "
    "WHERE segment IN ('S05','S14') GROUP BY segment"
)
Q_FILTER = "SELECT * FROM traffic WHERE speed < 30 AND station = '773869'"
Q_HAVING = (
    "SELECT station, MAX(speed) FROM traffic [RANGE 1 HOUR SLIDE 15 MINUTES] "
    "GROUP BY station HAVING MAX(speed) > 65"
)
Q2 = (
    "SELECT i.incident_id, i.description, s.segment, AVG(s.speed) AS avg_speed "
    "FROM traffic AS s [RANGE 30 MINUTES], incidents AS i "
    "WHERE i.segment = s.segment AND i.time >= NOW - 30 MINUTES AND i.time < NOW "
    "GROUP BY i.incident_id, i.description, s.segment HAVING AVG(s.speed) < 40"
)
Q_SEGMENTS = (
    "SELECT segment, AVG(speed) AS avg_speed, COUNT(*) AS n FROM traffic [RANGE 15 MINUTES] "
    "GROUP BY segment"
)
DAY = 86400


@pytest.fixture(scope="module")
def metr_la() -> dict:
    return {
        "readings": shared_file("data/metr-la/readings.csv"),
        "stations": shared_file("data/metr-la/stations.csv"),
        "incidents": shared_file("data/metr-la/incidents-sample.csv"),
    }


@pytest.fixture(scope="module")
def week(metr_la: dict) -> pa.Table:
    """The METR-LA week as the gateway archives it (stream columns, time order)."""
    return trace_table(metr_la["readings"], metr_la["stations"])


def _archive(directory: Path, table: pa.Table, segments: int, first: int = 0) -> None:
    step = -(-table.num_rows // segments)
    for i in range(segments):
        write_segment(directory, table.slice(i * step, step), first + i, gateway="gw")


def _fjord(metr_la: dict, queries: list[str]) -> list[dict]:
    out = io.StringIO()
    run_file(
        str(metr_la["readings"]),
        queries,
        stations=str(metr_la["stations"]),
        tables=[("incidents", str(metr_la["incidents"]))],
        out=out,
    )
    return [json.loads(line) for line in out.getvalue().splitlines()]


def _of(rows: list[dict], i: int) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "query"} for r in rows if r["query"] == i]


def _assert_same(got: list[dict], want: list[dict], tol: float = 1e-6) -> None:
    """Equal as multisets of rows, floats to `tol`, columns in the same order."""
    assert len(got) == len(want)
    if not got:
        return

    def key(r: dict) -> str:
        return json.dumps([round(v, 4) if isinstance(v, float) else v for v in r.values()])

    for g, w in zip(sorted(got, key=key), sorted(want, key=key), strict=True):
        assert list(g) == list(w)
        for k in w:
            if isinstance(w[k], float) or isinstance(g[k], float):
                assert abs(g[k] - w[k]) <= tol, (k, g, w)
            else:
                assert g[k] == w[k], (k, g, w)


def _pandas_query2(metr_la: dict) -> list[dict]:
    df = pd.read_csv(metr_la["readings"], dtype={"station": str}).merge(
        pd.read_csv(metr_la["stations"], dtype={"station": str}), on="station"
    )
    inc = pd.read_csv(metr_la["incidents"], dtype={"incident_id": str})
    d = df.assign(window_start=(df.time // 1800) * 1800, window_end=(df.time // 1800) * 1800 + 1800)
    seg = d.groupby(["segment", "window_start", "window_end"]).speed.mean().reset_index()
    j = seg.merge(inc, on="segment")
    j = j[(j.time >= j.window_end - 1800) & (j.time < j.window_end) & (j.speed < 40)]
    return [
        {
            "incident_id": r.incident_id,
            "description": r.description,
            "segment": r.segment,
            "avg_speed": float(r.speed),
            "window_start": float(r.window_start),
            "window_end": float(r.window_end),
        }
        for r in j.itertuples()
    ]


# -- the paper's Query 2, four ways --------------------------------------------------------------


def test_query2_same_rows_on_fjord_spark_batch_streaming_and_pandas(
    spark, metr_la: dict, week: pa.Table, tmp_path: Path
) -> None:
    fjord = _of(_fjord(metr_la, [Q2]), 0)
    want = _pandas_query2(metr_la)
    assert len(want) > 0
    _assert_same(fjord, want)

    out = io.StringIO()
    replay(
        metr_la["readings"],
        [Q2],
        stations=metr_la["stations"],
        tables=[("incidents", str(metr_la["incidents"]))],
        out=out,
    )
    _assert_same(_of([json.loads(x) for x in out.getvalue().splitlines()], 0), want)

    archive = tmp_path / "archive"
    _archive(archive, week, segments=7)
    tables = {"incidents": StaticTable("incidents", metr_la["incidents"])}
    _, df = run_archive(spark, Q2, archive, tables=tables)
    _assert_same(result_rows(df), want)

    sink = ParquetSink(str(tmp_path / "out"))
    job = StreamingJob(
        spark,
        Q2,
        archive,
        sink=sink,
        checkpoint=tmp_path / "ckpt",
        tables=tables,
        available_now=True,
        max_files_per_trigger=2,
    )
    job.start()
    job.await_termination()
    assert job.status()["state"] == "stopped"
    streamed = result_rows(sink.read(spark).drop("batch"))
    # Windows still open at the end of the archive wait for more data; none of Query 2's rows
    # is in the last hour of the week, so streaming has all of them.
    assert max(r["window_end"] for r in want) < week["time"][-1].as_py() - 3600
    _assert_same(streamed, want)


def test_spark_replay_matches_the_fjord(spark, metr_la: dict) -> None:
    queries = [Q1, Q_FILTER, Q_HAVING]
    fjord = _fjord(metr_la, queries)
    out = io.StringIO()
    replay(metr_la["readings"], queries, stations=metr_la["stations"], out=out)
    got = [json.loads(x) for x in out.getvalue().splitlines()]
    for i in range(len(queries)):
        assert len(_of(fjord, i)) > 0
        _assert_same(_of(got, i), _of(fjord, i))


# -- many query shapes on a small trace ------------------------------------------------------------

SHAPES = [
    "SELECT station, COUNT(*), COUNT(speed), SUM(speed), MIN(speed), MAX(speed) "
    "FROM traffic [RANGE 25 MINUTES SLIDE 10 MINUTES] GROUP BY station",
    "SELECT segment, MAX(speed) - MIN(speed) AS spread FROM traffic [RANGE 30 MINUTES] "
    "WHERE speed > 10 GROUP BY segment HAVING COUNT(*) > 3",
    "SELECT time, station, speed * 2 AS twice FROM traffic "
    "WHERE station IN ('a', 'b') AND NOT speed BETWEEN 20 AND 30",
    "SELECT AVG(speed) FROM traffic [RANGE 1 HOUR]",
    "SELECT window_end, COUNT(*) AS n FROM traffic [RANGE 30 MINUTES] GROUP BY station",
    "SELECT station, SUM(speed) / COUNT(speed) AS mean FROM traffic [RANGE 20 MINUTES] "
    "WHERE speed IS NOT NULL OR station = 'c' GROUP BY station",
    "SELECT s.station, i.incident_id, i.description FROM traffic AS s, incidents AS i "
    "WHERE s.segment = i.segment AND i.time <= NOW AND NOW < i.time + 600",
    "SELECT i.incident_id, COUNT(*) AS n, AVG(s.speed) FROM traffic AS s "
    "[RANGE 20 MINUTES SLIDE 5 MINUTES], incidents AS i "
    "WHERE s.segment = i.segment AND i.time < NOW GROUP BY i.incident_id",
    "SELECT s.segment, MIN(s.speed) AS low FROM traffic AS s [RANGE 1 HOUR SLIDE 30 MINUTES], "
    "incidents AS i WHERE s.segment = i.segment AND i.time >= NOW - 1 HOUR AND i.time < NOW "
    "GROUP BY s.segment HAVING MIN(s.speed) < 50",
    # stream-stream joins: same tumbling window; NULL speeds never join
    "SELECT a.station, b.station AS peer, a.speed - b.speed AS d FROM traffic AS a "
    "[RANGE 10 MINUTES], traffic AS b [RANGE 10 MINUTES] "
    "WHERE a.segment = b.segment AND a.station < b.station AND a.speed > b.speed",
    "SELECT a.segment, COUNT(*) AS n, AVG(b.speed) FROM traffic AS a [RANGE 15 MINUTES], "
    "traffic AS b [RANGE 15 MINUTES] WHERE a.speed = b.speed GROUP BY a.segment",
]


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> dict:
    d = tmp_path_factory.mktemp("small")
    t0 = 1_330_588_800
    lines = ["time,station,speed"]
    for k in range(180):  # three hours, a sample a minute, some missing speeds
        for st, base in (("a", 60), ("b", 35), ("c", 20)):
            v = "" if (k * 7 + ord(st)) % 23 == 0 else f"{base + (k * 13 % 17) - 8:.2f}"
            lines.append(f"{t0 + 60 * k},{st},{v}")
    (d / "r.csv").write_text("\n".join(lines) + "\n")
    (d / "st.csv").write_text("station,segment\na,S1\nb,S1\nc,S2\n")
    (d / "inc.csv").write_text(
        "incident_id,time,segment,description\n"
        f"X1,{t0 + 1500},S1,Collision\nX2,{t0 + 4000},S2,Debris\nX3,{t0 + 9000},S1,Fire\n"
    )
    return {"readings": d / "r.csv", "stations": d / "st.csv", "incidents": d / "inc.csv"}


def test_query_shapes_match_the_fjord(spark, small: dict) -> None:
    tables = [("incidents", str(small["incidents"]))]
    want_out, got_out = io.StringIO(), io.StringIO()
    run_file(
        str(small["readings"]), SHAPES, stations=str(small["stations"]), tables=tables, out=want_out
    )
    replay(small["readings"], SHAPES, stations=small["stations"], tables=tables, out=got_out)
    want = [json.loads(x) for x in want_out.getvalue().splitlines()]
    got = [json.loads(x) for x in got_out.getvalue().splitlines()]
    for i, sql in enumerate(SHAPES):
        assert _of(want, i), sql
        _assert_same(_of(got, i), _of(want, i))


def test_replay_cli_prints_the_same_rows_on_both_engines(
    spark, small: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    from gateway.cli import main

    sql = "SELECT station, MAX(speed), COUNT(*) FROM traffic [RANGE 30 MINUTES] GROUP BY station"
    # Motes send no reading where the trace has none: compare on the rows that have one.
    readings = small["readings"].with_name("r-present.csv")
    readings.write_text(
        "".join(
            x
            for x in small["readings"].read_text().splitlines(keepends=True)
            if not x.rstrip().endswith(",")
        )
    )
    lines = {}
    for engine in ("fjords", "spark"):
        args = ["replay", "--readings", str(readings), "--query", sql]
        assert main([*args, "--engine", engine, "--master", "local[2]"]) == 0
        lines[engine] = sorted(capsys.readouterr().out.splitlines())
    assert lines["spark"] == lines["fjords"] and len(lines["spark"]) == 18
    assert main(["replay", "--readings", "/nonexistent.csv", "--query", sql, "--engine", "spark"])
    assert "not found" in capsys.readouterr().err


# -- streaming: exactly once across a crash and a stop, and table reloads -------------------------


class _CrashAfterWriting(ParquetSink):
    """Writes a batch's rows, then fails once: a job killed mid-batch, after partial output."""

    def __init__(self, path: str, crash_at: int) -> None:
        super().__init__(path)
        self.crash_at = crash_at

    def write(self, df, batch_id: int) -> None:
        super().write(df, batch_id)
        if batch_id == self.crash_at:
            raise RuntimeError("simulated crash after writing part of the output")


def test_streaming_is_exactly_once_across_a_crash_and_a_restart(
    spark, week: pa.Table, tmp_path: Path
) -> None:
    from pyspark.errors import StreamingQueryException

    t0 = week["time"][0].as_py()
    two_days = week.filter(pa.compute.less(week["time"], t0 + 2 * DAY))
    step = -(-two_days.num_rows // 10)
    parts = [two_days.slice(i * step, step) for i in range(10)]
    archive, ckpt, out = tmp_path / "archive", tmp_path / "ckpt", tmp_path / "out"

    def job(sink: ParquetSink, checkpoint: Path, **kw: object) -> StreamingJob:
        return StreamingJob(spark, Q_SEGMENTS, archive, sink=sink, checkpoint=checkpoint, **kw)

    for i in range(4):  # the gateway has written four segments
        write_segment(archive, parts[i], i, gateway="gw")
    first = job(_CrashAfterWriting(str(out), crash_at=2), ckpt, max_files_per_trigger=1)
    first.start()
    with pytest.raises(StreamingQueryException, match="simulated crash"):
        first.await_termination(timeout=120)
    assert first.status()["state"] == "failed"
    for i in range(4, 7):  # ... and goes on writing while the job is down
        write_segment(archive, parts[i], i, gateway="gw")
    second = job(ParquetSink(str(out)), ckpt, max_files_per_trigger=1)
    second.start()
    second.handle.processAllAvailable()
    second.stop()  # a clean stop mid-archive
    for i in range(7, 10):
        write_segment(archive, parts[i], i, gateway="gw")
    third = job(ParquetSink(str(out)), ckpt, available_now=True, max_files_per_trigger=2)
    third.start()
    third.await_termination()

    ref_archive = tmp_path / "ref-archive"
    for i, p in enumerate(parts):
        write_segment(ref_archive, p, i, gateway="gw")
    ref_sink = ParquetSink(str(tmp_path / "ref-out"))
    ref = StreamingJob(
        spark,
        Q_SEGMENTS,
        ref_archive,
        sink=ref_sink,
        checkpoint=tmp_path / "ref-ckpt",
        available_now=True,
    )
    ref.start()
    ref.await_termination()

    got = result_rows(ParquetSink(str(out)).read(spark).drop("batch"))
    want = result_rows(ref_sink.read(spark).drop("batch"))
    keys = [(r["segment"], r["window_start"]) for r in got]
    assert len(keys) == len(set(keys)), "a window was output twice"
    assert len(got) > 3000
    _assert_same(got, want, tol=1e-9)


def test_streaming_reloads_a_changed_table_without_restarting(
    spark, week: pa.Table, metr_la: dict, tmp_path: Path
) -> None:
    t0 = week["time"][0].as_py()
    day1 = week.filter(pa.compute.less(week["time"], t0 + DAY))
    day2 = week.filter(
        pa.compute.and_(
            pa.compute.greater_equal(week["time"], t0 + DAY),
            pa.compute.less(week["time"], t0 + 2 * DAY),
        )
    )
    incidents = tmp_path / "incidents.csv"
    incidents.write_text("incident_id,time,segment,description\n")
    sql = (
        "SELECT i.incident_id, s.segment, AVG(s.speed) AS avg_speed, COUNT(*) AS n "
        "FROM traffic AS s [RANGE 30 MINUTES], incidents AS i "
        "WHERE i.segment = s.segment AND i.time >= NOW - 30 MINUTES AND i.time < NOW "
        "GROUP BY i.incident_id, s.segment"
    )
    archive = tmp_path / "archive"
    write_segment(archive, day1, 0, gateway="gw")
    got: list[dict] = []
    tables = {"incidents": StaticTable("incidents", incidents)}
    job = StreamingJob(
        spark,
        sql,
        archive,
        sink=CallbackSink(lambda _id, rows: got.extend(rows)),
        checkpoint=tmp_path / "ckpt",
        tables=tables,
        trigger="0 seconds",
    )
    job.start()
    try:
        job.handle.processAllAvailable()
        assert got == []
        when = t0 + DAY + 3600 + 600  # inside day 2's window [t0+1d+1h, t0+1d+1h30m)
        incidents.write_text(
            f"incident_id,time,segment,description\nN1,{when},S05,Stalled vehicle\n"
        )
        os.utime(incidents, ns=(10**18, 10**18))  # a new mtime even on coarse clocks
        write_segment(archive, day2, 1, gateway="gw")
        job.handle.processAllAvailable()
    finally:
        job.stop()
    assert tables["incidents"].reloads == 1
    assert [(r["incident_id"], r["window_start"]) for r in got] == [("N1", t0 + DAY + 3600.0)]
    seg = day2.filter(
        pa.compute.and_(
            pa.compute.equal(day2["segment"], "S05"),
            pa.compute.and_(
                pa.compute.greater_equal(day2["time"], t0 + DAY + 3600),
                pa.compute.less(day2["time"], t0 + DAY + 5400),
            ),
        )
    )
    assert got[0]["n"] == seg.num_rows
    assert abs(got[0]["avg_speed"] - pa.compute.mean(seg["speed"]).as_py()) < 1e-6


# -- the daemon's supervisor ------------------------------------------------------------------------


async def test_supervisor_runs_a_spark_query_for_the_daemon(
    spark, week: pa.Table, metr_la: dict, tmp_path: Path
) -> None:
    import asyncio

    from fjords.errors import QueryError
    from gateway.spark.supervisor import SparkQueries

    t0 = week["time"][0].as_py()
    write_segment(
        tmp_path / "archive", week.filter(pa.compute.less(week["time"], t0 + DAY)), 0, gateway="gw"
    )
    async with SparkQueries(
        SparkConfig(master="local[2]", shuffle_partitions=2),
        archive_root=tmp_path / "archive",
        state_dir=tmp_path / "state",
        tables={"incidents": str(metr_la["incidents"])},
        result_bound=50,
        poll_s=0.2,
        trigger="0 seconds",
    ) as queries:
        with pytest.raises(QueryError, match="unknown column"):
            await queries.start("bad", "SELECT nope FROM traffic")
        st = await queries.start("q1", Q1)
        assert st["engine"] == "spark" and st["columns"][0] == "segment"
        buf = queries.results("q1")
        async with asyncio.timeout(120):
            while buf.total < 100:
                await asyncio.wait_for(buf.changed.wait(), 60)
                buf.changed.clear()
        st = queries.status("q1")
        assert st["state"] == "running" and st["restarts"] == 0
        # the fleet's per-gateway counts pass through the supervisor (GET /queries/{id})
        assert st["late_readings_dropped"] == {"gw": 0} and st["segments_refused"] == 0
        # Q1 gives 2 segments x a day of 15-minute windows: a buffer of 50 drops the oldest
        assert st["results_buffered"] == 50 and st["results_dropped"] == st["results_total"] - 50
        assert all(r["segment"] in ("S05", "S14") for r in buf.drain())
        await queries.stop("q1")
        with pytest.raises(KeyError):
            queries.status("q1")


async def test_post_queries_with_engine_spark_streams_results_over_http(
    spark, week: pa.Table, metr_la: dict, tmp_path: Path
) -> None:
    import asyncio

    import aiohttp

    from gateway.config import Config
    from gateway.daemon import Gateway

    t0 = week["time"][0].as_py()
    write_segment(
        tmp_path / "archive", week.filter(pa.compute.less(week["time"], t0 + DAY)), 0, gateway="gw"
    )
    cfg = Config()
    cfg.http.port = 0
    cfg.archive.dir = str(tmp_path / "archive")
    cfg.state_dir = str(tmp_path / "state")
    cfg.spark = {"master": "local[2]", "shuffle_partitions": 2}
    async with Gateway(cfg) as gw:
        host, port = await gw.start_http()
        async with aiohttp.ClientSession(f"http://{host}:{port}") as http:
            r = await http.post("/queries", json={"sql": Q1, "engine": "spark"})
            # Answered before the job starts: 202, starting; GET follows it to running.
            assert r.status == 202, await r.text()
            body = await r.json()
            qid = body["id"]
            assert body["shape"] == "spark streaming job" and body["state"] == "starting"
            assert body["spark"]["state"] == "starting" and body["error"] is None

            async def described() -> dict:
                return await (await http.get(f"/queries/{qid}")).json()

            body = await async_eventually(
                described, lambda b: b["state"] != "starting", timeout=120
            )
            assert body["state"] == "running", body
            assert body["columns"][0] == "segment"
            assert [q["id"] for q in (await (await http.get("/queries")).json())["queries"]] == [
                qid
            ]
            async with http.get(f"/queries/{qid}/results", params={"format": "ndjson"}) as res:
                rows = []
                async with asyncio.timeout(120):
                    async for line in res.content:
                        if line.strip():
                            rows.append(json.loads(line))
                        if len(rows) >= 20:
                            break
            assert all(r["segment"] in ("S05", "S14") for r in rows)
            body = await (await http.get(f"/queries/{qid}")).json()
            assert body["spark"]["state"] in ("running", "idle")
            assert body["spark"]["late_readings_dropped"] == {"gw": 0}
            text = await (await http.get("/metrics")).text()
            assert (
                f'fjords_spark_late_readings_dropped_total{{gateway="gw",query="{qid}"}} 0.0'
                in (text)
            )
            assert (await http.delete(f"/queries/{qid}")).status == 204
            assert (await http.get(f"/queries/{qid}")).status == 404


async def test_a_spark_query_on_a_plain_mqtt_stream_reads_that_streams_archive(
    spark,
    tmp_path: Path,
    broker: Broker,
) -> None:
    """A plain MQTT device stream is archived like traffic, and a Spark query on it reads its own
    stream's archive (not traffic's); a join of it with traffic reads both archives."""
    import asyncio

    import aiohttp

    from gateway.config import Config, MqttColumnConfig, MqttConfig, MqttStreamConfig
    from gateway.daemon import Gateway

    def config() -> Config:
        cfg = Config()
        cfg.http.port = 0
        cfg.archive.dir = str(tmp_path / "archive")
        cfg.state_dir = str(tmp_path / "state")
        cfg.spark = {"master": "local[2]", "shuffle_partitions": 2}
        cfg.mqtt = MqttConfig(
            url=f"mqtt://{broker.host}:{broker.port}",
            streams=[
                MqttStreamConfig(
                    name="climate",
                    topic="tele/+/SENSOR",
                    sensor_id_level=1,
                    columns={"temperature": MqttColumnConfig(path="T", type="float")},
                )
            ],
        )
        return cfg

    async with Gateway(config()) as gw:
        schema = gw.fjord.streams["climate"].info.schema
        assert schema.names[:2] == ("time", "sensor") and "temperature" in schema.names
        for k in range(40):  # two sensors, 20 s of readings a second apart
            row = {"time": 1_000.0 + k // 2, "sensor": f"s{k % 2}", "temperature": float(k)}
            gw.fjord.push("climate", tuple(row.get(n) for n in schema.names))
        for sensor in ("s0", "s1"):  # past Spark's watermark delay: the first windows close
            row = {"time": 1_600.0, "sensor": sensor, "temperature": 0.0}
            gw.fjord.push("climate", tuple(row.get(n) for n in schema.names))
        traffic = gw.fjord.streams["traffic"].info.schema
        for t, speed in ((1_000.5, 50.0), (1_010.5, 60.0), (1_600.0, 70.0)):  # station s0
            row = {"time": t, "station": "s0", "speed": speed, "segment": "S0"}
            gw.fjord.push("traffic", tuple(row.get(n) for n in traffic.names))
    sql = (
        "SELECT sensor, COUNT(*) AS n, MAX(temperature) AS hi "
        "FROM climate [RANGE 10 SECONDS] GROUP BY sensor"
    )
    async with Gateway(config()) as gw:
        host, port = await gw.start_http()
        async with aiohttp.ClientSession(f"http://{host}:{port}") as http:
            r = await http.post("/queries", json={"sql": sql, "engine": "spark"})
            assert r.status == 202, await r.text()
            qid = (await r.json())["id"]
            rows: list[dict] = []
            async with http.get(f"/queries/{qid}/results", params={"format": "ndjson"}) as res:
                async with asyncio.timeout(180):
                    async for line in res.content:
                        if line.strip():
                            rows.append(json.loads(line))
                        if len(rows) >= 4:  # two windows closed for both sensors
                            break
            # A join of this stream with traffic: each stream read from its own archive.
            join = (
                "SELECT c.temperature, t.speed FROM climate AS c [RANGE 10 SECONDS], "
                "traffic AS t [RANGE 10 SECONDS] WHERE c.sensor = t.station"
            )
            r = await http.post("/queries", json={"sql": join, "engine": "spark"})
            assert r.status == 202, await r.text()
            jid = (await r.json())["id"]
            pairs: list[dict] = []
            async with http.get(f"/queries/{jid}/results", params={"format": "ndjson"}) as res:
                async with asyncio.timeout(180):
                    async for line in res.content:
                        if line.strip():
                            pairs.append(json.loads(line))
                        if len(pairs) >= 21:
                            break
    got = sorted((r["window_start"], r["sensor"], r["n"], r["hi"]) for r in rows)
    assert got == [
        (1000.0, "s0", 10, 18.0),
        (1000.0, "s1", 10, 19.0),
        (1010.0, "s0", 10, 38.0),
        (1010.0, "s1", 10, 39.0),
    ]
    # s0's readings (temperature k for even k at 1000 + k/2) with the s0 traffic sample of
    # their 10-second window, and the two at 1600.
    want = [(float(k), 50.0 if k < 20 else 60.0) for k in range(0, 40, 2)] + [(0.0, 70.0)]
    assert sorted((r["temperature"], r["speed"]) for r in pairs) == sorted(want)


async def test_a_spark_query_that_cannot_start_is_reported_failed(spark, tmp_path: Path) -> None:
    """The archive has no segment yet: the POST still answers at once (202, starting); the
    query then reports `failed` with Spark's reason and its stream says why; a restart tries
    it again (it could not start: not a failure of the query). A bad query is still a 400."""
    import asyncio

    import aiohttp

    from gateway.config import Config
    from gateway.daemon import Gateway

    (tmp_path / "archive").mkdir(parents=True)
    cfg = Config()
    cfg.http.port = 0
    cfg.simulation = None
    cfg.archive.dir = str(tmp_path / "archive")
    cfg.state_dir = str(tmp_path / "state")
    cfg.spark = {"master": "local[2]", "shuffle_partitions": 2}
    async with Gateway(cfg) as gw:
        host, port = await gw.start_http()
        async with aiohttp.ClientSession(f"http://{host}:{port}") as http:
            r = await http.post(
                "/queries", json={"sql": "SELECT nope FROM traffic", "engine": "spark"}
            )
            assert r.status == 400 and "nope" in (await r.json())["error"]
            r = await http.post("/queries", json={"sql": Q1, "engine": "spark"})
            assert r.status == 202, await r.text()
            body = await r.json()
            qid = body["id"]
            assert body["state"] == "starting"
            async with http.get(f"/queries/{qid}/results", params={"format": "ndjson"}) as res:
                async with asyncio.timeout(120):
                    last = [json.loads(line) async for line in res.content if line.strip()]
            assert "no readable Parquet segments" in last[-1]["error"]
            body = await (await http.get(f"/queries/{qid}")).json()
            assert body["state"] == "failed" and "no readable Parquet" in body["error"]
            # Deleting a query while its job starts answers at once; the job is stopped after.
            r = await http.post("/queries", json={"sql": Q1, "engine": "spark"})
            other = (await r.json())["id"]
            assert (await http.delete(f"/queries/{other}")).status == 204
            assert (await http.get(f"/queries/{other}")).status == 404
    async with Gateway(cfg) as gw:
        assert gw.query_ids() == [qid]
        d = await async_eventually(
            lambda: gw.describe_query(qid), lambda d: d["state"] != "starting", timeout=120
        )
        assert d["state"] == "failed" and "no readable Parquet" in d["error"]


# -- top-k per window with COUNT(DISTINCT), over the METR-LA week ----------------------------

Q_TOPK = (
    "SELECT segment, AVG(speed) AS avg_speed, COUNT(DISTINCT station) AS stations "
    "FROM traffic [RANGE 15 MINUTES] GROUP BY segment ORDER BY avg_speed LIMIT 5"
)


def test_the_5_slowest_segments_every_15_minutes_on_fjord_spark_batch_and_streaming(
    spark, metr_la: dict, week: pa.Table, tmp_path: Path
) -> None:
    fjord = _of(_fjord(metr_la, [Q_TOPK]), 0)
    per_window: dict[float, list[dict]] = {}
    for r in fjord:
        per_window.setdefault(r["window_end"], []).append(r)
    assert len(per_window) > 500
    assert all(len(rs) == 5 for rs in per_window.values())
    assert all(
        [r["avg_speed"] for r in rs] == sorted(r["avg_speed"] for r in rs)
        for rs in per_window.values()
    )
    archive = tmp_path / "archive"
    _archive(archive, week, segments=7)
    _, df = run_archive(spark, Q_TOPK, archive)
    _assert_same(result_rows(df), fjord)

    sink = ParquetSink(str(tmp_path / "out"))
    job = StreamingJob(
        spark,
        Q_TOPK,
        archive,
        sink=sink,
        checkpoint=tmp_path / "ckpt",
        available_now=True,
        max_files_per_trigger=4,
    )
    job.start()
    job.await_termination()
    streamed = result_rows(sink.read(spark).drop("batch"))
    assert streamed
    last = max(r["window_end"] for r in streamed)  # later windows wait for more data
    _assert_same(streamed, [r for r in fjord if r["window_end"] <= last])


Q_UNION = (
    "SELECT time, station, speed FROM traffic WHERE speed < 5 "
    "UNION ALL SELECT time, segment, speed FROM traffic WHERE speed >= 70 AND segment = 'S05'"
)


def test_a_union_all_on_fjord_spark_batch_and_streaming(
    spark, metr_la: dict, week: pa.Table, tmp_path: Path
) -> None:
    """UNION ALL: the Fjord's rows (in time order) on Spark batch and as a streaming job; a
    union of windowed aggregates is refused by a streaming job, saying where it runs."""
    from gateway.spark.compiler import SparkUnsupportedError

    fjord = _of(_fjord(metr_la, [Q_UNION]), 0)
    assert fjord and [r["time"] for r in fjord] == sorted(r["time"] for r in fjord)
    assert {r["station"] for r in fjord} >= {"S05"} and len({r["station"] for r in fjord}) > 2
    archive = tmp_path / "archive"
    _archive(archive, week, segments=7)
    _, df = run_archive(spark, Q_UNION, archive)
    _assert_same(result_rows(df), fjord)

    sink = ParquetSink(str(tmp_path / "out"))
    job = StreamingJob(
        spark,
        Q_UNION,
        archive,
        sink=sink,
        checkpoint=tmp_path / "ckpt",
        available_now=True,
        max_files_per_trigger=4,
    )
    job.start()
    job.await_termination()
    _assert_same(result_rows(sink.read(spark).drop("batch")), fjord)

    windowed = f"{Q1} UNION ALL {Q1.replace('AVG', 'MAX')}"
    job = StreamingJob(spark, windowed, archive, sink=sink, checkpoint=tmp_path / "ckpt2")
    with pytest.raises(SparkUnsupportedError, match="batch job only"):
        job.start()


Q_JOIN = (
    "SELECT a.segment, COUNT(*) AS pairs, MAX(b.speed - a.speed) AS gap "
    "FROM traffic AS a [RANGE 15 MINUTES], traffic AS b [RANGE 15 MINUTES] "
    "WHERE a.segment = b.segment AND a.station != b.station AND a.speed < b.speed "
    "GROUP BY a.segment"
)


def test_a_stream_stream_join_on_fjord_spark_batch_and_streaming(
    spark, small: dict, tmp_path: Path
) -> None:
    """Structured Streaming runs the join with a watermark on each side and the window
    equality as its time constraint (its state is cleaned), then the windowed aggregate."""
    out = io.StringIO()
    run_file(str(small["readings"]), [Q_JOIN], stations=str(small["stations"]), out=out)
    fjord = _of([json.loads(x) for x in out.getvalue().splitlines()], 0)
    assert len(fjord) > 5
    archive = tmp_path / "archive"
    _archive(archive, trace_table(small["readings"], small["stations"]), segments=4)
    _, df = run_archive(spark, Q_JOIN, archive)
    _assert_same(result_rows(df), fjord)

    sink = ParquetSink(str(tmp_path / "out"))
    job = StreamingJob(
        spark,
        Q_JOIN,
        archive,
        sink=sink,
        checkpoint=tmp_path / "ckpt",
        available_now=True,
        max_files_per_trigger=1,
    )
    job.start()
    job.await_termination()
    assert job.status()["state"] == "stopped"
    streamed = result_rows(sink.read(spark).drop("batch"))
    assert streamed
    last = max(r["window_end"] for r in streamed)  # later windows wait for more data
    _assert_same(streamed, [r for r in fjord if r["window_end"] <= last])
