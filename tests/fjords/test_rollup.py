"""GROUP BY ROLLUP(...) / GROUPING SETS (...) and GROUPING(col) on the Fjord: one aggregate at
the finest level, the coarser levels merged from its finished groups at each window close;
exact against a brute-force computation over the METR-LA trace."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pandas as pd
import pytest

from fjords.__main__ import run_file
from fjords.compile.sql.parser import parse
from fjords.engine import Engine
from fjords.errors import QueryError
from fjords.runtime.fjord import Fjord
from fjords.schema import Schema
from fjords.tables import Table
from tests.support import ROOT, shared_file

SEGMENTS = ("S02", "S11")
ROLLUP = (
    "SELECT segment, station, AVG(speed) AS avg_speed, GROUPING(station) AS g "
    "FROM traffic [RANGE 1 HOUR] WHERE segment IN ('S02', 'S11') "
    "GROUP BY ROLLUP(segment, station)"
)
SETS = (
    "SELECT segment, station, COUNT(*) AS n, MIN(speed) AS lo, MAX(speed) AS hi, "
    "SUM(speed) AS total FROM traffic [RANGE 1 HOUR] WHERE segment IN ('S02', 'S11') "
    "GROUP BY GROUPING SETS ((station, segment), (segment), ())"
)
# the plain GROUP BY a ROLLUP's finest level shares (AVG merges from the SUM and COUNT beside it)
PLAIN = (
    "SELECT segment, station, AVG(speed) AS avg_speed, SUM(speed) AS s, COUNT(speed) AS c "
    "FROM traffic [RANGE 1 HOUR] WHERE segment IN ('S02', 'S11') GROUP BY segment, station"
)

SCHEMA = Schema(
    [("time", "float"), ("station", "str"), ("speed", "float"), ("segment", "str")], time="time"
)


def _engine(fuse: bool = True) -> Engine:
    f = Engine(Fjord(), fuse=fuse)
    f.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    lim = Schema([("segment", "str"), ("limit_kmh", "float")], time=None)
    f.fjord.add_table("limits", Table("limits", lim, [("a", 50.0)]))
    return f


# -- the dialect --------------------------------------------------------------------------


def test_rollup_is_its_grouping_sets_over_the_finest_level() -> None:
    q = parse("SELECT a, b FROM t [RANGE 1 HOUR] GROUP BY ROLLUP(a, b, c)")
    assert [k.name for k in q.group_by] == ["a", "b", "c"]  # type: ignore[union-attr]
    assert q.grouping_sets == ((0, 1, 2), (0, 1), (0,), ())
    q = parse("SELECT a FROM t [RANGE 1 HOUR] GROUP BY GROUPING SETS ((b, a), (a), (a), ())")
    assert [k.name for k in q.group_by] == ["b", "a"]  # type: ignore[union-attr]
    assert q.grouping_sets == ((0, 1), (1,), ())
    assert parse("SELECT a FROM t [RANGE 1 HOUR] GROUP BY a").grouping_sets == ()
    # the words are still names elsewhere
    assert parse("SELECT rollup, grouping, sets FROM t").select[1].expr.name == "grouping"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("sql", "words", "pos"),
    [
        (
            "SELECT segment, GROUPING(speed) FROM traffic [RANGE 1 HOUR]\nGROUP BY ROLLUP(segment)",
            "speed is not a GROUP BY column",
            (1, 26),
        ),
        (
            "SELECT segment, COUNT(*) FROM traffic [RANGE 1 HOUR] WHERE GROUPING(segment) = 0 "
            "GROUP BY ROLLUP(segment)",
            "not in WHERE",
            (1, 60),
        ),
        (
            "SELECT segment, COUNT(DISTINCT station) FROM traffic [RANGE 1 HOUR] "
            "GROUP BY ROLLUP(segment)",
            "cannot be rolled up",
            (1, 17),
        ),
        (
            "SELECT segment, AVG(speed) FROM traffic GROUP BY ROLLUP(segment)",
            "need a window",
            (1, 41),
        ),
        (
            "SELECT segment, AVG(speed) FROM traffic [RANGE 1 HOUR]\n  GROUP BY ROLLUP(segment, lane)",
            "lane",
            (2, 28),
        ),
        (
            "SELECT s.segment, AVG(s.speed) FROM traffic AS s [RANGE 1 HOUR], limits AS l "
            "WHERE l.segment = s.segment GROUP BY ROLLUP(s.segment)",
            "not supported with a join",
            (1, 106),
        ),
        (
            "SELECT GROUPING(segment) FROM traffic",
            "needs GROUP BY",
            (1, 8),
        ),
    ],
)
def test_refusals_say_where(sql: str, words: str, pos: tuple[int, int]) -> None:
    with pytest.raises(QueryError) as e:
        _engine().add_query(sql)
    assert words in str(e.value)
    assert (e.value.line, e.value.column) == pos, str(e.value)  # type: ignore[attr-defined]


def test_grouping_of_a_plain_group_by_is_zero() -> None:
    f = _engine()
    rq = f.add_query(
        "SELECT segment, GROUPING(segment) FROM traffic [RANGE 1 MINUTE] GROUP BY segment"
    )
    assert rq.columns[:2] == ("segment", "grouping_segment")
    out: list[tuple] = []
    rq.sink.add_batch_callback(out.extend)
    f.fjord.push("traffic", (1.0, "x", 3.0, "a"))
    f.fjord.end_of_stream()
    f.fjord.run_until_idle()
    assert out == [("a", 0, 0.0, 60.0)]


ROWS = [
    (float(t), f"st{i}", float(10 + (t * 7 + i * 13) % 60), "ab"[i % 2])
    for t in range(0, 360, 20)
    for i in range(4)
]


@pytest.mark.parametrize(
    "window", ["[RANGE 1 MINUTE]", "[RANGE 2 MINUTES SLIDE 1 MINUTE]", "[ROWS 8 SLIDE 4]"]
)
@pytest.mark.parametrize("where", ["", "WHERE segment IN ('a', 'c')"])
def test_fused_and_unfused_give_the_rows_of_one_group_by_per_level(window: str, where: str) -> None:
    """Fused (whole windows handed over) and unfused (rows queued), alone and sharing the
    finest aggregate with a plain GROUP BY (WHERE on the groups moved after it): the rows of
    one plain GROUP BY per level."""
    rollup = (
        f"SELECT segment, station, AVG(speed), MAX(speed), GROUPING(segment) FROM traffic "
        f"{window} {where} GROUP BY ROLLUP(segment, station) HAVING COUNT(*) > 1"
    )
    plain = (
        f"SELECT segment, station, AVG(speed), SUM(speed), COUNT(speed), MAX(speed) "
        f"FROM traffic {window} {where} GROUP BY segment, station"
    )
    levels = [
        f"SELECT {sel}, AVG(speed), MAX(speed), {g} FROM traffic {window} {where} "
        f"{group} HAVING COUNT(*) > 1"
        for sel, g, group in (
            ("segment, station", "0", "GROUP BY segment, station"),
            ("segment, NULL", "0", "GROUP BY segment"),
            ("NULL, NULL", "1", ""),
        )
    ]

    def run(queries: list[str], fuse: bool) -> list[list[tuple]]:
        f = _engine(fuse)
        outs: list[list[tuple]] = []
        for i, sql in enumerate(queries):
            rq = f.add_query(sql, query_id=f"q{i}")
            outs.append([])
            rq.sink.add_batch_callback(outs[-1].extend)
        for r in ROWS:
            f.fjord.push("traffic", r)
            f.fjord.run_until_idle()
        f.fjord.end_of_stream()
        f.fjord.run_until_idle()
        assert not f.fjord.failed
        return [sorted(o, key=repr) for o in outs]

    want = sorted((r for rows in run(levels, True) for r in rows), key=repr)
    assert any(r[0] is None and r[1] is None for r in want)  # the total rows
    for fuse in (True, False):
        assert run([rollup], fuse) == [want]
        got, plain_rows = run([rollup, plain], fuse)
        assert got == want
        assert plain_rows == run([plain], fuse)[0]


# -- against brute force over the METR-LA trace --------------------------------------------


@pytest.fixture(scope="module")
def metr_la() -> dict:
    readings = shared_file("data/metr-la/readings.csv")
    stations = shared_file("data/metr-la/stations.csv")
    out = io.StringIO()
    fjord = run_file(str(readings), [ROLLUP, SETS, PLAIN], stations=str(stations), out=out)
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    df = pd.read_csv(readings, dtype={"station": str}).merge(
        pd.read_csv(stations, dtype={"station": str}), on="station"
    )
    df = df[df.segment.isin(SEGMENTS)]
    df = df.assign(window_start=(df.time // 3600) * 3600.0)
    return {"rows": rows, "df": df, "fjord": fjord, "readings": readings, "stations": stations}


def _of(rows: list[dict], i: int) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "query"} for r in rows if r["query"] == i]


def _levels(df: pd.DataFrame, levels: list[list[str]], agg: dict) -> dict[tuple, tuple]:
    """Brute force: each level's groups per hour, recomputed from the readings."""
    want: dict[tuple, tuple] = {}
    for keys in levels:
        for k, g in df.groupby([*keys, "window_start"]):
            key = dict(zip([*keys, "window_start"], k, strict=True))
            ident = (key.get("segment"), key.get("station"), key["window_start"])
            want[ident] = tuple(f(g.speed) for f in agg.values())
    return want


def _close(got: dict[tuple, tuple], want: dict[tuple, tuple]) -> None:
    assert got.keys() == want.keys()
    for k, w in want.items():
        assert got[k] == pytest.approx(w, rel=1e-9), k


def test_rollup_gives_station_segment_and_total_rows_per_hour(metr_la: dict) -> None:
    rows = _of(metr_la["rows"], 0)
    assert list(rows[0]) == ["segment", "station", "avg_speed", "g", "window_start", "window_end"]
    got = {(r["segment"], r["station"], r["window_start"]): (r["avg_speed"],) for r in rows}
    assert len(got) == len(rows)
    levels = [["segment", "station"], ["segment"], []]
    df = metr_la["df"].assign(all=0)
    want = _levels(df, [lv or ["all"] for lv in levels], {"avg": pd.Series.mean})
    want = {(s if s != 0 else None, st, ws): v for (s, st, ws), v in want.items()}
    _close(got, want)
    for r in rows:  # GROUPING(station): 1 on the segment and total rows
        assert r["g"] == (r["station"] is None)
        assert r["window_end"] == r["window_start"] + 3600
    hours = 7 * 24
    stations = metr_la["df"].station.nunique()
    assert len(rows) == hours * (stations + len(SEGMENTS) + 1)


def test_grouping_sets_give_their_levels_only(metr_la: dict) -> None:
    rows = _of(metr_la["rows"], 1)
    got = {
        (r["segment"], r["station"], r["window_start"]): (r["n"], r["lo"], r["hi"], r["total"])
        for r in rows
    }
    df = metr_la["df"].assign(all=0)
    agg = {"n": len, "lo": pd.Series.min, "hi": pd.Series.max, "sum": pd.Series.sum}
    want = _levels(df, [["segment", "station"], ["segment"], ["all"]], agg)
    want = {(s if s != 0 else None, st, ws): v for (s, st, ws), v in want.items()}
    _close(got, want)


def test_rollup_shares_the_plain_group_by_of_its_finest_level(metr_la: dict) -> None:
    """One aggregate at the finest level serves the ROLLUP and the plain GROUP BY (the
    GROUPING SETS query has other aggregates: its own); the plain rows are the finest ones."""
    fjord = metr_la["fjord"]
    assert len(fjord._shared) == 2
    users = sorted(sorted(s.users) for s in fjord._shared.values())
    assert users == [["0", "2"], ["1"]]
    finest = {
        (r["segment"], r["station"], r["window_start"]): r["avg_speed"]
        for r in _of(metr_la["rows"], 0)
        if r["station"] is not None
    }
    plain = {
        (r["segment"], r["station"], r["window_start"]): r["avg_speed"]
        for r in _of(metr_la["rows"], 2)
    }
    assert plain == finest


def test_explain_shows_the_levels() -> None:
    plan = _engine().explain(ROLLUP)
    text = json.dumps(plan)
    assert "rollup_finish" in text
    assert '"(segment, station)", "(segment)", "()"' in text


def test_python_m_fjords_prints_rows_with_nulls(metr_la: dict) -> None:
    q = ROLLUP.replace("ROLLUP(segment, station)", "ROLLUP(segment)").replace(
        "segment, station, AVG", "segment, AVG"
    )
    q = q.replace(", GROUPING(station) AS g", "").replace("[RANGE 1 HOUR]", "[RANGE 1 DAY]")
    out = subprocess.run(
        [sys.executable, "-m", "fjords", "--trace", str(metr_la["readings"])]
        + ["--stations", str(metr_la["stations"]), "--query", q],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=120,
    ).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    df = metr_la["df"].assign(window_start=(metr_la["df"].time // 86400) * 86400.0)
    want = {(s, ws): g.speed.mean() for (s, ws), g in df.groupby(["segment", "window_start"])}
    want |= {(None, ws): g.speed.mean() for ws, g in df.groupby("window_start")}
    got = {(r["segment"], r["window_start"]): r["avg_speed"] for r in rows}
    assert got.keys() == want.keys()
    assert all(got[k] == pytest.approx(w, rel=1e-9) for k, w in want.items())


@pytest.mark.parametrize("window", ["[RANGE 1 MINUTE]", "[ROWS 5000 SLIDE 5000]"])
def test_a_window_of_more_groups_than_a_batch_is_merged_whole(window: str) -> None:
    """Unfused, a window's rows reach the rollup in several batches: its levels are merged
    once the window is whole, never from a part of it."""
    sql = (
        f"SELECT segment, station, COUNT(*), SUM(speed) FROM traffic {window} "
        "GROUP BY ROLLUP(segment, station)"
    )
    rows = [(float(t), f"st{i}", 1.0, f"S{i % 3}") for t in (0, 70) for i in range(5000)]
    got = []
    for fuse in (True, False):
        f = _engine(fuse)
        rq = f.add_query(sql)
        out: list[tuple] = []
        rq.sink.add_batch_callback(out.extend)
        for r in rows:
            f.fjord.push("traffic", r)
        f.fjord.run_until_idle()
        f.fjord.end_of_stream()
        f.fjord.run_until_idle()
        got.append(sorted(out, key=repr))
    assert got[0] == got[1]
    totals = [r for r in got[0] if r[0] is None]
    assert [r[2:4] for r in totals] == [(5000, 5000.0), (5000, 5000.0)]


def test_a_snapshot_answers_a_rollup_from_cells_and_readings_alike() -> None:
    from tests.fjords.test_snapshot import ROWS as FLEET
    from tests.fjords.test_snapshot import setup

    sql = (
        "SELECT segment, COUNT(*) AS n, COUNT(speed) AS c, AVG(speed) AS a, "
        "GROUPING(segment) AS g FROM traffic [RANGE 30 MINUTES] GROUP BY ROLLUP(segment)"
    )
    _, cells, readings = setup(FLEET)
    a, b = cells.answer(sql), readings.answer(sql)
    assert a.path == "cells" and b.path == "readings"
    assert [r[0] for r in a.rows] == [r[0] for r in b.rows] == ["S0", "S1", "S2", None]
    for x, y in zip(a.rows, b.rows, strict=True):
        assert x[0] == y[0] and x[1:] == pytest.approx(y[1:], rel=1e-12)
    *segments, total = b.rows
    assert total[1] == sum(r[1] for r in segments) and total[4] == 1
    assert total[3] == pytest.approx(sum(r[2] * r[3] for r in segments) / total[2], rel=1e-12)


def _rows_of(sql: str) -> list[tuple]:
    f = _engine()
    rq = f.add_query(sql)
    out: list[tuple] = []
    rq.sink.add_batch_callback(out.extend)
    for r in ROWS[:40]:  # 4 stations of segments a, b; 20 s apart: 4 windows of a minute
        f.fjord.push("traffic", r)
        f.fjord.run_until_idle()
    f.fjord.end_of_stream()
    f.fjord.run_until_idle()
    assert not f.fjord.failed
    return out


def test_grouping_in_having_order_by_limit_and_union_all() -> None:
    w = "FROM traffic [RANGE 1 MINUTE]"
    coarse = _rows_of(
        f"SELECT segment, station, COUNT(*) {w} GROUP BY ROLLUP(segment, station) "
        "HAVING GROUPING(station) = 1"
    )
    assert {(r[0], r[1], r[2]) for r in coarse if r[3] == 0.0} == {
        ("a", None, 6),
        ("b", None, 6),
        (None, None, 12),
    }
    top = _rows_of(
        f"SELECT segment, COUNT(*) AS n {w} GROUP BY ROLLUP(segment) ORDER BY n DESC, 1 LIMIT 2"
    )
    assert [r[:2] for r in top if r[2] == 0.0] == [(None, 12), ("a", 6)]
    both = _rows_of(
        f"SELECT segment, COUNT(*) {w} GROUP BY ROLLUP(segment) "
        f"UNION ALL SELECT segment, COUNT(*) {w} GROUP BY segment"
    )
    first = sorted((r for r in both if r[2] == 0.0), key=repr)
    assert first == sorted(
        [("a", 6, 0.0, 60.0)] * 2 + [("b", 6, 0.0, 60.0)] * 2 + [(None, 12, 0.0, 60.0)], key=repr
    )
