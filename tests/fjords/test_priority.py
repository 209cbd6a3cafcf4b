"""PRIORITY n: parsed and bounded, set as the tickets of the query's operators (shared stages get
the highest of their queries'), shown in explain, and obeyed by the ticket scheduler."""

from __future__ import annotations

import itertools

import pytest

from fjords.compile.sql import ast
from fjords.compile.sql.parser import parse
from fjords.engine import Engine
from fjords.errors import QuerySyntaxError
from fjords.runtime.fjord import Fjord
from fjords.runtime.scheduler import (
    DEFAULT_SCHEDULER,
    RoundRobinScheduler,
    Scheduler,
    TicketScheduler,
    make_scheduler,
)
from fjords.schema import Schema

SCHEMA = Schema(
    [("time", "int"), ("station", "str"), ("speed", "float"), ("segment", "str")], time="time"
)
SELECT = "SELECT station, speed FROM traffic"
AGG = "SELECT segment, AVG(speed) AS v FROM traffic [RANGE 1 MINUTE] GROUP BY segment"


def new_engine(scheduler: Scheduler | None = None, *, fuse: bool = True) -> Engine:
    f = Engine(Fjord(scheduler), fuse=fuse)
    f.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    return f


# -- parsing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "priority"),
    [
        (SELECT, None),
        (f"{SELECT} PRIORITY 1", 1),
        (f"{SELECT} priority 1000", 1000),
        (f"{SELECT} PRIORITY +7", 7),
        (f"{SELECT} WHERE speed > 3 PRIORITY 250 LIFETIME 3 DAYS", 250),
        (f"{AGG} EMIT EVERY 30 SECONDS PRIORITY 42;", 42),
    ],
)
def test_priority_parses(sql: str, priority: int | None) -> None:
    q = parse(sql)
    assert q.priority == priority
    assert q.tickets == (ast.DEFAULT_PRIORITY if priority is None else priority)


@pytest.mark.parametrize(
    ("sql", "column", "words"),
    [
        (f"{SELECT} PRIORITY 0", 45, "from 1 to 1000 (got 0)"),
        (f"{SELECT} PRIORITY -5", 45, "from 1 to 1000 (got -5)"),
        (f"{SELECT} PRIORITY 1001", 45, "(got 1001)"),
        (f"{SELECT} PRIORITY {'9' * 40}", 45, "whole number from 1 to 1000"),
        (f"{SELECT} PRIORITY 1.5", 45, "(got 1.5)"),
        (f"{SELECT} PRIORITY 1e3", 45, "(got 1e3)"),
        (f"{SELECT} PRIORITY 5 PRIORITY 6", 47, "PRIORITY is given twice"),
        (f"{SELECT} PRIORITY", 44, "unexpected end of query"),
    ],
)
def test_priority_out_of_range_or_malformed_is_refused(sql: str, column: int, words: str) -> None:
    with pytest.raises(QuerySyntaxError) as e:
        parse(sql)
    assert words in str(e.value)
    assert (e.value.line, e.value.column) == (1, column)


def test_priority_is_reserved_but_can_be_quoted() -> None:
    with pytest.raises(QuerySyntaxError):
        parse("SELECT priority FROM traffic")
    q = parse('SELECT "priority" FROM traffic AS "priority"')
    assert q.select[0].expr.name == "priority"  # type: ignore[union-attr]
    assert q.priority is None


# -- tickets on the operators ---------------------------------------------------------------


def test_tickets_are_set_on_the_query_operators() -> None:
    f = new_engine()
    hi = f.add_query(f"{SELECT} PRIORITY 700", query_id="hi")
    lo = f.add_query(f"{SELECT} WHERE speed > 10", query_id="lo")
    assert {op.tickets for op in hi.operators} == {700}
    assert {op.tickets for op in lo.operators} == {ast.DEFAULT_PRIORITY}
    # The stream router serves both: it runs with the highest priority of its queries.
    router = f.fjord.streams["traffic"].router
    assert router.tickets == 700
    f.fjord.remove_query("hi")
    assert router.tickets == ast.DEFAULT_PRIORITY


def test_a_shared_aggregate_runs_with_the_highest_priority_of_its_queries() -> None:
    f = new_engine()
    a = f.add_query(f"{AGG} PRIORITY 20", query_id="a")
    b = f.add_query(f"{AGG} PRIORITY 900", query_id="b")
    shared = next(iter(f.fjord._shared.values()))
    assert shared.users == {"a", "b"}
    assert shared.aggregate.tickets == 900
    if not shared.fused:  # fused, the window's results go straight to each user
        assert shared.fanout.tickets == 900  # type: ignore[union-attr]
    assert {op.tickets for op in a.operators} == {20}  # its own Finish and Sink
    assert {op.tickets for op in b.operators} == {900}
    f.fjord.remove_query("b")
    assert shared.aggregate.tickets == 20
    assert f.fjord.streams["traffic"].router.tickets == 20


def test_priority_is_shown_in_explain_and_describe() -> None:
    f = new_engine()
    assert f.explain(f"{SELECT} PRIORITY 300")["priority"] == 300
    assert f.explain(SELECT)["priority"] == ast.DEFAULT_PRIORITY
    rq = f.add_query(f"{SELECT} PRIORITY 5", query_id="q")
    assert rq.describe()["priority"] == 5


# -- the scheduler obeys them ---------------------------------------------------------------


def _busy_pair(scheduler: Scheduler) -> tuple[Fjord, list, list]:
    """Two equally expensive queries with plenty of input: PRIORITY 1000 and PRIORITY 100
    (unfused, so their operators are scheduled rather than run inside the router)."""
    f = new_engine(scheduler, fuse=False)
    hi = f.add_query(f"{SELECT} PRIORITY 1000", query_id="hi")
    lo = f.add_query(f"{SELECT} PRIORITY 100", query_id="lo")
    for op in (*hi.operators, *lo.operators):
        op.batch = 1  # one tuple a transition: both stay busy for many turns
    f.fjord.push_many("traffic", ((t, f"st{t % 7}", 50.0, "S1") for t in range(40_000)))
    return f, hi.operators, lo.operators


def test_a_10x_priority_query_runs_10x_as_often_when_both_are_busy() -> None:
    # A fake clock that advances one unit per reading: every transition costs exactly 1.
    ticks = itertools.count()
    f, hi, lo = _busy_pair(TicketScheduler(clock=lambda: float(next(ticks))))
    f.fjord.run_until_idle(max_steps=22_000)
    hi_runs = sum(op.transitions for op in hi)
    lo_runs = sum(op.transitions for op in lo)
    assert lo_runs > 500
    assert 9.5 <= hi_runs / lo_runs <= 10.5
    # ... and, as charged: about 10x the CPU time.
    hi_cpu = sum(op.cpu_seconds for op in hi)
    lo_cpu = sum(op.cpu_seconds for op in lo)
    assert 9.5 <= hi_cpu / lo_cpu <= 10.5


def test_round_robin_ignores_priority() -> None:
    ticks = itertools.count()
    f, hi, lo = _busy_pair(RoundRobinScheduler(clock=lambda: float(next(ticks))))
    f.fjord.run_until_idle(max_steps=22_000)
    hi_runs = sum(op.transitions for op in hi)
    lo_runs = sum(op.transitions for op in lo)
    assert abs(hi_runs - lo_runs) <= 2


def test_make_scheduler_by_name() -> None:
    assert DEFAULT_SCHEDULER == "ticket"
    assert isinstance(make_scheduler(), TicketScheduler)
    assert isinstance(make_scheduler("round-robin"), RoundRobinScheduler)
    with pytest.raises(ValueError, match="ticket, round-robin"):
        make_scheduler("lottery")


# -- inside the fused router ------------------------------------------------------------------


def _ordered_fjord(queries: list[tuple[str, str]]) -> tuple[Fjord, list[str]]:
    """Fused queries, each recording when its sink gets a batch."""
    f = new_engine(RoundRobinScheduler())
    order: list[str] = []
    for qid, sql in queries:
        rq = f.add_query(sql, query_id=qid)
        assert rq.fused
        rq.sink.add_batch_callback(lambda rows, q=qid: order.append(q))
    return f, order


def test_fused_queries_get_a_batch_in_descending_priority() -> None:
    """Fused queries run inside the router's transition, where the scheduler cannot order
    them: the router hands a batch's rows to the highest PRIORITY first (arrival order, i.e.
    the index's, among equals), whatever the order of installation or of the index."""
    f, order = _ordered_fjord(
        [
            ("low", f"{SELECT} PRIORITY 10"),
            ("eq-low", f"{SELECT} WHERE station = 'st1' PRIORITY 20"),
            ("default", SELECT),
            ("range-mid", f"{SELECT} WHERE speed > 10 PRIORITY 500"),
            ("high", f"{SELECT} WHERE station = 'st1' PRIORITY 1000"),
            ("default2", f"{SELECT} WHERE speed < 90"),
        ]
    )
    f.fjord.push_many("traffic", [(t, "st1", 50.0, "S1") for t in range(10)])
    f.fjord.run_until_idle()
    assert order == ["high", "range-mid", "default", "default2", "eq-low", "low"]
    assert f.fjord.streams["traffic"].router.deliveries == 60


def test_equal_priorities_are_delivered_at_once_in_the_index_order() -> None:
    f, order = _ordered_fjord([("a", SELECT), ("b", f"{SELECT} WHERE station = 'st1'")])
    f.fjord.push_many("traffic", [(t, "st1", 50.0, "S1") for t in range(3)])
    f.fjord.run_until_idle()
    assert order == ["a", "b"]
    assert not f.fjord.streams["traffic"].router._deferred


def test_priority_order_follows_removal_and_shared_aggregates() -> None:
    f, order = _ordered_fjord(
        [("low", f"{SELECT} PRIORITY 10"), ("high", f"{SELECT} PRIORITY 900")]
    )
    f.add_query(f"{AGG} PRIORITY 20", query_id="agg")
    router = f.fjord.streams["traffic"].router
    shared = next(iter(f.fjord._shared.values()))
    assert router._priority[shared.router_key] == 20
    f.add_query(f"{AGG} PRIORITY 950", query_id="agg2")
    assert router._priority[shared.router_key] == 950
    f.fjord.remove_query("high")
    f.fjord.remove_query("agg2")
    assert router._priority[shared.router_key] == 20
    assert sorted(router._priorities.elements()) == [10, 20]
    f.fjord.push_many("traffic", [(t, "st1", 50.0, "S1") for t in range(3)])
    f.fjord.run_until_idle()
    assert order == ["low"]


def test_a_deferred_delivery_that_raises_fails_its_query_only() -> None:
    f, order = _ordered_fjord(
        [("low", f"{SELECT} PRIORITY 10"), ("high", f"{SELECT} PRIORITY 900")]
    )
    failed: list[tuple[str, str]] = []
    f.fjord.on_query_failed.append(lambda qid, reason: failed.append((qid, reason)))

    def boom(rows: list) -> None:
        raise RuntimeError("no")

    f.fjord.queries["high"].sink.add_batch_callback(boom)
    f.fjord.push_many("traffic", [(t, "st1", 50.0, "S1") for t in range(4)])
    f.fjord.run_until_idle()
    assert failed == [("high", "sink: RuntimeError: no")]
    assert order == ["high", "low"]  # its own callback ran before the raising one
    assert f.fjord.streams["traffic"].router.deliveries == 4
    f.fjord.push_many("traffic", [(t, "st1", 50.0, "S1") for t in range(4, 6)])
    f.fjord.run_until_idle()
    assert order == ["high", "low", "low"]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT a.station FROM traffic AS a [RANGE 5 MINUTES], weather AS w [RANGE 5 MINUTES] "
        "WHERE a.station = w.site PRIORITY 700",
        "SELECT station, speed FROM traffic UNION ALL SELECT site, rain FROM weather PRIORITY 700",
    ],
    ids=["join", "union"],
)
def test_every_stream_a_query_reads_runs_its_router_at_its_priority(sql: str) -> None:
    """A join's second stream and a union's every stream: their routers are shared stages of
    the query, so they run at its PRIORITY while it is installed."""
    f = new_engine()
    f.fjord.add_stream(
        "weather", Schema([("time", "float"), ("site", "str"), ("rain", "float")]), "site"
    )
    rq = f.add_query(sql)
    assert {n: s.router.tickets for n, s in f.fjord.streams.items()} == {
        "traffic": 700,
        "weather": 700,
    }
    f.fjord.remove_query(rq.id)
    assert {s.router.tickets for s in f.fjord.streams.values()} == {ast.DEFAULT_PRIORITY}
