"""GROUP BY a DRILLDOWN b on the Fjord (SQL_MS): the levels (a), (a, b) from the ROLLUP
machinery, HAVING with parameterized measures per level, and a row that fails its level's
condition removing its rows at the finer levels; exact against brute force over METR-LA."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pandas as pd
import pytest

from fjords.__main__ import run_file
from fjords.compile.sql import ast
from fjords.compile.sql.parser import parse
from fjords.engine import Engine
from fjords.errors import QueryError
from fjords.runtime.fjord import Fjord
from fjords.schema import Schema
from fjords.tables import Table
from gateway.replay import replay_trace
from tests.support import ROOT, shared_file

EXAMPLE = (
    "SELECT segment, station, AVG(speed) AS avg_speed FROM traffic [RANGE 1 HOUR] "
    "WHERE segment IN ('S02','S11') GROUP BY segment DRILLDOWN station "
    "HAVING avg_speed(segment) < 60 AND avg_speed(station) < 55"
)
SCHEMA = Schema(
    [("time", "float"), ("station", "str"), ("speed", "float"), ("segment", "str")], time="time"
)
# station -> its segment (a stations table: station determines segment)
SENSORS = {"st0": "a", "st1": "a", "st2": "b", "st3": "b"}


def _engine(fuse: bool = True) -> Engine:
    f = Engine(Fjord(), fuse=fuse)
    f.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    f.fjord.catalog.streams["traffic"].sensors = {k: {"segment": v} for k, v in SENSORS.items()}
    return f


# -- the dialect --------------------------------------------------------------------------


def test_drilldown_is_its_levels_without_a_total() -> None:
    q = parse("SELECT a FROM t [RANGE 1 HOUR] GROUP BY a DRILLDOWN b DRILLDOWN c")
    assert isinstance(q, ast.Query)
    assert [k.name for k in q.group_by] == ["a", "b", "c"]  # type: ignore[union-attr]
    assert q.grouping_sets == ((0,), (0, 1), (0, 1, 2))
    assert q.drilldown == (None, None, None) and q.having is None
    assert parse("SELECT a FROM t [RANGE 1 HOUR] GROUP BY a").drilldown is None  # type: ignore[union-attr]
    assert parse("SELECT drilldown FROM t").select[0].expr.name == "drilldown"  # type: ignore[union-attr]


def test_parameterized_measures_become_each_levels_condition() -> None:
    q = parse(EXAMPLE.replace("< 55", "< 55 AND COUNT(*) > 3"))
    assert isinstance(q, ast.Query)
    assert q.drilldown is not None
    assert [ast.to_sql(c) for c in q.drilldown if c is not None] == [
        "COUNT(*) > 3 AND AVG(speed) < 60",
        "COUNT(*) > 3 AND AVG(speed) < 55",
    ]
    assert ast.to_sql(q.having) == (  # type: ignore[arg-type]
        "GROUPING(segment) = 0 AND GROUPING(station) = 1 AND COUNT(*) > 3 AND AVG(speed) < 60 "
        "OR GROUPING(station) = 0 AND COUNT(*) > 3 AND AVG(speed) < 55"
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
            EXAMPLE.replace("station, AVG", "station AS st, AVG").replace(
                "avg_speed(station)", "st(station)"
            ),
            "st is station, not an aggregate",
            (1, 185),
        ),
        (EXAMPLE.replace("avg_speed(segment)", "speed(segment)"), "not a SELECT alias", (1, 151)),
        (
            EXAMPLE.replace("avg_speed(segment) < 60 AND", "avg_speed(segment) < ")[:-4],
            "measures of two levels",
            (1, 151),
        ),
        (
            "SELECT segment, COUNT(*) FROM traffic [RANGE 1 HOUR]\n"
            "GROUP BY ROLLUP(segment) DRILLDOWN station",
            "DRILLDOWN cannot be combined with ROLLUP",
            (2, 26),
        ),
        (
            "SELECT segment, COUNT(*) FROM traffic [RANGE 1 HOUR] "
            "GROUP BY GROUPING SETS ((segment), ()) DRILLDOWN station",
            "cannot be combined with GROUPING SETS",
            (1, 93),
        ),
        (
            "SELECT segment, COUNT(*) FROM traffic [RANGE 1 HOUR] GROUP BY segment, time "
            "DRILLDOWN station",
            "descends from one GROUP BY column",
            (1, 77),
        ),
        (
            "SELECT station, segment, COUNT(*) FROM traffic [RANGE 1 HOUR]\n"
            "  GROUP BY station DRILLDOWN segment",
            "segment is not a finer level of station",
            (2, 30),
        ),
        (
            "SELECT segment, COUNT(*) FROM traffic [RANGE 1 HOUR] "
            "GROUP BY segment DRILLDOWN segment",
            "segment is already a level",
            (1, 71),
        ),
        (
            "SELECT segment, avg_speed(segment) FROM traffic [RANGE 1 HOUR] GROUP BY segment",
            "unknown function avg_speed",
            (1, 17),
        ),
    ],
)
def test_refusals_say_where(sql: str, words: str, pos: tuple[int, int]) -> None:
    with pytest.raises(QueryError) as e:
        _engine().add_query(sql)
    assert words in str(e.value)
    assert (e.value.line, e.value.column) == pos, str(e.value)  # type: ignore[attr-defined]


# speeds per station per minute: st0 slow, st1 fast (segment a middling), st2, st3 slow (b slow)
ROWS = [
    (float(t), st, speed, SENSORS[st])
    for t in range(0, 240, 20)
    for st, speed in (("st0", 40.0 + t % 7), ("st1", 75.0), ("st2", 30.0), ("st3", 52.0 + t % 5))
]


def _run(sql: str, fuse: bool) -> list[tuple]:
    f = _engine(fuse)
    rq = f.add_query(sql)
    out: list[tuple] = []
    rq.sink.add_batch_callback(out.extend)
    for r in ROWS:
        f.fjord.push("traffic", r)
        f.fjord.run_until_idle()
    f.fjord.end_of_stream()
    f.fjord.run_until_idle()
    assert not f.fjord.failed
    return sorted(out, key=repr)


@pytest.mark.parametrize("fuse", [True, False])
def test_a_failing_row_removes_its_descendants(fuse: bool) -> None:
    """st0 (slow) lies under segment a, which fails its condition: st0 is not in the
    result though it meets its own; under b (passing) the slow stations only."""
    rows = _run(
        "SELECT segment, station, AVG(speed) AS v FROM traffic [RANGE 1 MINUTE] "
        "GROUP BY segment DRILLDOWN station HAVING v(segment) < 50 AND v(station) < 55",
        fuse,
    )
    levels = {(r[0], r[1]) for r in rows}
    assert levels == {("b", None), ("b", "st2"), ("b", "st3")}
    assert len(rows) == 4 * 3  # four minutes
    # a plain condition holds at every level: segment a (avg 58.x) fails it, so st0 goes too
    rows = _run(
        "SELECT segment, station, COUNT(*), AVG(speed) FROM traffic [RANGE 1 MINUTE] "
        "GROUP BY segment DRILLDOWN station HAVING AVG(speed) < 50",
        fuse,
    )
    assert {(r[0], r[1]) for r in rows} == {("b", None), ("b", "st2")}
    # without HAVING: both levels, no total row
    rows = _run(
        "SELECT segment, station, COUNT(*) FROM traffic [RANGE 1 MINUTE] "
        "GROUP BY segment DRILLDOWN station",
        fuse,
    )
    assert {(r[0], r[1], r[2]) for r in rows} == {("a", None, 6), ("b", None, 6)} | {
        (s, st, 3) for st, s in SENSORS.items()
    }


def test_explain_shows_the_levels_and_the_pruning() -> None:
    plan = _engine().explain(EXAMPLE)
    text = json.dumps(plan)
    assert "rollup_finish" in text and "drilldown+having+select" in text
    assert '"levels": ["(segment)", "(segment, station)"]' in text
    assert '{"level": "(segment)", "having": "AVG(speed) < 60"}' in text
    assert '{"level": "(segment, station)", "having": "AVG(speed) < 55"}' in text
    assert "removes its rows at the finer levels" in text


def test_queries_differing_in_thresholds_show_their_own() -> None:
    """Queries that differ only in numbers share a parse (`ShapeCache`): each level's
    condition gets the query's own values, like its HAVING."""
    f = _engine()
    f.explain(EXAMPLE)
    text = json.dumps(f.explain(EXAMPLE.replace("< 60", "< 61").replace("< 55", "< 57")))
    assert '"having": "AVG(speed) < 61"' in text and '"having": "AVG(speed) < 57"' in text


def test_emit_changes_is_refused_with_a_drilldown() -> None:
    with pytest.raises(QueryError, match="ROLLUP or GROUPING SETS"):
        _engine().add_query(
            "SELECT segment, station, COUNT(*) FROM traffic [RANGE 1 HOUR] "
            "GROUP BY segment DRILLDOWN station EMIT CHANGES EVERY 10 MINUTES"
        )


# -- against brute force over the METR-LA trace --------------------------------------------


def _python_m_fjords(sql: str) -> list[dict]:
    readings = shared_file("data/metr-la/readings.csv")
    stations = shared_file("data/metr-la/stations.csv")
    out = subprocess.run(
        [sys.executable, "-m", "fjords", "--trace", str(readings)]
        + ["--stations", str(stations), "--query", sql],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=120,
    ).stdout
    return [json.loads(line) for line in out.splitlines()]


@pytest.fixture(scope="module")
def hours() -> pd.DataFrame:
    readings = shared_file("data/metr-la/readings.csv")
    stations = shared_file("data/metr-la/stations.csv")
    df = pd.read_csv(readings, dtype={"station": str}).merge(
        pd.read_csv(stations, dtype={"station": str}), on="station"
    )
    df = df[df.segment.isin(("S02", "S11"))]
    return df.assign(window_start=(df.time // 3600) * 3600.0)


def _brute_force(df: pd.DataFrame, seg_ok: object, st_ok: object) -> dict[tuple, float]:
    """Segment rows meeting their condition; station rows only under those, meeting theirs."""
    want: dict[tuple, float] = {}
    passed = set()
    for (seg, ws), g in df.groupby(["segment", "window_start"]):
        v = g.speed.mean()
        if seg_ok(v):  # type: ignore[operator]
            want[(seg, None, ws)] = v
            passed.add((seg, ws))
    for (seg, st, ws), g in df.groupby(["segment", "station", "window_start"]):
        v = g.speed.mean()
        if (seg, ws) in passed and st_ok(v):  # type: ignore[operator]
            want[(seg, st, ws)] = v
    return want


def _close(rows: list[dict], want: dict[tuple, float]) -> None:
    got = {(r["segment"], r["station"], r["window_start"]): r["avg_speed"] for r in rows}
    assert len(got) == len(rows)
    assert got.keys() == want.keys()
    for k, w in want.items():
        assert got[k] == pytest.approx(w, rel=1e-9), k


def test_the_example_through_python_m_fjords(hours: pd.DataFrame) -> None:
    rows = _python_m_fjords(EXAMPLE)
    assert list(rows[0]) == [
        "query",
        "segment",
        "station",
        "avg_speed",
        "window_start",
        "window_end",
    ]
    want = _brute_force(hours, lambda v: v < 60, lambda v: v < 55)
    # the pruning matters here: stations meeting their own condition under failing segments
    seg = {(s, ws): g.speed.mean() for (s, ws), g in hours.groupby(["segment", "window_start"])}
    orphans = [
        k
        for k, g in hours.groupby(["segment", "station", "window_start"])
        if g.speed.mean() < 55 and seg[(k[0], k[2])] >= 60
    ]
    assert orphans and want and any(st is None for _, st, _ in want)
    _close(rows, want)


def test_a_plain_having_holds_at_every_level(hours: pd.DataFrame) -> None:
    sql = EXAMPLE.split(" HAVING ")[0] + " HAVING AVG(speed) < 58"
    want = _brute_force(hours, lambda v: v < 58, lambda v: v < 58)
    _close(_python_m_fjords(sql), want)


UPSIDE_DOWN = (
    "SELECT station, segment, COUNT(*) FROM traffic [RANGE 1 HOUR]\n"
    "GROUP BY station DRILLDOWN segment"
)


def test_the_stations_table_tells_the_hierarchy() -> None:
    """Each station has one segment in the stations table: segment is not finer than
    station (python -m fjords and fjords-gateway replay alike)."""
    readings = shared_file("data/metr-la/readings.csv")
    stations = shared_file("data/metr-la/stations.csv")
    with pytest.raises(QueryError) as e:
        run_file(str(readings), [UPSIDE_DOWN], stations=str(stations), out=io.StringIO())
    assert "segment is not a finer level of station" in str(e.value)
    assert (e.value.line, e.value.column) == (2, 28)  # type: ignore[attr-defined]


async def test_replay_refuses_an_upside_down_drilldown() -> None:
    readings = shared_file("data/metr-la/readings.csv")
    stations = shared_file("data/metr-la/stations.csv")
    with pytest.raises(QueryError, match="not a finer level of station"):
        await replay_trace(str(readings), [UPSIDE_DOWN], stations=str(stations), out=io.StringIO())


@pytest.mark.parametrize("fuse", [True, False])
def test_a_shared_finest_aggregate_prunes_alike(fuse: bool) -> None:
    """Beside a plain GROUP BY of its finest level (one aggregate for both, the WHERE on the
    groups moved after it) a drill-down gives the rows it gives alone."""
    drill = (
        "SELECT segment, station, AVG(speed) AS v FROM traffic [RANGE 1 MINUTE] "
        "WHERE segment IN ('a', 'b') GROUP BY segment DRILLDOWN station "
        "HAVING v(segment) < 50 AND v(station) < 55"
    )
    plain = (
        "SELECT segment, station, AVG(speed), SUM(speed), COUNT(speed) FROM traffic "
        "[RANGE 1 MINUTE] GROUP BY segment, station"
    )
    f = _engine(fuse)
    outs: list[list[tuple]] = []
    for i, sql in enumerate((drill, plain)):
        rq = f.add_query(sql, query_id=f"q{i}")
        outs.append([])
        rq.sink.add_batch_callback(outs[-1].extend)
    assert len(f.fjord._shared) == 1
    for r in ROWS:
        f.fjord.push("traffic", r)
        f.fjord.run_until_idle()
    f.fjord.end_of_stream()
    f.fjord.run_until_idle()
    assert sorted(outs[0], key=repr) == _run(drill, fuse)
    assert len(outs[1]) == 4 * 4


def test_a_snapshot_prunes_from_cells_and_readings_alike() -> None:
    from tests.fjords.test_snapshot import ROWS as FLEET
    from tests.fjords.test_snapshot import setup

    sql = (
        "SELECT segment, station, COUNT(*) AS n, AVG(speed) AS a FROM traffic "
        "[RANGE 30 MINUTES] GROUP BY segment DRILLDOWN station "
        "HAVING a(segment) < 39.5 AND a(station) < 40"
    )
    _, cells, readings = setup(FLEET)
    a, b = cells.answer(sql), readings.answer(sql)
    assert a.path == "cells" and b.path == "readings"
    assert [r[:2] for r in a.rows] == [r[:2] for r in b.rows]
    segments = {r[0] for r in a.rows if r[1] is None}
    assert segments and segments < {"S0", "S1", "S2"}
    stations = [r for r in a.rows if r[1] is not None]
    assert stations and all(r[0] in segments and r[3] < 40 for r in stations)


@pytest.mark.parametrize("window", ["[RANGE 2 MINUTES SLIDE 1 MINUTE]", "[ROWS 8 SLIDE 4]"])
def test_sliding_and_rows_windows_prune_alike_fused_or_not(window: str) -> None:
    sql = (
        f"SELECT segment, station, AVG(speed) AS v FROM traffic {window} "
        "GROUP BY segment DRILLDOWN station HAVING v(segment) < 50 AND v(station) < 55"
    )
    fused = _run(sql, True)
    assert fused == _run(sql, False)
    assert {(r[0], r[1]) for r in fused} == {("b", None), ("b", "st2"), ("b", "st3")}


# -- what knows the hierarchy: declared, a table's functional dependency, the stations table --

RIGHT_WAY = "SELECT segment, station, COUNT(*) FROM traffic [RANGE 1 HOUR]\nGROUP BY segment DRILLDOWN station"


def _bare(*tables: Table) -> Engine:
    """A traffic stream nothing is known about but what the test declares or the tables say."""
    f = Engine(Fjord())
    f.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    for t in tables:
        f.fjord.add_table(t.name, t)
    return f


def _refusal(f: Engine, sql: str) -> QueryError:
    with pytest.raises(QueryError) as e:
        f.add_query(sql)
    return e.value


def test_a_declared_hierarchy_refuses_a_step_up_and_accepts_a_step_down() -> None:
    f = _bare()
    f.fjord.catalog.add_hierarchy("traffic", ["segment", "station"], "[[hierarchies]] #1")
    e = _refusal(f, UPSIDE_DOWN)
    assert "DRILLDOWN segment: segment is not a finer level of station" in str(e)
    assert "[[hierarchies]] #1 declares the hierarchy segment > station" in str(e)
    assert "GROUP BY segment DRILLDOWN station" in str(e)
    assert (e.line, e.column) == (2, 28)  # type: ignore[attr-defined]
    f.add_query(RIGHT_WAY)


def test_each_step_of_a_longer_drilldown_is_checked_at_its_child() -> None:
    schema = Schema(
        [("time", "float"), ("region", "str"), ("segment", "str"), ("station", "str")],
        time="time",
    )
    f = Engine(Fjord())
    f.fjord.add_stream("roads", schema, sensor_field="station")
    f.fjord.catalog.add_hierarchy("roads", ("region", "segment", "station"), "the test")
    sql = "SELECT COUNT(*) FROM roads [RANGE 1 HOUR] GROUP BY region DRILLDOWN station DRILLDOWN segment"
    e = _refusal(f, sql)
    assert "segment is not a finer level of station" in str(e)
    assert "the test declares the hierarchy region > segment > station" in str(e)
    assert (e.line, e.column) == (1, sql.rindex("segment") + 1)  # type: ignore[attr-defined]
    f.add_query(
        sql.replace("DRILLDOWN station DRILLDOWN segment", "DRILLDOWN segment DRILLDOWN station")
    )
    # region then station skips a level: still finer, accepted
    f.add_query(sql.replace(" DRILLDOWN segment", ""))


def test_a_table_row_pair_shows_a_child_under_two_parents() -> None:
    lanes = Table(
        "lanes",
        Schema([("station", "str"), ("segment", "str"), ("lane", "int")], time=None),
        [("st0", "a", 1), ("st1", "a", 1), ("st0", "b", 2)],
    )
    e = _refusal(_bare(lanes), RIGHT_WAY)
    assert str(e).startswith(
        "DRILLDOWN station: station is not a finer level of segment (station 'st0' lies under "
        "segment 'a' and 'b' in table lanes, its row 1 and row 3)"
    ), str(e)
    assert "drill down from the coarser level" not in str(e)  # neither is finer
    assert (e.line, e.column) == (2, 28)  # type: ignore[attr-defined]


def test_a_table_where_each_child_has_one_parent_tells_the_direction() -> None:
    places = Table(
        "places",
        Schema([("station", "str"), ("segment", "str")], time=None),
        [("st0", "a"), ("st1", "a"), ("st2", "b"), (None, "c")],
    )
    f = _bare(places)
    f.add_query(RIGHT_WAY)
    e = _refusal(f, UPSIDE_DOWN)
    assert "segment 'a' lies under station 'st0' and 'st1' in table places" in str(e)
    assert "drill down from the coarser level: GROUP BY segment DRILLDOWN station" in str(e)


def test_where_nothing_knows_the_levels_a_drilldown_is_accepted() -> None:
    unrelated = Table(
        "speeds", Schema([("speed", "float"), ("segment", "str")], time=None), [(1.0, "a")]
    )
    f = _bare(unrelated)
    f.add_query(UPSIDE_DOWN)
    f.add_query(RIGHT_WAY)
    # expressions are no column of a hierarchy
    f.add_query(
        "SELECT COUNT(*) FROM traffic [RANGE 1 HOUR] GROUP BY station DRILLDOWN COALESCE(segment, 'none')"
    )


def test_the_stations_table_names_the_two_sensors() -> None:
    e = _refusal(_engine(), UPSIDE_DOWN)
    assert "segment 'a' lies under station 'st0' and 'st1' in the stations table" in str(e)


@pytest.mark.parametrize(
    ("stream", "levels", "words"),
    [
        ("trafic", ["segment", "station"], "unknown stream 'trafic'; known: traffic"),
        ("traffic", ["segment"], "at least two levels"),
        ("traffic", ["segment", "lane"], "'lane' is not a column of the stream"),
        ("traffic", ["segment", "station", "segment"], "'segment' is a level twice"),
    ],
)
def test_a_hierarchy_the_catalog_cannot_hold_is_refused(
    stream: str, levels: list[str], words: str
) -> None:
    with pytest.raises(QueryError, match="^entry 3: .*" + words.replace("(", r"\(")):
        _bare().fjord.catalog.add_hierarchy(stream, levels, "entry 3")


def test_python_m_fjords_table_tells_the_hierarchy(tmp_path) -> None:
    """`--table`: a table whose rows break station -> segment refuses the drill-down."""
    readings = tmp_path / "readings.csv"
    readings.write_text("time,station,speed,segment\n0,st0,50,a\n")
    lanes = tmp_path / "lanes.csv"
    lanes.write_text("station,segment\nst0,a\nst1,a\nst0,b\n")
    with pytest.raises(QueryError) as e:
        run_file(str(readings), [RIGHT_WAY], tables=[("lanes", str(lanes))], out=io.StringIO())
    assert "station 'st0' lies under segment 'a' and 'b' in table lanes" in str(e.value)
    assert (e.value.line, e.value.column) == (2, 28)  # type: ignore[attr-defined]
