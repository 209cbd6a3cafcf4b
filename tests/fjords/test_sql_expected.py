"""The SQL users expect, on both engines with the same rows: ABS, ROUND, COALESCE, LEAST,
GREATEST, CASE, SELECT DISTINCT, COUNT(DISTINCT x), and ORDER BY ... LIMIT n per window.

Each query runs on the Fjord and is checked against a plain-Python oracle over the same rows;
the Spark half (the session `spark` fixture) requires the same rows as the Fjord.
"""

from __future__ import annotations

from collections import defaultdict
from decimal import ROUND_HALF_UP, Decimal

import pytest

from fjords.errors import ClauseError, QueryError, QueryTypeError
from tests.fjords.test_clauses import ROWS, STATIONS, _engine, _same, fjord_rows, spark_rows

SEGMENT = STATIONS  # station -> segment
LIMIT_KMH = {"S0": 50.0, "S1": 70.0}


def _windows(size: int = 1800) -> dict[float, list[tuple]]:
    out: dict[float, list[tuple]] = defaultdict(list)
    for r in ROWS:
        out[float(r[0] // size * size)].append(r)
    return out


def _half_up(v: float, digits: int = 0) -> float:
    return float(Decimal(repr(v)).quantize(Decimal(1).scaleb(-digits), ROUND_HALF_UP))


# -- scalar functions and CASE -------------------------------------------------------------

SCALAR = (
    "SELECT station, time, ABS(speed - 50) AS d, ROUND(speed / 7, 2) AS r, "
    "COALESCE(CASE WHEN speed > 60 THEN NULL ELSE speed END, -1.0) AS c, "
    "LEAST(speed, 30.0) AS lo, GREATEST(speed, 30.0, 40.0) AS hi, "
    "CASE WHEN speed >= 60 THEN 'fast' WHEN speed >= 30 THEN 'ok' ELSE 'slow' END AS k "
    "FROM traffic WHERE time < 600"
)


def _scalar_oracle() -> list[dict]:
    out = []
    for t, st, v, _ in ROWS:
        if t >= 600:
            continue
        out.append(
            {
                "station": st,
                "time": t,
                "d": abs(v - 50),
                "r": _half_up(v / 7, 2),
                "c": -1.0 if v > 60 else v,
                "lo": min(v, 30.0),
                "hi": max(v, 30.0, 40.0),
                "k": "fast" if v >= 60 else "ok" if v >= 30 else "slow",
            }
        )
    return out


ROUNDING = (
    "SELECT ROUND(2.5) AS a, ROUND(-2.5) AS b, ROUND(0.125, 2) AS c, ROUND(1234, -2) AS d, "
    "ROUND(speed) AS e, ABS(-3) AS f, COALESCE(NULL, NULL, 7) AS g, "
    "CASE WHEN NULL THEN 1 ELSE 2 END AS h, CASE WHEN speed < 0 THEN 1 END AS i "
    "FROM traffic WHERE time = 0 AND station = 'st0'"
)
ROUNDING_ROW = {
    "a": 3.0,
    "b": -3.0,
    "c": 0.13,
    "d": 1200,
    "e": 5.0,
    "f": 3,
    "g": 7,
    "h": 2,
    "i": None,
}


def test_scalar_functions_and_case_on_the_fjord() -> None:
    assert fjord_rows(SCALAR) == _scalar_oracle()
    assert fjord_rows(ROUNDING) == [ROUNDING_ROW]


MIXED = (
    "SELECT LEAST(speed, 30) AS lo, GREATEST(time, speed) AS hi, COALESCE(time, 1.5) AS c, "
    "CASE WHEN speed > 50 THEN 1 ELSE speed END AS k FROM traffic WHERE time < 120"
)


def test_integers_mixed_with_floats_give_floats_as_on_spark() -> None:
    rows = fjord_rows(MIXED)
    assert rows and all(isinstance(v, float) for r in rows for v in r.values())
    assert rows[2]["lo"] == 30.0 and rows[2]["hi"] == 31.0


def test_functions_work_inside_aggregates_groups_and_having() -> None:
    rows = fjord_rows(
        "SELECT CASE WHEN speed >= 40 THEN 'hi' ELSE 'lo' END AS band, "
        "ROUND(AVG(ABS(speed - 40)), 3) AS dev, COUNT(*) AS n FROM traffic [RANGE 30 MINUTES] "
        "GROUP BY CASE WHEN speed >= 40 THEN 'hi' ELSE 'lo' END HAVING COUNT(*) > 0"
    )
    expected = []
    for ws, rs in sorted(_windows().items()):
        for band in ("lo", "hi"):
            vs = [r[2] for r in rs if (r[2] >= 40) == (band == "hi")]
            if vs:
                dev = _half_up(sum(abs(v - 40) for v in vs) / len(vs), 3)
                expected.append((band, dev, len(vs), ws))
    got = sorted((r["band"], r["dev"], r["n"], r["window_start"]) for r in rows)
    assert got == sorted(expected)


@pytest.mark.parametrize(
    ("sql", "words"),
    [
        ("SELECT ABS(station) FROM traffic", "ABS takes a number"),
        ("SELECT ROUND(speed, speed) FROM traffic", "ROUND's digits must be a whole number"),
        ("SELECT COALESCE(speed, 'x') FROM traffic", "must be of one kind"),
        ("SELECT LEAST(speed, station) FROM traffic", "must be of one kind"),
        ("SELECT CASE WHEN speed > 1 THEN 1 ELSE 'x' END FROM traffic", "CASE results"),
        ("SELECT CASE WHEN speed THEN 1 END FROM traffic", "CASE WHEN needs a condition"),
        ("SELECT station FROM traffic WHERE ABS(speed)", "WHERE needs a condition"),
    ],
)
def test_functions_and_case_are_type_checked(sql: str, words: str) -> None:
    with pytest.raises(QueryTypeError, match=words) as e:
        _engine().add_query(sql)
    assert e.value.line == 1 and e.value.column is not None


# -- DISTINCT and COUNT(DISTINCT x) --------------------------------------------------------

DISTINCT = "SELECT DISTINCT segment FROM traffic [RANGE 30 MINUTES]"
COUNT_DISTINCT = (
    "SELECT segment, COUNT(DISTINCT station) AS stations, COUNT(*) AS n, AVG(speed) AS a "
    "FROM traffic [RANGE 30 MINUTES] GROUP BY segment"
)
COUNT_DISTINCT_JOIN = (
    "SELECT l.limit_kmh, COUNT(DISTINCT s.station) AS stations, MAX(s.speed) AS top "
    "FROM traffic AS s [RANGE 30 MINUTES], limits AS l WHERE s.segment = l.segment "
    "GROUP BY l.limit_kmh HAVING COUNT(DISTINCT s.station) > 0"
)
DISTINCT_ROWS = (
    "SELECT DISTINCT COUNT(*) AS n FROM traffic [RANGE 30 MINUTES] GROUP BY segment ORDER BY n DESC"
)


def test_select_distinct_gives_each_windows_distinct_values() -> None:
    got = sorted((r["window_start"], r["segment"]) for r in fjord_rows(DISTINCT))
    expected = sorted({(ws, r[3]) for ws, rs in _windows().items() for r in rs})
    assert got == expected
    star = fjord_rows("SELECT DISTINCT * FROM traffic [RANGE 30 MINUTES] WHERE time < 60")
    assert len(star) == 8 and set(star[0]) == {"time", "station", "speed", "segment"} | {
        "window_start",
        "window_end",
    }


def test_count_distinct_per_group_and_window() -> None:
    got = sorted(
        (r["window_start"], r["segment"], r["stations"], r["n"], r["a"])
        for r in fjord_rows(COUNT_DISTINCT)
    )
    expected = []
    for ws, rs in _windows().items():
        for seg in sorted({r[3] for r in rs}):
            mine = [r for r in rs if r[3] == seg]
            speeds = [r[2] for r in mine]
            expected.append(
                (ws, seg, len({r[1] for r in mine}), len(mine), sum(speeds) / len(speeds))
            )
    assert got == sorted(expected)


def test_count_distinct_after_a_table_join() -> None:
    got = sorted(
        (r["window_start"], r["limit_kmh"], r["stations"], r["top"])
        for r in fjord_rows(COUNT_DISTINCT_JOIN)
    )
    expected = []
    for ws, rs in _windows().items():
        for seg, lim in LIMIT_KMH.items():
            mine = [r for r in rs if r[3] == seg]
            expected.append((ws, lim, len({r[1] for r in mine}), max(r[2] for r in mine)))
    assert got == sorted(expected)


def test_distinct_with_aggregates_removes_duplicate_result_rows() -> None:
    rows = fjord_rows(DISTINCT_ROWS)
    # S0 has two stations (120 rows a window), S1 and S2 one each (60): two distinct counts
    assert [(r["window_start"], r["n"]) for r in rows] == [
        (0.0, 120),
        (0.0, 60),
        (1800.0, 120),
        (1800.0, 60),
    ]


# -- ORDER BY ... LIMIT n per window (top-k) -------------------------------------------------

TOPK = (
    "SELECT station, AVG(speed) AS avg_speed FROM traffic [RANGE 30 MINUTES] "
    "GROUP BY station ORDER BY avg_speed LIMIT 2"
)
TOPK_HIDDEN = (
    "SELECT segment FROM traffic [RANGE 10 MINUTES] GROUP BY segment "
    "ORDER BY MAX(speed) DESC, segment LIMIT 1"
)
TOPK_POSITION = (
    "SELECT segment, COUNT(*) AS n FROM traffic [RANGE 30 MINUTES SLIDE 15 MINUTES] "
    "GROUP BY segment ORDER BY 2 DESC, 1 DESC LIMIT 2"
)
TOPK_JOIN = (
    "SELECT s.station, l.limit_kmh, AVG(s.speed) AS a FROM traffic AS s [RANGE 30 MINUTES], "
    "limits AS l WHERE s.segment = l.segment GROUP BY s.station, l.limit_kmh "
    "ORDER BY a DESC LIMIT 1"
)


def test_top_k_per_window_the_slowest_stations() -> None:
    rows = fjord_rows(TOPK)
    expected = []
    for ws, rs in sorted(_windows().items()):
        avgs = {}
        for st in sorted({r[1] for r in rs}):
            vs = [r[2] for r in rs if r[1] == st]
            avgs[st] = sum(vs) / len(vs)
        ranked = sorted(avgs.items(), key=lambda kv: (kv[1], kv[0]))[:2]
        expected += [(ws, st, a) for st, a in ranked]
    # each window's rows come out sorted, windows in time order
    assert [(r["window_start"], r["station"], r["avg_speed"]) for r in rows] == expected


def test_order_by_an_aggregate_not_selected_and_by_position() -> None:
    rows = fjord_rows(TOPK_HIDDEN)
    expected = []
    for ws, rs in sorted(_windows(600).items()):
        tops = {seg: max(r[2] for r in rs if r[3] == seg) for seg in {r[3] for r in rs}}
        expected.append((ws, sorted(tops.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]))
    assert [(r["window_start"], r["segment"]) for r in rows] == expected
    assert set(rows[0]) == {"segment", "window_start", "window_end"}  # the key stays hidden
    by_pos = fjord_rows(TOPK_POSITION)
    assert by_pos and all(
        [r["segment"] for r in by_pos if r["window_end"] == end] == ["S0", "S2"]
        for end in {r["window_end"] for r in by_pos}
    )


def test_top_k_after_a_table_join() -> None:
    rows = fjord_rows(TOPK_JOIN)
    assert len(rows) == 2 and all(r["limit_kmh"] in (50.0, 70.0) for r in rows)


def test_a_shared_aggregate_still_serves_a_top_k_query_and_a_plain_one() -> None:
    f = _engine()
    plain = f.add_query(
        "SELECT station, AVG(speed) AS avg_speed FROM traffic [RANGE 30 MINUTES] GROUP BY station"
    )
    top = f.add_query(TOPK)
    outs: dict[str, list] = {"plain": [], "top": []}
    plain.sink.add_batch_callback(outs["plain"].extend)
    top.sink.add_batch_callback(outs["top"].extend)
    for t in ROWS:
        f.fjord.push("traffic", t)
    f.fjord.end_of_stream()
    f.fjord.run_until_idle()
    assert len(outs["plain"]) == 8 and len(outs["top"]) == 4


# (query, words, (line, column) of the clause)
REFUSED = [
    ("SELECT station, speed FROM traffic ORDER BY speed LIMIT 5", "cannot be sorted", (1, 36)),
    ("SELECT station, speed FROM traffic LIMIT 5", "cannot be sorted", (1, 36)),
    (
        "SELECT station, COUNT(*) AS n FROM traffic [RANGE 1 HOUR] GROUP BY station LIMIT 5",
        "LIMIT needs ORDER BY",
        (1, 76),
    ),
    (
        "SELECT station, COUNT(*) AS n FROM traffic [RANGE 1 HOUR] GROUP BY station "
        "ORDER BY n LIMIT 0",
        "at least 1",
        (1, 87),
    ),
    ("SELECT DISTINCT segment FROM traffic", "needs a window", (1, 8)),
]


@pytest.mark.parametrize(("sql", "words", "pos"), REFUSED)
def test_order_limit_and_distinct_without_a_window_are_refused(
    sql: str, words: str, pos: tuple[int, int]
) -> None:
    with pytest.raises(ClauseError, match=words) as e:
        _engine().add_query(sql)
    assert (e.value.line, e.value.column) == pos


@pytest.mark.parametrize(
    ("sql", "words"),
    [
        (
            "SELECT segment, COUNT(*) AS n FROM traffic [RANGE 1 HOUR] GROUP BY segment ORDER BY 3",
            "ORDER BY 3: the SELECT list has 2 items",
        ),
        (
            "SELECT segment FROM traffic [RANGE 1 HOUR] GROUP BY segment ORDER BY station",
            "must appear in GROUP BY",
        ),
        (
            "SELECT DISTINCT segment FROM traffic [RANGE 1 HOUR] ORDER BY station",
            "ORDER BY must name result columns",
        ),
    ],
)
def test_bad_order_keys_are_refused(sql: str, words: str) -> None:
    with pytest.raises(QueryError, match=words):
        _engine().add_query(sql)


# -- Spark: the same rows ------------------------------------------------------------------

BOTH = [
    SCALAR,
    ROUNDING,
    MIXED,
    DISTINCT,
    COUNT_DISTINCT,
    COUNT_DISTINCT_JOIN,
    DISTINCT_ROWS,
    TOPK,
    TOPK_HIDDEN,
    TOPK_POSITION,
    TOPK_JOIN,
]


@pytest.mark.needs_spark
@pytest.mark.parametrize("sql", BOTH, ids=range(len(BOTH)))
def test_spark_gives_the_same_rows(spark, sql: str) -> None:
    assert _same(spark_rows(spark, sql), fjord_rows(sql))


@pytest.mark.parametrize(("sql", "words", "pos"), REFUSED)
def test_spark_refuses_alike(sql: str, words: str, pos: tuple[int, int]) -> None:
    from gateway.spark.compiler import compile_query
    from tests.fjords.test_clauses import LIMITS, SCHEMA

    with pytest.raises(ClauseError, match=words) as e:
        compile_query(sql, {"traffic": SCHEMA}, {"limits": LIMITS})
    assert (e.value.line, e.value.column) == pos


# -- semantic errors say where ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "words", "pos"),
    [
        ("SELECT station, COUNT(*) AS n FROM traffic GROUP BY station", "need a window", (1, 44)),
        ("SELECT speed, speed FROM traffic", "two result columns are named 'speed'", (1, 8)),
        ("SELECT * FROM limits", "needs a sensor stream", (1, 15)),
        (
            "SELECT station, COUNT(*) AS n FROM traffic [RANGE 1 HOUR] GROUP BY MAX(speed)",
            "GROUP BY cannot contain aggregates",
            (1, 68),
        ),
        (
            "SELECT l.segment, SUM(l.limit_kmh) AS s FROM traffic AS t [RANGE 1 HOUR], limits AS l "
            "WHERE t.segment = l.segment GROUP BY l.segment",
            "static-table columns",
            (1, 19),
        ),
        ("SELECT * FROM traffic WHERE speed = 'fast'", "cannot compare speed", (1, 37)),
    ],
)
def test_semantic_errors_carry_line_and_column(sql: str, words: str, pos: tuple) -> None:
    from fjords.errors import QueryPlanError

    with pytest.raises(QueryPlanError, match=words) as e:
        _engine().add_query(sql)
    assert (e.value.line, e.value.column) == pos
    assert e.value.to_dict()["line"] == pos[0]


def test_queries_differing_only_in_a_function_do_not_share_an_aggregate() -> None:
    f = _engine()
    a = f.add_query(
        "SELECT COUNT(*) AS n FROM traffic [RANGE 30 MINUTES] WHERE ABS(speed - 40) < 10"
    )
    b = f.add_query(
        "SELECT COUNT(*) AS n FROM traffic [RANGE 30 MINUTES] WHERE ROUND(speed - 40) < 10"
    )
    assert a.plan.window is not None and b.plan.window is not None
    assert a.plan.window.key != b.plan.window.key
    c = f.add_query(
        "SELECT COUNT(*) AS n FROM traffic [RANGE 30 MINUTES] WHERE ABS(speed - 40) < 10"
    )
    assert c.plan.window is not None and c.plan.window.key == a.plan.window.key
    assert c.shared is a.shared and len(c.shared.users) == 2  # type: ignore[union-attr]
