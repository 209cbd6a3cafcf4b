"""Compiling queries for Spark: what it accepts and the errors it gives (no JVM needed)."""

from __future__ import annotations

import argparse

import pytest

from fjords.errors import QueryError, QuerySyntaxError
from fjords.schema import Schema
from gateway.spark.cli import add_commands, spark_config
from gateway.spark.compiler import SparkUnsupportedError, compile_query
from gateway.spark.session import SparkConfig
from gateway.spark.sinks import ConsoleSink, ParquetSink, SparkMqttSink, sink_from_spec

TRAFFIC = Schema(
    [
        ("time", "int"),
        ("station", "str"),
        ("speed", "float"),
        ("latitude", "float"),
        ("longitude", "float"),
        ("segment", "str"),
    ],
    time="time",
)
INCIDENTS = Schema(
    [("incident_id", "str"), ("time", "int"), ("segment", "str"), ("description", "str")],
    time="time",
)
STREAMS = {"traffic": TRAFFIC}
TABLES = {"incidents": INCIDENTS}
Q2 = (
    "SELECT i.incident_id, i.description, s.segment, AVG(s.speed) AS avg_speed "
    "FROM traffic AS s [RANGE 30 MINUTES], incidents AS i "
    "WHERE i.segment = s.segment AND i.time >= NOW - 30 MINUTES AND i.time < NOW "
    "GROUP BY i.incident_id, i.description, s.segment HAVING AVG(s.speed) < 40"
)


def test_query2_compiles_to_a_windowed_join() -> None:
    q = compile_query(Q2, STREAMS, TABLES)
    assert q.columns == (
        "incident_id",
        "description",
        "segment",
        "avg_speed",
        "window_start",
        "window_end",
    )
    assert q.window == (1800.0, 1800.0)
    assert q.table == "incidents"
    b = q.bound  # the analysis both engines share
    assert [(s.name, t.name) for s, t in b.join_keys] == [("segment", "segment")]
    assert [r.name for r in b.needed] == ["segment"]  # partials are keyed by the join key only
    assert len(b.post_join) == 2  # the two conditions on NOW


def test_names_match_the_fjord() -> None:
    q = compile_query(
        "SELECT station, MAX(speed), COUNT(*) FROM traffic [RANGE 1 HOUR SLIDE 15 MINUTES] "
        "GROUP BY station",
        STREAMS,
    )
    assert q.columns == ("station", "max_speed", "count", "window_start", "window_end")
    assert q.window == (3600.0, 900.0)


def test_emit_every_sets_the_slide() -> None:
    q = compile_query(
        "SELECT AVG(speed) FROM traffic [RANGE 1 HOUR] EMIT EVERY 10 MINUTES", STREAMS
    )
    assert q.window == (3600.0, 600.0)


@pytest.mark.parametrize(
    ("sql", "words"),
    [
        ("SELECT AVG(speed) FROM traffic [ROWS 10] GROUP BY station", "ROWS windows"),
        ("SELECT AVG(speed) FROM traffic [RANGE 1 HOUR] SAMPLE PERIOD 1 SECOND", "SAMPLE PERIOD"),
        ("SELECT AVG(speed) FROM traffic [RANGE 1 HOUR] LIFETIME 30 DAYS", "LIFETIME"),
    ],
)
def test_unsupported_constructs_are_named(sql: str, words: str) -> None:
    with pytest.raises(SparkUnsupportedError, match=words):
        compile_query(sql, {**STREAMS, "traffic2": TRAFFIC}, TABLES)


@pytest.mark.parametrize(
    ("sql", "words"),
    [
        ("SELECT nope FROM traffic", "unknown column 'nope'"),
        ("SELECT segment FROM traffic, incidents", "ambiguous"),
        ("SELECT AVG(speed) FROM traffic GROUP BY station", "need a window"),
        ("SELECT * FROM nowhere", "unknown stream or table"),
        ("SELECT * FROM traffic EMIT EVERY 1 MINUTE", "EMIT EVERY"),
        ("SELECT spede FROM traffic", "did you mean 'speed'"),
        (
            "SELECT * FROM traffic AS a, traffic2 AS b WHERE a.station = b.station",
            "stream 'a' has no window",
        ),
        (
            "SELECT a.station FROM traffic AS a [RANGE 5 MINUTES], traffic2 AS b "
            "[RANGE 1 HOUR] WHERE a.station = b.station",
            "the windows differ",
        ),
        (
            "SELECT s.segment, SUM(i.time) FROM traffic AS s [RANGE 1 HOUR], incidents AS i "
            "WHERE i.segment = s.segment GROUP BY s.segment",
            "static-table columns",
        ),
    ],
)
def test_fjord_errors_come_through(sql: str, words: str) -> None:
    with pytest.raises(QueryError, match=words):
        compile_query(sql, {**STREAMS, "traffic2": TRAFFIC}, TABLES)


def test_a_join_of_two_streams_compiles_from_the_bound_query() -> None:
    q = compile_query(
        "SELECT a.station, b.speed AS other FROM traffic AS a [RANGE 5 MINUTES], "
        "traffic2 AS b [RANGE 5 MINUTES] WHERE a.station = b.station AND b.speed > 10",
        {**STREAMS, "traffic2": TRAFFIC},
    )
    assert q.stream == "traffic" and q.right_stream == "traffic2"
    assert q.columns == ("station", "other")
    assert q.bound.right is not None and len(q.bound.right.atoms) == 1


def test_syntax_errors_say_where() -> None:
    with pytest.raises(QuerySyntaxError) as e:
        compile_query("SELEC * FROM traffic", STREAMS)
    assert e.value.line == 1


def test_sink_specs() -> None:
    assert isinstance(sink_from_spec("console"), ConsoleSink)
    p = sink_from_spec("parquet:/tmp/x")
    assert isinstance(p, ParquetSink) and p.path == "/tmp/x"
    m = sink_from_spec("mqtt://broker:1884/fjords/q2")
    assert isinstance(m, SparkMqttSink)
    assert (m.host, m.port, m.topic) == ("broker", 1884, "fjords/q2")
    for bad in ("kafka:x", "parquet:", "mqtt://broker", "mqtt://h:port/t"):
        with pytest.raises(ValueError):
            sink_from_spec(bad)


def test_spark_config_from_the_gateway_config(tmp_path) -> None:
    cfg = tmp_path / "gateway.toml"
    cfg.write_text(
        '[http]\nport = 8080\n[spark]\nmaster = "spark://head:7077"\ndriver_memory = "2g"\n'
        '[spark.conf]\n"spark.executor.cores" = 2\n'
    )
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["spark", "run", "--query", "SELECT * FROM traffic", "--archive", "a", "--config", str(cfg)]
        + ["--conf", "spark.sql.shuffle.partitions=4"]
    )
    c = spark_config(args)
    assert c.master == "spark://head:7077"
    s = c.settings()
    assert s["spark.driver.memory"] == "2g"
    assert s["spark.executor.cores"] == "2"
    assert s["spark.sql.shuffle.partitions"] == "4"  # the command line wins
    with pytest.raises(ValueError, match="unknown"):
        SparkConfig.from_mapping({"mastr": "local"})


# -- a plain install (no pyspark): a 400 that says what to install ------------------------------


def _without_pyspark(monkeypatch: pytest.MonkeyPatch) -> None:
    """`import pyspark` raises ImportError, as on an install without the [spark] extra."""
    import sys

    for name in [m for m in sys.modules if m == "pyspark" or m.startswith("pyspark.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pyspark", None)


async def test_spark_engine_without_pyspark_is_a_400_naming_the_extra(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import aiohttp

    from gateway.config import Config
    from gateway.daemon import Gateway

    _without_pyspark(monkeypatch)
    cfg = Config()
    cfg.state_dir = str(tmp_path / "state")
    cfg.archive.dir = str(tmp_path / "archive")
    cfg.http.port = 0
    async with Gateway(cfg) as gw:
        host, port = await gw.start_http()
        async with aiohttp.ClientSession(f"http://{host}:{port}") as http:
            r = await http.post(
                "/queries", json={"sql": "SELECT * FROM traffic", "engine": "spark"}
            )
            body = await r.json()
            assert r.status == 400, body
            assert "pip install 'fjords-gateway[spark]'" in body["error"]
            assert (await http.get("/queries")).status == 200  # still serving
            assert (await (await http.get("/queries")).json())["queries"] == []
            # A planning error carries where it is and, for an unknown name, what exists.
            r = await http.post("/queries", json={"sql": "SELECT station,\n spede FROM traffic"})
            body = await r.json()
            assert r.status == 400 and (body["line"], body["column"]) == (2, 2), body
            assert "did you mean 'speed'" in body["error"] and "speed" in body["names"]


async def test_spark_engine_without_pyspark_raises_engine_unavailable(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fjords.errors import EngineUnavailable, QueryError
    from gateway.config import Config
    from gateway.daemon import Gateway

    _without_pyspark(monkeypatch)
    cfg = Config()
    cfg.state_dir = str(tmp_path / "state")
    cfg.archive.dir = None  # the missing package is named first, before any configuration
    async with Gateway(cfg) as gw:
        with pytest.raises(EngineUnavailable) as e:
            await gw.register("SELECT * FROM traffic", {"engine": "spark"})
        assert isinstance(e.value, QueryError) and e.value.extra == "spark"


def test_plot_without_matplotlib_names_the_plot_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util
    import sys
    from pathlib import Path

    # This tree's firmware-sim/cli.py (the installed `firmware_sim` may map to another checkout).
    path = Path(__file__).parents[2] / "firmware-sim" / "cli.py"
    spec = importlib.util.spec_from_file_location("firmware_sim_cli_under_test", path)
    assert spec is not None and spec.loader is not None
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(cli.UsageError, match=r"pip install 'fjords-gateway\[plot\]'"):
        cli._plot({}, "profile", __import__("pathlib").Path("x.png"))


def test_the_spark_and_plot_extras_are_declared_and_dev_includes_them() -> None:
    import tomllib
    from pathlib import Path

    meta = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    extras = meta["project"]["optional-dependencies"]
    assert any(r.startswith("pyspark") for r in extras["spark"])
    assert any(r.startswith("matplotlib") for r in extras["plot"])
    assert "fjords-gateway[spark,plot]" in extras["dev"]  # `make run` / `make test` install it


def test_a_union_compiles_from_the_same_bound_branches() -> None:
    """UNION ALL: the branches analysed once (fjords.compile.analysis.analyze_union), each compiled
    from its bound query; names from the first branch, integers among floats made floats;
    the sensor and scheduler clauses after the last branch refused as for one query."""
    from gateway.spark.compiler import SparkUnion

    q = compile_query(
        "SELECT station, speed AS v FROM traffic WHERE speed < 10 "
        "UNION ALL SELECT s.segment, 1 FROM traffic AS s, incidents AS i WHERE i.segment = s.segment",
        STREAMS,
        TABLES,
    )
    assert isinstance(q, SparkUnion)
    assert q.columns == ("station", "v") and q.bound.types == ("str", "float")
    assert [b.bound for b in q.branches] == list(q.bound.branches)
    assert [b.table for b in q.branches] == [None, "incidents"]
    with pytest.raises(SparkUnsupportedError, match="PRIORITY") as e:
        compile_query("SELECT * FROM traffic UNION ALL SELECT * FROM traffic PRIORITY 5", STREAMS)
    assert (e.value.line, e.value.column) == (1, 55)
    with pytest.raises(SparkUnsupportedError, match="ROWS"):
        compile_query(
            "SELECT COUNT(*) FROM traffic [RANGE 1 HOUR] UNION ALL "
            "SELECT COUNT(*) FROM traffic [ROWS 5]",
            STREAMS,
        )
