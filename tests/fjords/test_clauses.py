"""Every clause of the grammar means something or is refused, on the Fjord and on Spark alike.

The clause list is read from the grammar itself, so a clause added to grammar.lark fails
`test_every_grammar_clause_is_covered` until it has a case here. A clause is *enforced* when
the result with it differs from the result without it, as the clause says; it is *refused*
where it would change nothing (or silently skip data) with a ClauseError at the clause.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from fjords.compile.sql.grammar import LARK
from fjords.engine import Engine
from fjords.errors import ClauseError, QueryError
from fjords.runtime.fjord import Fjord
from fjords.schema import Schema
from fjords.tables import Table

SCHEMA = Schema(
    [("time", "int"), ("station", "str"), ("speed", "float"), ("segment", "str")], time="time"
)
LIMITS = Schema([("segment", "str"), ("limit_kmh", "float")], time=None)
LIMIT_ROWS = [("S0", 50.0), ("S1", 70.0)]
STATIONS = {"st0": "S0", "st1": "S0", "st2": "S1", "st3": "S2"}
# One reading per station every 30 s for an hour; speeds spread 5..79 deterministically.
ROWS = [
    (t, st, float(5 + (t // 30 * 7 + i * 13) % 75), seg)
    for t in range(0, 3600, 30)
    for i, (st, seg) in enumerate(STATIONS.items())
]


def _engine() -> Engine:
    f = Engine(Fjord())
    f.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    f.fjord.add_table("limits", Table("limits", LIMITS, LIMIT_ROWS))
    return f


def fjord_rows(sql: str) -> list[dict]:
    f = _engine()
    rq = f.add_query(sql, query_id="q")
    out: list[tuple] = []
    rq.sink.add_batch_callback(out.extend)
    for t in ROWS:
        f.fjord.push("traffic", t)
    f.fjord.end_of_stream()
    f.fjord.run_until_idle()
    return [dict(zip(rq.columns, r, strict=True)) for r in out]


# -- the clauses of the grammar -----------------------------------------------------------


def grammar_clauses() -> set[str]:
    """Clause names read from the parser's rules: WHERE/GROUP BY/HAVING, the options, the window
    kinds (and their SLIDE), and further FROM sources."""
    names: set[str] = set()
    for rule in LARK.rules:
        symbols = [s.name for s in rule.expansion]
        origin = rule.origin.name
        if origin == "query":
            names |= {s for s in symbols if s.endswith("_clause")}
        elif origin in ("option", "window", "emit_clause"):
            if rule.alias is None:  # `option: emit_clause`: its alternatives are the clauses
                continue
            names.add(rule.alias)
            if "SLIDE" in symbols:
                names.add(f"{rule.alias}+slide")
        elif origin.startswith("__query_star") and "source" in symbols:
            names.add("more_sources")
        elif origin == "set_op":  # UNION ALL, and UNION (refused)
            names.add("union_all" if "ALL" in symbols else "union")
    return names


@dataclass(frozen=True)
class Enforced:
    """`sql` with the clause, `without` the same query without it; `holds(with, without)`."""

    clause: str
    sql: str
    without: str
    holds: Callable[[list[dict], list[dict]], bool]
    ordered: bool = False  # the rows' order within a window is part of the result (ORDER BY)


def _per_window(rows: list[dict]) -> dict[float, list[dict]]:
    out: dict[float, list[dict]] = {}
    for r in rows:
        out.setdefault(r["window_end"], []).append(r)
    return out


AGG = "SELECT COUNT(*) AS n FROM traffic"
JOIN = "FROM traffic AS a [RANGE 5 MINUTES], traffic AS b [RANGE 5 MINUTES]"
BY_STATION = (
    "SELECT station, AVG(speed) AS a FROM traffic [RANGE 10 MINUTES] GROUP BY station ORDER BY a"
)


def _sorted_by_a(rows: list[dict]) -> bool:
    return all(
        [r["a"] for r in rs] == sorted(r["a"] for r in rs) for rs in _per_window(rows).values()
    )


def _every_third_per_station(w: list[dict], wo: list[dict]) -> bool:
    seen: dict[str, int] = {}
    want = []
    for r in wo:
        seen[r["station"]] = seen.get(r["station"], 0) + 1
        if seen[r["station"]] % 3 == 0:
            want.append(r)
    return w == want


ENFORCED = [
    Enforced(
        "emit_every_rows",
        f"{AGG} [RANGE 10 MINUTES] EMIT EVERY 40 ROWS",
        f"{AGG} [RANGE 10 MINUTES]",
        lambda w, wo: (
            len(w) == len(ROWS) // 40
            and all(r["window_end"] - r["window_start"] == 600 for r in w)
            and [r["n"] for r in w][-1] == 80
        ),
    ),
    Enforced(
        "sample_every_rows",
        "SELECT time, station, speed FROM traffic SAMPLE EVERY 3 ROWS",
        "SELECT time, station, speed FROM traffic",
        _every_third_per_station,
    ),
    Enforced(
        "where_clause",
        "SELECT station, speed FROM traffic WHERE speed > 50",
        "SELECT station, speed FROM traffic",
        lambda w, wo: (
            w and all(r["speed"] > 50 for r in w) and len(w) == sum(r["speed"] > 50 for r in wo)
        ),
    ),
    Enforced(
        "group_clause",
        "SELECT segment, COUNT(*) AS n FROM traffic [RANGE 10 MINUTES] GROUP BY segment",
        f"{AGG} [RANGE 10 MINUTES]",
        lambda w, wo: all(
            len(rs) == 3 and sum(r["n"] for r in rs) == _per_window(wo)[end][0]["n"]
            for end, rs in _per_window(w).items()
        ),
    ),
    Enforced(
        "having_clause",
        "SELECT station, MAX(speed) AS top FROM traffic [RANGE 10 MINUTES] GROUP BY station "
        "HAVING MAX(speed) > 75",
        "SELECT station, MAX(speed) AS top FROM traffic [RANGE 10 MINUTES] GROUP BY station",
        lambda w, wo: w and w == [r for r in wo if r["top"] > 75] and len(w) < len(wo),
    ),
    Enforced(
        "range_window",
        f"{AGG} [RANGE 10 MINUTES]",
        f"{AGG} [RANGE 30 MINUTES]",
        lambda w, wo: [r["n"] for r in w] == [80] * 6 and [r["n"] for r in wo] == [240] * 2,
    ),
    Enforced(
        "range_window+slide",
        f"{AGG} [RANGE 10 MINUTES SLIDE 5 MINUTES]",
        f"{AGG} [RANGE 10 MINUTES]",
        lambda w, wo: len(w) > len(wo) and all(r["window_end"] % 300 == 0 for r in w),
    ),
    Enforced(
        "rows_window",
        f"{AGG} [ROWS 100]",
        f"{AGG} [ROWS 40]",
        lambda w, wo: {r["n"] for r in w[:-1]} == {100} and {r["n"] for r in wo} == {40},
    ),
    Enforced(
        "rows_window+slide",
        f"{AGG} [ROWS 40 SLIDE 20]",
        f"{AGG} [ROWS 40]",
        lambda w, wo: len(w) > len(wo),
    ),
    Enforced(
        "emit_every",
        f"{AGG} [RANGE 10 MINUTES] EMIT EVERY 2 MINUTES",
        f"{AGG} [RANGE 10 MINUTES]",
        lambda w, wo: len(w) > len(wo) and all(r["window_end"] % 120 == 0 for r in w),
    ),
    Enforced(  # every change: a row per reading (its group), then the final rows
        "emit_changes",
        f"{AGG} [RANGE 10 MINUTES] EMIT CHANGES",
        f"{AGG} [RANGE 10 MINUTES]",
        lambda w, wo: (
            [r["n"] for r in w if not r["final"]] == list(range(1, 81)) * 6
            and [(r["n"], r["window_end"]) for r in w if r["final"]]
            == [(r["n"], r["window_end"]) for r in wo]
        ),
    ),
    Enforced(  # 4 stations every 30 s: 16, 32, 48, 64 readings at 2, 4, 6, 8 minutes
        "emit_changes_every",
        f"{AGG} [RANGE 10 MINUTES] EMIT CHANGES EVERY 2 MINUTES",
        f"{AGG} [RANGE 10 MINUTES]",
        lambda w, wo: (
            [(r["n"], r["as_of"] - r["window_start"], r["final"]) for r in w]
            == [
                (16, 120, False),
                (32, 240, False),
                (48, 360, False),
                (64, 480, False),
                (80, 600, True),
            ]
            * 6
            and [r["n"] for r in wo] == [80] * 6
        ),
    ),
    Enforced(
        "emit_changes_rows",
        f"{AGG} [RANGE 10 MINUTES] EMIT CHANGES EVERY 30 ROWS",
        f"{AGG} [RANGE 10 MINUTES]",
        lambda w, wo: (
            sorted((r["window_end"], r["final"], r["n"]) for r in w)
            == sorted(
                (r["window_end"], *fn) for r in wo for fn in ((False, 30), (False, 60), (True, 80))
            )
            and all(r["as_of"] == r["window_end"] for r in w if r["final"])
        ),
    ),
    Enforced(
        "distinct_clause",
        "SELECT DISTINCT COUNT(*) AS n FROM traffic [RANGE 10 MINUTES] GROUP BY segment",
        "SELECT COUNT(*) AS n FROM traffic [RANGE 10 MINUTES] GROUP BY segment",
        lambda w, wo: (
            len(w) == 12
            and len(wo) == 18
            and {(r["window_end"], r["n"]) for r in w} == {(r["window_end"], r["n"]) for r in wo}
        ),
    ),
    Enforced(
        "order_clause",
        BY_STATION,
        BY_STATION.replace(" ORDER BY a", ""),
        lambda w, wo: (
            _sorted_by_a(w)
            and not _sorted_by_a(wo)
            and sorted(map(repr, w)) == sorted(map(repr, wo))
        ),
        ordered=True,
    ),
    Enforced(
        "limit_clause",
        f"{BY_STATION} LIMIT 2",
        BY_STATION,
        lambda w, wo: (
            w == [r for rs in _per_window(wo).values() for r in rs[:2]]
            and len(w) == 2 * len(_per_window(wo))
        ),
        ordered=True,
    ),
    Enforced(
        "more_sources",
        "SELECT s.station, s.speed, l.limit_kmh FROM traffic AS s, limits AS l "
        "WHERE l.segment = s.segment AND s.speed > l.limit_kmh",
        "SELECT s.station, s.speed FROM traffic AS s",
        lambda w, wo: (
            w
            and len(w) < len(wo)
            and all(r["speed"] > r["limit_kmh"] for r in w)
            and {r["station"] for r in w} <= {"st0", "st1", "st2"}
        ),
    ),
    Enforced(
        "union_all",
        "SELECT station, speed FROM traffic WHERE speed > 70 "
        "UNION ALL SELECT station, speed FROM traffic WHERE speed < 10",
        "SELECT station, speed FROM traffic WHERE speed > 70",
        lambda w, wo: (
            len(wo) < len(w)
            and [r for r in w if r["speed"] > 70] == wo
            and all(r["speed"] < 10 for r in w if r["speed"] <= 70)
        ),
    ),
    Enforced(  # a second stream: pairs of the same segment in the same 1-minute window
        "more_sources",
        "SELECT a.station, b.station AS other FROM traffic AS a [RANGE 1 MINUTE], "
        "traffic AS b [RANGE 1 MINUTE] WHERE a.segment = b.segment AND a.station < b.station",
        "SELECT station FROM traffic",
        lambda w, wo: (
            len(w) == 4 * 60  # st0 x st1 (segment S0): 2 readings each per minute, 60 minutes
            and all((r["station"], r["other"]) == ("st0", "st1") for r in w)
            and len(wo) == len(ROWS)
        ),
    ),
]

UNION = "SELECT station, speed FROM traffic UNION ALL SELECT station, speed FROM traffic"

# (clause, query, words of the message, (line, column) of the clause); a position for clause
# errors only (QuerySyntaxError and QueryPlanError are checked in test_union_errors_say_where)
REFUSED = [
    ("union", "SELECT * FROM traffic UNION SELECT * FROM traffic", "use UNION ALL", None),
    (
        "union_all",
        "SELECT station, COUNT(*) FROM traffic [ROWS 10] GROUP BY station UNION ALL "
        "SELECT station, COUNT(*) FROM traffic [ROWS 10] GROUP BY station",
        "ROWS windows",
        (1, 40),
    ),
    ("union_all", f"{UNION} ORDER BY speed", "ORDER BY is not supported in a UNION ALL", None),
    ("union_all", f"{UNION} LIMIT 3", "LIMIT is not supported in a UNION ALL", None),
    (
        "union_all",
        "SELECT station FROM traffic UNION ALL SELECT station, speed FROM traffic",
        "branch 2 has 2 columns",
        None,
    ),
    (
        "union_all",
        "SELECT station FROM traffic UNION ALL SELECT speed FROM traffic",
        "is text in the first branch but a number in branch 2",
        None,
    ),
    (
        "union_all",
        "SELECT station, COUNT(*) AS n FROM traffic [RANGE 1 HOUR] GROUP BY station "
        "UNION ALL SELECT station, speed FROM traffic",
        "every branch must aggregate over windows, or none",
        None,
    ),
    (
        "union_all",
        "SELECT * FROM traffic PRIORITY 5 UNION ALL SELECT * FROM traffic",
        "ambiguous",
        None,
    ),
    (
        "having_clause",
        "SELECT station, speed FROM traffic WHERE station = '773869' HAVING speed > 1000",
        "HAVING filters groups",
        (1, 61),
    ),
    ("range_window", "SELECT * FROM traffic\n  [RANGE 1 HOUR]", "changes nothing", (2, 4)),
    ("rows_window", "SELECT * FROM traffic [ROWS 1]", "changes nothing", (1, 24)),
    ("range_window", "SELECT * FROM limits [RANGE 1 HOUR], traffic", "static table", (1, 23)),
    (
        "range_window+slide",
        f"{AGG} [RANGE 1 MINUTE SLIDE 2 MINUTES]",
        "SLIDE 2 MINUTES is longer than RANGE 1 MINUTE",
        (1, 36),
    ),
    ("rows_window+slide", f"{AGG} [ROWS 3 SLIDE 5]", "SLIDE 5 is larger than ROWS 3", (1, 36)),
    (
        "emit_every",
        "SELECT * FROM traffic [RANGE 1 HOUR] EMIT EVERY 1 DAY",
        "no aggregate",
        (1, 38),
    ),
    ("emit_every", f"{AGG} EMIT EVERY 1 MINUTE", "needs a window", (1, 35)),
    ("emit_changes", "SELECT * FROM traffic EMIT CHANGES", "no aggregate", (1, 23)),
    ("emit_changes", f"{AGG} [ROWS 10] EMIT CHANGES", "not to ROWS windows", (1, 45)),
    ("emit_changes", f"{AGG} [RANGE 1 HOUR] EMIT EVERY 1 MINUTE EMIT CHANGES", "not both", (1, 70)),
    (
        "emit_every_rows",
        f"{AGG} [RANGE 1 HOUR] EMIT CHANGES EMIT EVERY 6 ROWS",
        "not both",
        (1, 63),
    ),
    (
        "emit_every_rows",
        "SELECT segment, COUNT(*) AS n FROM traffic [RANGE 1 HOUR] GROUP BY ROLLUP(segment)\n"
        "  EMIT EVERY 6 ROWS",
        "ROLLUP or GROUPING SETS",
        (2, 3),
    ),
    (
        "emit_changes",
        "SELECT segment, COUNT(*) AS n FROM traffic [RANGE 1 HOUR] GROUP BY ROLLUP(segment)\n"
        "  EMIT CHANGES",
        "ROLLUP or GROUPING SETS",
        (2, 3),
    ),
    (
        "emit_changes",
        "SELECT segment, COUNT(*) AS n FROM traffic [RANGE 1 HOUR] GROUP BY segment\n"
        "  ORDER BY n EMIT CHANGES",
        "DISTINCT, ORDER BY or LIMIT",
        (2, 14),
    ),
    (
        "emit_changes_every",
        f"{AGG} [RANGE 1 HOUR] EMIT CHANGES EVERY 7 MINUTES",
        "must divide the window's RANGE and SLIDE",
        (1, 69),
    ),
    (
        "emit_changes_every",
        f"{AGG} [RANGE 1 HOUR SLIDE 15 MINUTES] EMIT CHANGES EVERY 10 MINUTES",
        "must divide the window's RANGE and SLIDE",
        (1, 86),
    ),
    (
        "emit_changes_every",
        f"{AGG} [RANGE 1 HOUR]\nEMIT CHANGES EVERY 2 HOURS",
        "EVERY 2 HOURS is longer than RANGE 1 HOUR",
        (2, 20),
    ),
    ("emit_changes_every", f"{AGG} EMIT CHANGES EVERY 0 DAYS", "at least 1 millisecond", (1, 54)),
    ("emit_changes_rows", f"{AGG} [RANGE 1 HOUR] EMIT CHANGES EVERY 0 ROWS", "never", (1, 69)),
    ("emit_every", f"{AGG} [ROWS 10] EMIT EVERY 1 MINUTE", "time windows", (1, 45)),
    (
        "emit_every",
        f"{AGG} [RANGE 1 HOUR] EMIT EVERY 1 DAY",
        "EMIT EVERY 1 DAY is longer than RANGE 1 HOUR",
        (1, 50),
    ),
    ("sample_period", "SELECT * FROM traffic SAMPLE PERIOD 0 SECONDS", "at least", (1, 23)),
    ("lifetime", "SELECT * FROM traffic LIFETIME 0 SECONDS", "at least", (1, 23)),
    ("group_clause", "SELECT station FROM traffic GROUP BY station", "need a window", None),
    ("distinct_clause", "SELECT DISTINCT station FROM traffic", "needs a window", (1, 8)),
    ("order_clause", "SELECT * FROM traffic\n ORDER BY speed", "cannot be sorted", (2, 2)),
    (
        "order_clause",
        "SELECT * FROM traffic [RANGE 1 HOUR] ORDER BY speed",
        "cannot be sorted",
        (1, 38),
    ),
    ("limit_clause", "SELECT * FROM traffic LIMIT 10", "cannot be sorted", (1, 23)),
    (
        "limit_clause",
        f"{AGG} [RANGE 1 HOUR] GROUP BY segment LIMIT 1",
        "LIMIT needs ORDER BY",
        (1, 67),
    ),
    ("more_sources", "SELECT * FROM traffic, traffic AS b", "two streams", None),
    # A join of two streams: the same tumbling RANGE on both, an equality between them.
    (
        "more_sources",
        "SELECT a.station FROM traffic AS a [RANGE 5 MINUTES], traffic AS b [RANGE 10 MINUTES] "
        "WHERE a.segment = b.segment",
        "the windows differ",
        (1, 69),
    ),
    (
        "more_sources",
        "SELECT a.station FROM traffic AS a [ROWS 10], traffic AS b [ROWS 10] "
        "WHERE a.segment = b.segment",
        "ROWS windows cannot scope a join of two streams",
        (1, 37),
    ),
    (
        "more_sources",
        "SELECT a.station FROM traffic AS a [RANGE 10 MINUTES SLIDE 5 MINUTES], traffic AS b "
        "[RANGE 10 MINUTES] WHERE a.segment = b.segment",
        "SLIDE on stream 'a'",
        (1, 37),
    ),
    (
        "more_sources",
        "SELECT a.station FROM traffic AS a, traffic AS b [RANGE 5 MINUTES] "
        "WHERE a.segment = b.segment",
        "stream 'a' has no window",
        (1, 23),
    ),
    (
        "more_sources",
        f"SELECT a.segment, COUNT(*) AS n {JOIN} WHERE a.segment = b.segment GROUP BY a.segment "
        "EMIT EVERY 1 MINUTE",
        "EMIT EVERY cannot be used with a join of two streams",
        (1, 148),
    ),
    ("more_sources", f"SELECT a.station {JOIN} WHERE a.speed < b.speed", "needs an equality", None),
    (
        "more_sources",
        f"SELECT a.station {JOIN}, limits AS l WHERE a.segment = b.segment AND l.segment = a.segment",
        "two streams with a static table is not supported",
        None,
    ),
    (
        "more_sources",
        f"SELECT a.station {JOIN}, traffic AS c [RANGE 5 MINUTES] WHERE a.segment = b.segment",
        "at most two streams",
        None,
    ),
    ("more_sources", f"SELECT station {JOIN} WHERE a.segment = b.segment", "ambiguous", None),
    (
        "more_sources",
        f"SELECT a.station, window_start {JOIN} WHERE a.segment = b.segment",
        "window_start is a column of windowed results",
        None,
    ),
    (
        "more_sources",
        f"SELECT a.station {JOIN} WHERE a.segment = b.segment AND a.time > NOW - 1 MINUTE",
        "NOW is not supported in a join of two streams",
        None,
    ),
    (
        "more_sources",
        "SELECT * FROM traffic [RANGE 5 MINUTES], traffic [RANGE 5 MINUTES]",
        "its own alias",
        None,
    ),
    ("priority", "SELECT * FROM traffic PRIORITY 0", "PRIORITY must be a whole number", None),
]
# What a union error points at: the plain UNION, the clause, the mismatching item, the UNION
# before a branch of the wrong width.
UNION_ERRORS = [
    ("SELECT * FROM traffic\n UNION SELECT * FROM traffic", (2, 2)),
    (f"{UNION}\n ORDER BY speed", (2, 2)),
    ("SELECT station FROM traffic UNION ALL SELECT speed FROM traffic", (1, 46)),
    ("SELECT station FROM traffic\nUNION ALL SELECT station, speed FROM traffic", (2, 1)),
    ("SELECT * FROM traffic PRIORITY 5 UNION ALL SELECT * FROM traffic", (1, 23)),
    (f"{UNION} [RANGE 1 HOUR] EMIT EVERY 1 MINUTE", (1, 96)),
]


@pytest.mark.parametrize(("sql", "pos"), UNION_ERRORS)
def test_union_errors_say_where(sql: str, pos: tuple[int, int]) -> None:
    from gateway.spark.compiler import compile_query

    for refuse in (
        lambda: _engine().add_query(sql),
        lambda: compile_query(sql, {"traffic": SCHEMA}, {"limits": LIMITS}),
    ):
        with pytest.raises(QueryError) as e:
            refuse()
        assert (e.value.line, e.value.column) == pos, str(e.value)  # type: ignore[attr-defined]


def test_analysis_keeps_no_node_lists_after_it() -> None:
    """`analyze` lists each expression's nodes once while it runs (by identity, in a
    per-thread dict): nothing is kept after it, on success or on error; two equal
    expressions at different places are each reported at their own place."""
    from fjords.compile.analysis import nodes

    f = _engine()
    f.plan("SELECT speed FROM traffic WHERE speed > 1")
    assert getattr(nodes.listing, "nodes", None) is None
    with pytest.raises(QueryError) as e:
        f.plan("SELECT nosuch + 1 AS a FROM traffic WHERE speed > 1 OR (nosuch + 1) > 2")
    assert (e.value.line, e.value.column) == (1, 8)  # type: ignore[attr-defined]
    assert getattr(nodes.listing, "nodes", None) is None
    with pytest.raises(QueryError) as e:
        f.plan("SELECT AVG(speed) AS a FROM traffic [RANGE 1 MINUTE] WHERE AVG(speed) > 2")
    assert (e.value.line, e.value.column) == (1, 60)  # type: ignore[attr-defined]


def test_union_options_apply_to_every_branch() -> None:
    """SAMPLE PERIOD, LIFETIME and PRIORITY after the last branch: every branch's demand and
    every operator of the union (the merge too) carry them."""
    rq = _engine().add_query(
        "SELECT station, speed FROM traffic WHERE speed > 70 UNION ALL "
        "SELECT s.station, l.limit_kmh FROM traffic AS s, limits AS l WHERE s.segment = "
        "l.segment SAMPLE PERIOD 2 SECONDS LIFETIME 30 DAYS PRIORITY 300",
        query_id="q",
    )
    assert [d.sample_period_s for d in rq.demands] == [2.0, 2.0]
    assert [d.lifetime_s for d in rq.demands] == [30 * 86400.0] * 2
    assert {op.tickets for op in rq.operators} == {300}
    assert rq.describe()["priority"] == 300


# Enforced on the Fjord through the sensors' demand (proxies/demand.py), not through rows.
DEMAND = {
    "sample_period": ("SELECT * FROM traffic SAMPLE PERIOD 2 SECONDS", "sample_period_s", 2.0),
    "lifetime": ("SELECT * FROM traffic LIFETIME 30 DAYS", "lifetime_s", 30 * 86400.0),
    "sample_every_rows": ("SELECT * FROM traffic SAMPLE EVERY 3 ROWS", "sample_every_rows", 3),
}


# Enforced on the Fjord through the scheduler's tickets (fjords/scheduler.py), not through rows.
SCHEDULING = {"priority": ("SELECT station, speed FROM traffic PRIORITY 500", 500)}


def test_every_grammar_clause_is_covered() -> None:
    covered = {c.clause for c in ENFORCED} | {c[0] for c in REFUSED} | set(DEMAND)
    assert grammar_clauses() == covered | set(SCHEDULING)


@pytest.mark.parametrize("clause", sorted(SCHEDULING))
def test_fjord_gives_the_query_operators_its_priority(clause: str) -> None:
    sql, tickets = SCHEDULING[clause]
    rq = _engine().add_query(sql, query_id="q")
    assert rq.operators and {op.tickets for op in rq.operators} == {tickets}


@pytest.mark.parametrize("case", ENFORCED, ids=lambda c: c.clause)
def test_fjord_enforces(case: Enforced) -> None:
    with_clause, without = fjord_rows(case.sql), fjord_rows(case.without)
    assert with_clause != without
    assert case.holds(with_clause, without)


@pytest.mark.parametrize(("clause", "sql", "words", "pos"), REFUSED, ids=lambda x: str(x)[:40])
def test_fjord_refuses(clause: str, sql: str, words: str, pos: tuple[int, int] | None) -> None:
    f = _engine()
    with pytest.raises(QueryError, match=words) as e:
        f.add_query(sql)
    if pos is not None:
        assert isinstance(e.value, ClauseError)
        assert (e.value.line, e.value.column) == pos
        assert e.value.to_dict()["line"] == pos[0]
    assert f.fjord.queries == {}


@pytest.mark.parametrize("clause", sorted(DEMAND))
def test_fjord_passes_sensor_clauses_to_the_sensors(clause: str) -> None:
    from proxies.demand import SensorView, analyse, sensor_demand

    sql, attr, value = DEMAND[clause]
    rq = _engine().add_query(sql, query_id="q")
    assert getattr(rq.demand, attr) == value
    view = SensorView(static={"station": "st0", "segment": "S0"}, value_field="speed")
    merged = sensor_demand([analyse("q", rq.demand, view)], view, default_period_s=60.0)
    assert getattr(merged, attr) == value


# -- Spark: the same enforcement, the same refusals -----------------------------------------


def spark_rows(session, sql: str, *, as_collected: bool = False) -> list[dict]:
    """Spark's rows, in result_rows' stable order (or as collected: ORDER BY's order)."""
    from gateway.spark.batch import result_rows
    from gateway.spark.compiler import compile_query, spark_schema

    q = compile_query(sql, {"traffic": SCHEMA}, {"limits": LIMITS})
    df = session.createDataFrame(ROWS, spark_schema(SCHEMA))
    table = session.createDataFrame(LIMIT_ROWS, spark_schema(LIMITS)) if q.table else None
    out = q.finish(q.stream_stage(df), table)
    return [r.asDict() for r in out.collect()] if as_collected else result_rows(out)


def _same(a: list[dict], b: list[dict]) -> bool:
    def key(r: dict) -> str:
        return repr(sorted((k, round(v, 6) if isinstance(v, float) else v) for k, v in r.items()))

    return sorted(map(key, a)) == sorted(map(key, b))


# ROWS windows are refused on Spark (no event-time order of rows across partitions), and so
# (for now) are EMIT CHANGES' early rows: each with what it says.
SPARK_REFUSES = {
    "rows_window": "ROWS windows",
    "rows_window+slide": "ROWS windows",
    "emit_changes": "EMIT CHANGES",
    "emit_changes_every": "EMIT CHANGES",
    "emit_changes_rows": "EMIT CHANGES",
}


@pytest.mark.needs_spark
@pytest.mark.parametrize("case", ENFORCED, ids=lambda c: c.clause)
def test_spark_enforces_like_the_fjord(spark, case: Enforced) -> None:
    from gateway.spark.compiler import SparkUnsupportedError

    if case.clause in ("sample_every_rows", "emit_every_rows"):  # refused, at the clause
        with pytest.raises(SparkUnsupportedError, match="Fjord"):
            spark_rows(spark, case.sql)
        return
    if case.clause in SPARK_REFUSES:
        with pytest.raises(SparkUnsupportedError, match=SPARK_REFUSES[case.clause]) as e:
            spark_rows(spark, case.sql)
        assert e.value.line is not None
        return
    if case.ordered:  # ORDER BY's order within each window, as collected; windows by end
        with_clause = spark_rows(spark, case.sql, as_collected=True)
        assert _same(with_clause, fjord_rows(case.sql))
        with_clause = sorted(with_clause, key=lambda r: r["window_end"])
        without = spark_rows(spark, case.without, as_collected="ORDER BY" in case.without)
        without = sorted(without, key=lambda r: r["window_end"])
    else:
        with_clause, without = spark_rows(spark, case.sql), spark_rows(spark, case.without)
        assert _same(with_clause, fjord_rows(case.sql))
        with_clause, without = sorted_like_fjord(with_clause), sorted_like_fjord(without)
    assert case.holds(with_clause, without)


def sorted_like_fjord(rows: list[dict]) -> list[dict]:
    """The Fjord emits windows in end order, rows in arrival order; Spark in any order."""
    return sorted(rows, key=lambda r: (r.get("window_end", 0), repr(sorted(r.items()))))


@pytest.mark.parametrize(("clause", "sql", "words", "pos"), REFUSED, ids=lambda x: str(x)[:40])
def test_spark_refuses_like_the_fjord(
    clause: str, sql: str, words: str, pos: tuple[int, int] | None
) -> None:
    """Compiling needs no JVM: the same message at the same place, except where Spark refuses
    the construct itself first (ROWS windows), which it says."""
    from gateway.spark.compiler import SparkUnsupportedError, compile_query

    with pytest.raises(QueryError) as e:
        compile_query(sql, {"traffic": SCHEMA}, {"limits": LIMITS})
    if "[ROWS" in sql:
        assert isinstance(e.value, SparkUnsupportedError)
        return
    assert words in str(e.value)
    if pos is not None:
        assert (e.value.line, e.value.column) == pos  # type: ignore[attr-defined]


@pytest.mark.parametrize("clause", sorted(DEMAND))
def test_spark_refuses_sensor_clauses(clause: str) -> None:
    """A Spark job reads recorded data: it cannot change how sensors sample, so it refuses."""
    from gateway.spark.compiler import SparkUnsupportedError, compile_query

    sql = DEMAND[clause][0]
    with pytest.raises(SparkUnsupportedError, match="Fjord") as e:
        compile_query(sql, {"traffic": SCHEMA})
    assert (e.value.line, e.value.column) == (1, 23)


@pytest.mark.parametrize("clause", sorted(SCHEDULING))
def test_spark_refuses_scheduling_clauses(clause: str) -> None:
    """Spark schedules its own jobs: PRIORITY is refused there, at the clause."""
    from gateway.spark.compiler import SparkUnsupportedError, compile_query

    with pytest.raises(SparkUnsupportedError, match="PRIORITY") as e:
        compile_query(SCHEDULING[clause][0], {"traffic": SCHEMA})
    assert (e.value.line, e.value.column) == (1, 36)


# -- unknown names: where, what exists, and the nearest --------------------------------------


@pytest.mark.parametrize(
    ("sql", "pos", "words", "names"),
    [
        (
            "SELECT station,\n  spede FROM traffic",
            (2, 3),
            "unknown column 'spede'; did you mean 'speed'?",
            ["time", "station", "speed", "segment"],
        ),
        (
            "SELECT s.Speed FROM traffic AS s",
            (1, 8),
            "did you mean 'speed'?",
            ["time", "station", "speed", "segment"],
        ),
        (
            "SELECT x.speed FROM traffic AS s, limits AS l WHERE l.segment = s.segment",
            (1, 8),
            "unknown table or alias 'x'",
            ["s", "l"],
        ),
        (
            "SELECT * FROM trafic",
            (1, 15),
            "did you mean 'traffic'?",
            ["limits", "traffic"],
        ),
        (
            "SELECT segment, AVG(sped) FROM traffic [RANGE 1 HOUR] GROUP BY segment",
            (1, 21),
            "did you mean 'speed'?",
            ["time", "station", "speed", "segment"],
        ),
    ],
)
def test_unknown_names_say_where_and_what_exists(
    sql: str, pos: tuple[int, int], words: str, names: list[str]
) -> None:
    from fjords.errors import UnknownNameError

    with pytest.raises(UnknownNameError) as e:
        _engine().add_query(sql)
    assert words in str(e.value)
    assert (e.value.line, e.value.column) == pos
    assert list(e.value.names) == names
    assert e.value.to_dict()["names"] == names


def test_an_unknown_column_of_a_join_lists_both_sides() -> None:
    from fjords.errors import UnknownNameError

    with pytest.raises(UnknownNameError) as e:
        _engine().add_query(
            "SELECT nope FROM traffic AS s, limits AS l WHERE l.segment = s.segment"
        )
    assert list(e.value.names) == ["time", "station", "speed", "segment", "limit_kmh"]
    assert e.value.suggestion is None and "did you mean" not in str(e.value)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM traffic WHERE window_end = 0",
        "SELECT segment, COUNT(*) FROM traffic [RANGE 1 HOUR] WHERE window_start > 5 "
        "GROUP BY segment",
    ],
)
def test_a_window_bound_in_where_is_refused_with_where_to_compare_it(sql: str) -> None:
    """WHERE filters readings, before any window: its bounds belong in HAVING."""
    f = _engine()
    with pytest.raises(QueryError, match="compare it in HAVING") as e:
        f.add_query(sql)
    assert e.value.to_dict()["line"] == 1
    assert f.fjord.queries == {}
