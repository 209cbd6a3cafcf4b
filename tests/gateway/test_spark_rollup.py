"""GROUP BY ROLLUP / GROUPING SETS and GROUPING() on Spark: Spark's GROUPING SETS over each
window's finest groups, batch (`replay --engine spark`) and Structured Streaming, the same rows
as the Fjord's over the differential tests' METR-LA subsample (NULL where a column is rolled
up, GROUPING() values, column names and order)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fjords.schema import Schema
from gateway.spark.batch import result_rows
from gateway.spark.compiler import SparkUnsupportedError, compile_query
from gateway.spark.sinks import ParquetSink
from gateway.spark.sources import trace_table, write_segment
from gateway.spark.streaming import StreamingJob
from tests.fjords.test_differential import Data, assert_same_rows, build_data, fjord_rows

ROLLUP = (
    "SELECT segment, station, AVG(speed) AS avg_speed, COUNT(*) AS n, GROUPING(station) AS g "
    "FROM traffic [RANGE 1 HOUR] WHERE segment IN ('S05', 'S14') GROUP BY ROLLUP(segment, station)"
)
SETS = (
    "SELECT station, segment, MIN(speed) AS lo, MAX(speed) AS hi, SUM(speed) AS total, "
    "GROUPING(segment) AS gs, GROUPING(station) AS gt FROM traffic [RANGE 1 HOUR SLIDE 30 MINUTES] "
    "WHERE segment IN ('S04', 'S22', 'S39') "
    "GROUP BY GROUPING SETS ((segment, station), (station), ())"
)
TOP = (
    "SELECT segment, COUNT(*) AS n, AVG(speed) AS a FROM traffic [RANGE 2 HOURS] "
    "GROUP BY ROLLUP(segment) HAVING GROUPING(segment) = 1 OR AVG(speed) < 62 "
    "ORDER BY GROUPING(segment) DESC, a LIMIT 3"
)
FAST = (  # a key that is an expression, and GROUPING() of it
    "SELECT segment, speed > 60 AS fast, COUNT(*) AS n, GROUPING(speed > 60) AS gf "
    "FROM traffic [RANGE 3 HOURS] WHERE segment IN ('S06', 'S25') "
    "GROUP BY ROLLUP(segment, speed > 60)"
)
PLAIN = (
    "SELECT segment, GROUPING(segment) AS g, COUNT(*) AS n FROM traffic [RANGE 6 HOURS] "
    "GROUP BY segment"
)
TRAFFIC = Schema(
    [("time", "float"), ("station", "str"), ("speed", "float"), ("segment", "str")], time="time"
)


def test_rollup_compiles_with_the_fjords_columns() -> None:
    q = compile_query(ROLLUP, {"traffic": TRAFFIC})
    assert q.columns == ("segment", "station", "avg_speed", "n", "g", "window_start", "window_end")
    assert q.query.grouping_sets == ((0, 1), (0,), ())
    assert compile_query(PLAIN, {"traffic": TRAFFIC}).columns[:2] == ("segment", "g")


@pytest.mark.parametrize(
    ("sql", "words"),
    [
        ("SELECT segment, AVG(speed) FROM traffic GROUP BY ROLLUP(segment)", "window"),
        (
            "SELECT segment, COUNT(DISTINCT station) FROM traffic [RANGE 1 HOUR] "
            "GROUP BY ROLLUP(segment)",
            "cannot be rolled up",
        ),
    ],
)
def test_what_the_fjord_refuses_spark_refuses_alike(sql: str, words: str) -> None:
    """The one analysis: the Fjord's refusals and messages, not Spark's."""
    from fjords.errors import QueryError

    with pytest.raises(QueryError, match=words) as e:
        compile_query(sql, {"traffic": TRAFFIC})
    assert not isinstance(e.value, SparkUnsupportedError)


# -- on Spark --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Data:
    return build_data(tmp_path_factory.mktemp("metr-la-sample"))


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


@pytest.mark.needs_spark
def test_replay_on_spark_gives_the_fjords_rows(
    spark, data: Data, capsys: pytest.CaptureFixture[str]
) -> None:
    queries = [ROLLUP, SETS, TOP, FAST, PLAIN]
    got = _replay(data, queries, capsys)
    for sql, rows in zip(queries, got, strict=True):
        want = fjord_rows(data, sql)
        assert want
        assert_same_rows(rows, want, sql)
    rollup = got[0]
    # station rows, segment rows (station NULL) and the total (both NULL), in every hour
    assert {(r["segment"] is None, r["station"] is None, r["g"]) for r in rollup} == {
        (False, False, 0),
        (False, True, 1),
        (True, True, 1),
    }
    assert {(r["gs"], r["gt"]) for r in got[1]} == {(0, 0), (1, 0), (1, 1)}
    # ORDER BY GROUPING(segment) DESC: each window's total row first
    first: dict[float, dict] = {}
    for r in got[2]:
        first.setdefault(r["window_end"], r)
    assert all(r["segment"] is None for r in first.values())
    assert {r["gf"] for r in got[3]} == {0, 1} and {r["g"] for r in got[4]} == {0}


@pytest.mark.needs_spark
def test_a_streaming_rollup_gives_the_fjords_rows(spark, data: Data, tmp_path: Path) -> None:
    """Each window's finest groups come out of the stateful aggregate in one micro-batch
    (append mode), where its levels are merged: a streaming ROLLUP is exact."""
    archive = tmp_path / "archive"
    table = trace_table(data.readings, data.stations)
    step = -(-table.num_rows // 2)
    for i in range(2):
        write_segment(archive, table.slice(i * step, step), i, gateway="gw")
    sink = ParquetSink(str(tmp_path / "out"))
    job = StreamingJob(
        spark,
        ROLLUP,
        archive,
        sink=sink,
        checkpoint=tmp_path / "ckpt",
        available_now=True,
        max_files_per_trigger=1,
    )
    job.start()
    job.await_termination()
    streamed = result_rows(sink.read(spark).drop("batch"))
    want = fjord_rows(data, ROLLUP)
    last = max(r["window_end"] for r in streamed)  # later windows wait for more data
    assert last >= max(r["window_end"] for r in want) - 3600
    assert_same_rows(streamed, [r for r in want if r["window_end"] <= last], "streaming ROLLUP")
