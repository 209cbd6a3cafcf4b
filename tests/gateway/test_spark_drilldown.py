"""GROUP BY a DRILLDOWN b on Spark: the levels by Spark's GROUPING SETS, the HAVING as a pass
flag per row and the pruning as a semi-join per level, batch (`fjords-gateway replay --engine
spark`) and Structured Streaming; the same rows as the Fjord's and as brute force over a few
hours of METR-LA's segments S02 and S11."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from fjords.engine import Engine
from fjords.errors import QueryError
from fjords.runtime.fjord import Fjord
from fjords.trace import Trace
from gateway.spark.batch import result_rows
from gateway.spark.compiler import SparkUnsupportedError, compile_query
from gateway.spark.sinks import ParquetSink
from gateway.spark.sources import trace_table, write_segment
from gateway.spark.streaming import StreamingJob
from tests.fjords.test_differential import Data, assert_same_rows
from tests.support import shared_file

EXAMPLE = (
    "SELECT segment, station, AVG(speed) AS avg_speed FROM traffic [RANGE 1 HOUR] "
    "WHERE segment IN ('S02','S11') GROUP BY segment DRILLDOWN station "
    "HAVING avg_speed(segment) < 60 AND avg_speed(station) < 55"
)
PLAIN = EXAMPLE.split(" HAVING ")[0] + " HAVING AVG(speed) < 58"
T0 = 1330588800  # the trace's first timestamp
HOURS = 12
SEGMENTS = ("S02", "S11")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Data:
    """The first HOURS hours of the stations of SEGMENTS (the trace is in time order)."""
    folder = tmp_path_factory.mktemp("metr-la-drilldown")
    with shared_file("data/metr-la/stations.csv").open(newline="") as f:
        stations = [s for s in csv.DictReader(f) if s["segment"] in SEGMENTS]
    picked = {s["station"] for s in stations}
    with (folder / "stations.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, ["station", "latitude", "longitude", "segment"])
        w.writeheader()
        w.writerows(stations)
    with (
        shared_file("data/metr-la/readings.csv").open(newline="") as src,
        (folder / "readings.csv").open("w", newline="") as dst,
    ):
        r, w2 = csv.reader(src), csv.writer(dst)
        w2.writerow(next(r))
        for time, station, speed in r:
            if int(time) >= T0 + HOURS * 3600:
                break
            if station in picked:
                w2.writerow([time, station, speed])
    none = folder / "none.csv"  # the differential tests' tables, unused here
    return Data(folder / "readings.csv", folder / "stations.csv", none, none, [], [], [])


def fjord_rows(data: Data, sql: str) -> list[dict]:
    """The query's rows as `python -m fjords` runs the trace file (NDJSON rows)."""
    from fjords.__main__ import run_file

    out = io.StringIO()
    run_file(str(data.readings), [sql], stations=str(data.stations), out=out)
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    return [{k: v for k, v in r.items() if k != "query"} for r in rows]


UPSIDE_DOWN = (
    "SELECT station, segment, COUNT(*) FROM traffic [RANGE 1 HOUR]\n"
    "GROUP BY station DRILLDOWN segment"
)


@pytest.mark.parametrize(
    ("sql", "words", "pos"),
    [
        (
            EXAMPLE.replace("avg_speed(station)", "avg_speed(lane)"),
            "has no level lane; its levels are segment, station",
            (1, 189),
        ),
        (
            "SELECT segment, COUNT(*) FROM traffic [RANGE 1 HOUR]\n"
            "GROUP BY ROLLUP(segment) DRILLDOWN station",
            "DRILLDOWN cannot be combined with ROLLUP",
            (2, 26),
        ),
        (UPSIDE_DOWN, "segment is not a finer level of station", (2, 28)),
    ],
)
def test_what_the_fjord_refuses_spark_refuses_alike(
    data: Data, sql: str, words: str, pos: tuple[int, int]
) -> None:
    """The one analysis: the Fjord's messages and positions, the stations file telling the
    hierarchy as it does for the Fjord."""
    known = Trace(data.readings, data.stations)
    sensors = {"traffic": (known.sensor_field, known.attributes)}
    for compile_ in (
        lambda: compile_query(sql, {"traffic": known.schema}, sensors=sensors),
        lambda: _fjord(data).add_query(sql),
    ):
        with pytest.raises(QueryError) as e:
            compile_()
        assert not isinstance(e.value, SparkUnsupportedError)
        assert words in str(e.value)
        assert (e.value.line, e.value.column) == pos, str(e.value)  # type: ignore[attr-defined]


def _fjord(data: Data) -> Engine:
    known = Trace(data.readings, data.stations)
    f = Engine(Fjord())
    f.fjord.add_stream("traffic", known.schema, sensor_field=known.sensor_field)
    f.fjord.catalog.streams["traffic"].sensors = known.attributes  # type: ignore[assignment]
    return f


def _frame(data: Data) -> pd.DataFrame:
    df = pd.read_csv(data.readings, dtype={"station": str}).merge(
        pd.read_csv(data.stations, dtype={"station": str}), on="station"
    )
    return df.assign(window_start=(df.time // 3600) * 3600.0)


def _brute_force(
    df: pd.DataFrame, seg_ok: Callable[[float], bool], st_ok: Callable[[float], bool]
) -> dict[tuple, float]:
    """Segment rows meeting their condition; station rows only under those, meeting theirs."""
    want: dict[tuple, float] = {}
    passed = set()
    for (seg, ws), g in df.groupby(["segment", "window_start"]):
        if seg_ok(v := g.speed.mean()):
            want[(seg, None, ws)] = v
            passed.add((seg, ws))
    for (seg, st, ws), g in df.groupby(["segment", "station", "window_start"]):
        if (seg, ws) in passed and st_ok(v := g.speed.mean()):
            want[(seg, st, ws)] = v
    return want


def _close(rows: list[dict], want: dict[tuple, float]) -> None:
    got = {(r["segment"], r["station"], r["window_start"]): r["avg_speed"] for r in rows}
    assert len(got) == len(rows)
    assert got.keys() == want.keys()
    for k, w in want.items():
        assert got[k] == pytest.approx(w, rel=1e-9), k


def _replay(data: Data, queries: list[str], capsys: pytest.CaptureFixture[str]) -> list[list[dict]]:
    """The rows of `fjords-gateway replay --engine spark`, per query."""
    from gateway.cli import main

    args = ["replay", "--readings", str(data.readings), "--stations", str(data.stations)]
    for sql in queries:
        args += ["--query", sql]
    capsys.readouterr()
    assert main([*args, "--engine", "spark", "--master", "local[2]"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    return [
        [{k: v for k, v in r.items() if k != "query"} for r in rows if r["query"] == i]
        for i in range(len(queries))
    ]


def test_the_sample_prunes_stations_by_their_segment(data: Data) -> None:
    """Both levels have rows, and stations meeting their own condition sit under failing
    segments (so the pruning shows)."""
    df = _frame(data)
    want = _brute_force(df, lambda v: v < 60, lambda v: v < 55)
    assert any(st is None for _, st, _ in want) and any(st is not None for _, st, _ in want)
    seg = {k: g.speed.mean() for k, g in df.groupby(["segment", "window_start"])}
    orphans = [
        k
        for k, g in df.groupby(["segment", "station", "window_start"])
        if g.speed.mean() < 55 and seg[(k[0], k[2])] >= 60
    ]
    assert orphans


@pytest.mark.needs_spark
def test_replay_on_spark_gives_the_brute_force_and_the_fjords_rows(
    spark, data: Data, capsys: pytest.CaptureFixture[str]
) -> None:
    example, plain = _replay(data, [EXAMPLE, PLAIN], capsys)
    df = _frame(data)
    assert list(example[0]) == ["segment", "station", "avg_speed", "window_start", "window_end"]
    _close(example, _brute_force(df, lambda v: v < 60, lambda v: v < 55))
    _close(plain, _brute_force(df, lambda v: v < 58, lambda v: v < 58))  # at every level
    assert_same_rows(example, fjord_rows(data, EXAMPLE), "DRILLDOWN")
    assert_same_rows(plain, fjord_rows(data, PLAIN), "DRILLDOWN, plain HAVING")
    from gateway.cli import main

    args = ["replay", "--readings", str(data.readings), "--stations", str(data.stations)]
    assert main([*args, "--query", UPSIDE_DOWN, "--engine", "spark"]) != 0
    assert "segment is not a finer level of station" in capsys.readouterr().err


@pytest.mark.needs_spark
def test_a_streaming_drilldown_gives_the_fjords_rows(spark, data: Data, tmp_path: Path) -> None:
    """Each window's finest groups come out of the stateful aggregate in one micro-batch
    (append mode), where its levels are built and pruned: a streaming DRILLDOWN is exact."""
    archive = tmp_path / "archive"
    table = trace_table(data.readings, data.stations)
    step = -(-table.num_rows // 2)
    for i in range(2):
        write_segment(archive, table.slice(i * step, step), i, gateway="gw")
    sink = ParquetSink(str(tmp_path / "out"))
    job = StreamingJob(
        spark,
        EXAMPLE,
        archive,
        sink=sink,
        checkpoint=tmp_path / "ckpt",
        available_now=True,
        max_files_per_trigger=1,
    )
    job.start()
    job.await_termination()
    streamed = result_rows(sink.read(spark).drop("batch"))
    want = fjord_rows(data, EXAMPLE)
    last = max(r["window_end"] for r in streamed)  # later windows wait for more data
    assert last >= max(r["window_end"] for r in want) - 3600
    assert_same_rows(streamed, [r for r in want if r["window_end"] <= last], "streaming DRILLDOWN")
