"""WHERE conditions on GROUP BY columns alone are checked after the (shared) window aggregate,
as HAVING: the rows are exactly those of the query as written (planner `_group_filters_last`)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjords.engine import Engine
from fjords.runtime.fjord import Fjord
from fjords.schema import Schema

SCHEMA = Schema(
    [("time", "float"), ("station", "str"), ("speed", "float"), ("segment", "str")], time="time"
)
SEGMENTS = ["a", "b", "c", None]

_GROUP_FILTERS = [
    "segment IN ('a', 'b')",  # moved: the aggregate's gate lets a and b through
    "segment = 'c'",
    "'b' = segment",
    "segment IN ('a', NULL)",
    "",  # no condition on the groups: a user of every group, sharing the same aggregate
    "segment <> 'b'",  # not moved (no finite set of groups to feed the aggregate)
    "segment IS NULL",
    "segment BETWEEN 'b' AND 'c'",
]
_OTHER_FILTERS = ["", "speed > 20", "(speed > 40 OR segment = 'a')"]
_WINDOWS = ["[RANGE 1 MINUTE]", "[RANGE 2 MINUTES]", "[RANGE 2 MINUTES SLIDE 1 MINUTE]"]
_SELECTS = [
    ("segment, AVG(speed) AS v", ""),
    ("segment, COUNT(*) AS n, MAX(speed) AS top", " HAVING COUNT(*) > 1"),
    ("segment, SUM(speed) AS s", " ORDER BY s DESC LIMIT 1"),
]


def _queries(draw: st.DrawFn) -> list[str]:
    out = []
    for _ in range(draw(st.integers(1, 6))):
        sel, tail = draw(st.sampled_from(_SELECTS))
        conds = [draw(st.sampled_from(_GROUP_FILTERS)), draw(st.sampled_from(_OTHER_FILTERS))]
        where = " AND ".join(c for c in conds if c)
        window = draw(st.sampled_from(_WINDOWS))
        where = f" WHERE {where}" if where else ""
        out.append(f"SELECT {sel} FROM traffic {window}{where} GROUP BY segment{tail}")
    return out


@st.composite
def _case(draw: st.DrawFn) -> tuple[list[str], list[int], list[tuple]]:
    queries = _queries(draw)
    n = draw(st.integers(0, 120))
    t, rows = 0.0, []
    for i in range(n):
        t += draw(st.sampled_from([0.0, 5.0, 20.0, 61.0]))
        late = draw(st.integers(0, 9)) == 0  # now and then a reading from the past
        speed = draw(st.one_of(st.none(), st.sampled_from([10.0, 30.0, 55.5, 70.25])))
        rows.append((t - 90.0 if late else t, f"s{i % 3}", speed, draw(st.sampled_from(SEGMENTS))))
    # each query joins after some of the rows (a running aggregate it shares)
    starts = [draw(st.integers(0, n)) for _ in queries]
    return queries, starts, rows


def _run(
    queries: list[str], starts: list[int], rows: list[tuple], *, share: bool = True
) -> tuple[list, int]:
    f = Engine(Fjord(), share_group_filters=share)
    f.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    got: list[list[tuple]] = [[] for _ in queries]
    for i, row in enumerate([*rows, None]):
        for k, start in enumerate(starts):
            if start == i:
                rq = f.add_query(queries[k], query_id=f"q{k}")
                rq.sink.add_batch_callback(got[k].extend)
        if row is not None:
            f.fjord.push("traffic", row)
            f.fjord.run_until_idle()
    f.fjord.end_of_stream()
    f.fjord.run_until_idle()
    assert not f.fjord.failed
    return got, len(f.fjord._shared)


@settings(max_examples=150, deadline=None)
@given(case=_case())
def test_group_filters_after_the_aggregate_give_the_rows_as_written(
    case: tuple[list[str], list[int], list[tuple]],
) -> None:
    queries, starts, rows = case
    expect, apart = _run(queries, starts, rows, share=False)
    got, shared = _run(queries, starts, rows)
    assert got == expect
    assert shared <= apart


def test_dashboards_on_different_segments_share_one_aggregate() -> None:
    """200 Query 1 dashboards, each on its own segments: one aggregate, fed every reading once;
    each query's demand (what its sensors must send) still names its segments."""
    f = Engine(Fjord())
    f.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    for i in range(200):
        f.add_query(
            "SELECT segment, AVG(speed) AS v FROM traffic [RANGE 15 MINUTES] "
            f"WHERE segment IN ('S{i % 40}', 'S{(i + 7) % 40}') GROUP BY segment",
            query_id=f"q{i}",
        )
    assert len(f.fjord._shared) == 1
    demand = f.fjord.queries["q3"].demand
    assert ("segment", "in", frozenset({"S3", "S10"})) in demand.atoms
    # a condition on a non-group column keeps the aggregates apart
    f.add_query(
        "SELECT segment, AVG(speed) AS v FROM traffic [RANGE 15 MINUTES] "
        "WHERE segment = 'S1' AND speed > 50 GROUP BY segment",
        query_id="fast",
    )
    assert len(f.fjord._shared) == 2


def test_explain_says_which_conditions_run_after_the_aggregate() -> None:
    f = Engine(Fjord())
    f.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    sql = (
        "SELECT segment, AVG(speed) AS v FROM traffic [RANGE 1 MINUTE] "
        "WHERE segment IN ('a', 'b') AND speed > 3 GROUP BY segment"
    )
    plan = f.explain(sql)
    assert plan["predicates"] == ["speed > 3"]  # what the router indexes
    assert plan["group_filter"] == ["segment IN ('a', 'b')"]
    shared = f.add_query(sql).describe()["shared"]
    assert shared[0]["predicates"] == ["speed > 3"]
    assert shared[-1]["groups_of_this_query"] == ["segment IN ('a', 'b')"]
    # a sliding window too (its users are handed only their groups' rows: `fan_out`)
    slide = f.explain(sql.replace("[RANGE 1 MINUTE]", "[RANGE 2 MINUTES SLIDE 1 MINUTE]"))
    assert slide["group_filter"] == ["segment IN ('a', 'b')"]
    # a window of rows keeps the condition in the router (its windows are the rows it gets)
    rows = f.explain(sql.replace("[RANGE 1 MINUTE]", "[ROWS 10]"))
    assert "group_filter" not in rows
    assert rows["predicates"] == ["segment IN ('a', 'b')", "speed > 3"]


@pytest.mark.parametrize("window", ["[RANGE 1 MINUTE]", "[RANGE 2 MINUTES SLIDE 1 MINUTE]"])
def test_each_user_of_a_shared_aggregate_checks_only_its_groups(window: str) -> None:
    """A closing window of 40 segments goes to 40 dashboards of two segments each: each
    checks its own 2 rows (its HAVING and SELECT list), not all 40 (the close held the
    event loop for milliseconds at 200 dashboards, and every sample arriving waited)."""
    f = Engine(Fjord())
    f.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    got: dict[str, list] = {}
    for i in range(40):
        a, b = f"S{i}", f"S{(i + 7) % 40}"
        rq = f.add_query(
            f"SELECT segment, COUNT(*) AS n FROM traffic {window} "
            f"WHERE segment IN ('{a}', '{b}') GROUP BY segment HAVING COUNT(*) > 1",
            query_id=f"q{i}",
        )
        rq.sink.add_batch_callback(got.setdefault(rq.id, []).extend)
    (shared,) = f.fjord._shared.values()
    for k in range(40):
        reps = 2 if k % 2 else 1  # odd segments have two readings: HAVING keeps only those
        for _ in range(reps):
            f.fjord.push("traffic", (1.0, "s1", 5.0, f"S{k}"))
    f.fjord.push("traffic", (200.0, "s1", 5.0, "S0"))  # closes the first windows
    f.fjord.run_until_idle()
    for i in range(40):
        fin = shared.fanout.users[f"q{i}"][0]
        windows = 2 if "SLIDE" in window else 1  # (the reading at 1.0 is in two sliding windows)
        assert fin.tuples_in == 2 * windows  # its two groups' rows of each closed window
        want = sorted(s for s in (f"S{i}", f"S{(i + 7) % 40}") if int(s[1:]) % 2)
        assert sorted({r[0] for r in got[f"q{i}"]}) == want


def test_sharing_by_group_can_be_switched_off() -> None:
    """`share_group_filters=False` (`[runtime] share_group_filters = false`): each query keeps
    its condition in the router and aggregates only its own groups."""
    f = Engine(Fjord(), share_group_filters=False)
    f.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    for seg in ("a", "b"):
        f.add_query(
            "SELECT segment, AVG(speed) AS v FROM traffic [RANGE 1 MINUTE] "
            f"WHERE segment = '{seg}' GROUP BY segment"
        )
    assert len(f.fjord._shared) == 2
    assert all(
        q.plan.window is None or q.plan.window.gate is None for q in f.fjord.queries.values()
    )


def test_a_shared_aggregate_holds_only_the_groups_its_users_want() -> None:
    """Fed through its gate (the union of its users' groups), it never holds more groups than
    they would apart; a user leaving takes its groups along, and the limits scale with the
    users (what they could hold apart)."""
    f = Engine(Fjord())
    f.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    sql = "SELECT segment, COUNT(*) AS n FROM traffic [RANGE 1 MINUTE] WHERE segment {} GROUP BY segment"
    f.add_query(sql.format("IN ('a', 'b')"), query_id="ab")
    f.add_query(sql.format("= 'b'"), query_id="b")
    (shared,) = f.fjord._shared.values()
    limit = f.fjord.limits.max_groups_per_window
    assert shared.aggregate.limits.max_groups_per_window == 2 * limit
    seen: list[set] = []

    def groups_after(rows: list[tuple]) -> set:
        for r in rows:
            f.fjord.push("traffic", r)
        f.fjord.run_until_idle()
        agg = shared.aggregate
        return {k for panes in agg._panes.values() for k in panes} | set(agg._cur[0] or ())

    seen.append(groups_after([(1.0, "s1", 5.0, s) for s in ("a", "b", "c", None)]))
    assert seen[-1] == {"a", "b"}
    f.fjord.remove_query("ab")
    seen.append(groups_after([(2.0, "s1", 5.0, s) for s in ("a", "b", "c")]))
    assert shared.aggregate.limits.max_groups_per_window == limit
    assert dict(shared.gates[3]) == {"b": 1}
