"""Fused delivery, per-batch routing, the tumbling fast path and the range index:
every optimisation gives exactly the rows of the reference (queued, per-row) path."""

from __future__ import annotations

import asyncio
import math
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fjords.engine import Engine
from fjords.limits import Limits
from fjords.partial import Partial
from fjords.runtime.fjord import Fjord
from fjords.runtime.interval_index import IntervalIndex
from fjords.runtime.operators.aggregate import AggSpec, Finish, WindowAggregate
from fjords.runtime.operators.aggregate.columns import column_ref, key1_ref, single_key
from fjords.runtime.operators.aggregate.panes import first_at
from fjords.runtime.predicate_index import PredicateIndex
from fjords.runtime.progress import ProgressPolicy
from fjords.runtime.queues import PushQueue
from fjords.schema import Schema
from tests.fjords.doubles import Collect

SCHEMA = Schema(
    [("time", "float"), ("station", "str"), ("speed", "float"), ("segment", "str")], time="time"
)
STATIONS = [f"st{i}" for i in range(6)]
SEGMENTS = ["S01", "S02", "S03"]


def new_engine(fuse: bool) -> Engine:
    f = Engine(
        Fjord(
            max_lag=float("inf"),
            progress=ProgressPolicy(idle_timeout_s=float("inf")),
            limits=Limits(max_queries=10000),
        ),
        fuse=fuse,
    )
    f.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    return f


def trace(rng: random.Random, n: int) -> list[tuple]:
    rows, t = [], 1_000_000.0
    for _ in range(n):
        t += rng.choice([0, 0, 1, 7.5, 30, 61])
        speed = None if rng.random() < 0.05 else round(rng.uniform(0, 80) * 4) / 4
        rows.append((t, rng.choice(STATIONS), speed, rng.choice(SEGMENTS)))
    return rows


def random_query(rng: random.Random) -> str:
    lo = round(rng.uniform(0, 70), 2)
    hi = round(lo + rng.uniform(0, 30), 2)
    conds = [
        f"speed >= {lo} AND speed < {hi}",
        f"speed > {lo}",
        f"speed <= {hi}",
        f"station = '{rng.choice(STATIONS)}'",
        f"segment IN ('{rng.choice(SEGMENTS)}', '{rng.choice(SEGMENTS)}')",
        f"speed * 2 > {lo}",
        f"station = '{rng.choice(STATIONS)}' AND speed < {hi}",
    ]
    where = rng.choice([*conds, None])
    w = f" WHERE {where}" if where else ""
    kind = rng.randrange(6)
    if kind == 0:
        return f"SELECT * FROM traffic{w}"
    if kind == 1:
        return f"SELECT station, speed FROM traffic{w}"
    if kind == 2:
        return f"SELECT speed + 1 AS s FROM traffic{w}"
    window = rng.choice(
        ["[RANGE 1 MINUTES]", "[RANGE 5 MINUTES]", "[RANGE 2 MINUTES SLIDE 1 MINUTES]"]
    )
    if kind == 3:
        return f"SELECT segment, AVG(speed), COUNT(*), MAX(speed) FROM traffic {window}{w} GROUP BY segment"
    if kind == 4:
        return f"SELECT COUNT(*), MIN(speed) FROM traffic {window}{w}"
    return f"SELECT segment, station, SUM(speed) FROM traffic {window}{w} GROUP BY segment, station"


def run(queries: list[str], rows: list[tuple], chunks: list[int], fuse: bool) -> dict:
    f = new_engine(fuse)
    out: dict[str, list] = {}
    for i, sql in enumerate(queries):
        q = f.add_query(sql, query_id=f"q{i}")
        out[q.id] = []
        q.sink.add_batch_callback(out[q.id].extend)
        assert q.fused == fuse
    push = f.fjord.streams["traffic"].queue.put
    i = 0
    k = 0
    while i < len(rows):
        n = chunks[k % len(chunks)]
        k += 1
        for t in rows[i : i + n]:
            push(t)
        i += n
        f.fjord.run_until_idle()
    f.fjord.end_of_stream()
    f.fjord.run_until_idle()
    assert not f.fjord.failed
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    n_queries=st.integers(1, 12),
    n_rows=st.integers(0, 400),
    chunks=st.lists(st.integers(1, 300), min_size=1, max_size=4),
)
def test_fused_delivery_gives_the_reference_rows_in_order(
    seed: int, n_queries: int, n_rows: int, chunks: list[int]
) -> None:
    rng = random.Random(seed)
    queries = [random_query(rng) for _ in range(n_queries)]
    rows = trace(rng, n_rows)
    assert run(queries, rows, chunks, True) == run(queries, rows, chunks, False)


def test_fused_queries_skip_the_scheduler_and_count_their_rows() -> None:
    f = new_engine(True)
    a = f.add_query("SELECT station FROM traffic WHERE speed > 10")
    b = f.add_query("SELECT * FROM traffic WHERE station = 'st1'")
    w = f.add_query("SELECT segment, AVG(speed) FROM traffic [RANGE 1 MINUTES] GROUP BY segment")
    assert a.fused and b.fused and w.fused
    assert not any(
        op in f.fjord.scheduler.operators for op in a.operators + b.operators + w.operators
    )
    for i in range(100):
        f.fjord.push("traffic", (float(i), f"st{i % 3}", float(i), "S01"))
    f.fjord.run_until_idle()
    assert a.sink.rows == 89 and a.operators[0].tuples_out == 89
    assert b.sink.rows == 33
    # the router ran one transition per batch: no step per delivered row
    assert f.fjord.scheduler.transitions <= 10


def test_a_slow_consumer_of_a_fused_query_is_bounded_and_its_drops_counted() -> None:
    async def main() -> None:
        f = new_engine(True)
        q = f.add_query("SELECT speed FROM traffic")
        aq = q.sink.attach_queue(maxsize=5)
        f.fjord.push_many("traffic", [(float(i), "st0", float(i), "S01") for i in range(50)])
        f.fjord.run_until_idle()
        assert aq.qsize() == 5 and q.sink.dropped == 45
        assert f.fjord.stats()["queries"][q.id]["dropped_results"] == 45
        assert [aq.get_nowait() for _ in range(5)] == [(float(i),) for i in range(45, 50)]

    asyncio.run(main())


def test_a_raising_sink_callback_fails_only_its_fused_query() -> None:
    f = new_engine(True)
    bad = f.add_query("SELECT * FROM traffic", query_id="bad")
    good = f.add_query("SELECT * FROM traffic", query_id="good")
    got: list = []
    good.sink.add_batch_callback(got.extend)

    def boom(rows: list) -> None:
        raise BrokenPipeError

    bad.sink.add_batch_callback(boom)
    f.fjord.push("traffic", (1.0, "st0", 5.0, "S01"))
    f.fjord.run_until_idle()
    assert f.fjord.failed["bad"].error is not None and f.fjord.failed["bad"].error.startswith(
        "sink: BrokenPipeError"
    )
    assert got == [(1.0, "st0", 5.0, "S01")]


def test_range_queries_picking_the_same_columns_share_their_projected_rows() -> None:
    """One projection per batch for all range queries picking the same plain columns: their
    rows are the same tuples, counted by each query's projection; a query with a residual or
    other columns is projected on its own; one whose consumer raises fails alone."""
    f = new_engine(True)
    a = f.add_query("SELECT station, speed FROM traffic WHERE speed >= 10 AND speed < 50")
    b = f.add_query("SELECT station, speed FROM traffic WHERE speed > 30")
    c = f.add_query("SELECT speed, station FROM traffic WHERE speed > 30")
    d = f.add_query("SELECT station, speed FROM traffic WHERE speed > 30 AND speed * 2 > 90")
    bad = f.add_query("SELECT station, speed FROM traffic WHERE speed > 20", query_id="bad")
    got: dict[str, list] = {q.id: [] for q in (a, b, c, d)}
    for q in (a, b, c, d):
        q.sink.add_batch_callback(got[q.id].extend)

    def boom(rows: list) -> None:
        raise BrokenPipeError

    bad.sink.add_batch_callback(boom)
    rows = [(float(i), f"st{i % 3}", float(i % 60), "S01") for i in range(200)]
    for size in (100, 7):  # the numpy path, then value by value
        f.fjord.push_many("traffic", rows[:size])
        f.fjord.run_until_idle()
        rows = rows[size:]
    sent = [(float(i), f"st{i % 3}", float(i % 60), "S01") for i in range(107)]
    assert got[a.id] == [(t[1], t[2]) for t in sent if 10 <= t[2] < 50]
    assert got[b.id] == [(t[1], t[2]) for t in sent if t[2] > 30]
    assert got[c.id] == [(t[2], t[1]) for t in sent if t[2] > 30]
    assert got[d.id] == [(t[1], t[2]) for t in sent if t[2] > 45]
    shared = {id(r) for r in got[a.id]} & {id(r) for r in got[b.id]}
    assert shared and len(shared) == len([t for t in sent if 30 < t[2] < 50])
    assert not {id(r) for r in got[c.id]} & {id(r) for r in got[b.id]}
    assert a.operators[0].tuples_out == a.sink.rows == len(got[a.id])
    assert b.operators[0].tuples_in == len(got[b.id])
    assert f.fjord.failed["bad"].error is not None
    assert f.fjord.failed["bad"].error.startswith("sink: BrokenPipeError")


def test_a_row_a_shared_projection_cannot_pick_fails_only_the_queries_picking_it() -> None:
    """A malformed row (too short for one projection's columns) fails the queries that pick
    them, as each would alone; the queries picking other columns get their rows."""
    f = new_engine(True)
    f.add_query("SELECT station, segment FROM traffic WHERE speed > 10", query_id="a")
    f.add_query("SELECT station, segment FROM traffic WHERE speed > 20", query_id="b")
    c = f.add_query("SELECT station, speed FROM traffic WHERE speed > 10", query_id="c")
    got: list = []
    c.sink.add_batch_callback(got.extend)
    rows = [(float(i), "st0", 50.0, "S01") for i in range(40)]
    f.fjord.push_many("traffic", [*rows[:20], (20.0, "st0", 50.0), *rows[21:]])
    f.fjord.run_until_idle()
    assert set(f.fjord.failed) == {"a", "b"}
    assert f.fjord.failed["a"].error is not None and f.fjord.failed["a"].error.startswith("project")
    assert got == [("st0", 50.0)] * 40


def test_push_many_keeps_the_queue_bound_and_counts_drops() -> None:
    q = PushQueue(bound=4)
    q.put_many([1, 2, 3])
    q.put_many([4, 5, 6])
    assert q.get_batch(10) == [3, 4, 5, 6] and q.drops == 2 and q.puts == 6


def test_route_batch_delivers_each_query_one_list_in_arrival_order() -> None:
    idx = PredicateIndex()
    got: dict[str, list] = {}
    from fjords.runtime.predicate_index import Atom

    for key, atoms in {
        "lo": [Atom(0, ">=", 0), Atom(0, "<", 5)],
        "eq": [Atom(1, "=", "a")],
        "all": [],
    }.items():
        idx.add(
            key, atoms, None, lambda t: None, lambda rows, k=key: got.setdefault(k, []).append(rows)
        )
    rows = [(3, "a"), (7, "b"), (1, "b"), (4, "a")]
    assert idx.route_batch(rows) == 3 + 2 + 4
    assert got == {
        "lo": [[(3, "a"), (1, "b"), (4, "a")]],
        "eq": [[(3, "a"), (4, "a")]],
        "all": [rows],
    }


# -- the range index ----------------------------------------------------------------------------


def _brute(items: dict, v: float) -> set:
    out = set()
    for key, (lo, li, hi, hi_incl) in items.items():
        if lo is not None and (v < lo or (v == lo and not li)):
            continue
        if hi is not None and (v > hi or (v == hi and not hi_incl)):
            continue
        out.add(key)
    return out


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["add", "add", "add", "remove", "stab"]),
            st.integers(0, 40),
            st.one_of(st.none(), st.integers(0, 20)),
            st.booleans(),
            st.one_of(st.none(), st.integers(0, 20)),
            st.booleans(),
        ),
        max_size=120,
    )
)
def test_interval_index_stabs_like_brute_force(ops: list) -> None:
    iv = IntervalIndex()
    items: dict = {}
    for op, key, lo, li, hi, hi_incl in ops:
        if op == "add" and key not in items:
            items[key] = (lo, li, hi, hi_incl)
            iv.add(key, lo, li, hi, hi_incl, (None, None, key, None))
        elif op == "remove":
            items.pop(key, None)
            iv.remove(key)
        else:
            for v in (lo if lo is not None else 0, (hi or 0) + 0.5, -1, 25):
                assert {e[2] for e in iv.stab(v)} == _brute(items, v), (v, items)
    for v in [x / 2 for x in range(-2, 46)]:
        assert {e[2] for e in iv.stab(v)} == _brute(items, v)


def test_interval_index_memory_grows_with_queries_not_overlap() -> None:
    """n intervals that all overlap (an index of segments would store each in ~2n: n^2)."""

    def stored(n: int) -> int:
        iv = IntervalIndex()
        for i in range(n):
            iv.add(i, i, True, 10 * n + i, False, (None, None, i, None))
        iv.stab(5)  # (re)build
        events = sum(map(len, iv._starts.values())) + sum(map(len, iv._ends.values()))
        return sum(map(len, iv._snaps)) + events

    for n in (100, 1000, 4000):
        assert stored(n) <= 4 * n


# -- the tumbling fast path ---------------------------------------------------------------------


def test_a_one_column_group_key_is_recognised_and_emitted_as_a_tuple() -> None:
    f = new_engine(True)
    q = f.add_query("SELECT segment, COUNT(*) FROM traffic [RANGE 1 MINUTES] GROUP BY segment")
    assert q.shared is not None
    agg = q.shared.aggregate
    assert isinstance(agg, WindowAggregate) and agg._bare
    assert single_key(lambda t: (t[0], t[1])) is None
    got: list = []
    q.sink.add_batch_callback(got.extend)
    f.fjord.push_many(
        "traffic", [(0.0, "st0", 1.0, "S01"), (1.0, "st1", 2.0, "S02"), (2.0, "st0", 3.0, "S01")]
    )
    f.fjord.end_of_stream()
    f.fjord.run_until_idle()
    assert sorted(got) == [("S01", 2, 0.0, 60.0), ("S02", 1, 0.0, 60.0)]


def test_late_rows_after_a_window_closed_are_counted_by_the_fast_path() -> None:
    agg = WindowAggregate(
        PushQueue(),
        PushQueue(),
        key_fn=lambda t: (),
        arg_fns=[],
        specs=[],
        time_index=0,
        range_s=10,
    )
    agg.add_rows([(1.0,), (2.0,), (15.0,)])
    agg._close(10.0)
    agg.add_rows([(3.0,), (16.0,)])
    assert agg.late == 1 and agg.tuples_in == 5


def test_a_raising_having_fails_only_its_user_of_a_fused_shared_aggregate() -> None:
    f = new_engine(True)
    base = "SELECT segment, AVG(speed) AS a FROM traffic [RANGE 1 MINUTES] GROUP BY segment"
    # (HAVING does not take part in sharing: both use one aggregate)
    good = f.add_query(base, query_id="good")
    prep = f.prepare(base + " HAVING AVG(speed) > 0", query_id="bad")

    def boom(row: tuple) -> None:
        raise ZeroDivisionError("division by zero")

    prep.plan.operators[0].finalize = boom  # type: ignore[attr-defined]
    prep.plan.operators[0].batch_finalize = None  # type: ignore[attr-defined]
    bad = f.add_query(prep)
    assert bad.shared is good.shared  # one aggregate
    got: list = []
    good.sink.add_batch_callback(got.extend)
    f.fjord.push_many("traffic", [(float(t), "st0", 10.0, "S01") for t in range(0, 200, 10)])
    f.fjord.end_of_stream()
    f.fjord.run_until_idle()
    assert list(f.fjord.failed) == ["bad"]
    assert f.fjord.failed["bad"].error.startswith("having+select: ZeroDivisionError")  # type: ignore[union-attr]
    assert [r[2] for r in got] == [0.0, 60.0, 120.0, 180.0] and good.state == "running"


# -- Query 1's shape: `_add_columns` and the pane bounds by comparison ---------------------------

_FUNCS = st.sampled_from(["COUNT", "SUM", "AVG", "MIN", "MAX", "COUNT(*)"])
_VALUE = st.one_of(
    st.floats(-100, 100, allow_nan=False),
    st.integers(-100, 100),
    st.none(),
    st.sampled_from([Partial.of([1.5, 4.0]), Partial(3), Partial.of([-2.0])]),
)
_TIME = st.one_of(
    st.integers(0, 120),  # seconds as ints (METR-LA)
    st.integers(0, 120_000).map(lambda ms: ms / 1000),  # and floats, bounds included
    st.floats(0, 120, allow_nan=False),
)
_ROWS = st.lists(st.tuples(_TIME, st.sampled_from("ab"), _VALUE), min_size=1, max_size=40)
_STEP = st.one_of(
    st.tuples(st.just("rows"), _ROWS),
    st.tuples(st.just("rows"), _ROWS.map(lambda rs: sorted(rs, key=lambda r: r[0]))),  # in order
    st.tuples(st.just("close"), _TIME),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    funcs=st.lists(_FUNCS, min_size=1, max_size=3),
    window=st.sampled_from([(10, None), (60, None), (60, 20), (0.25, None), (1, None)]),
    steps=st.lists(_STEP, max_size=12),
)
def test_the_query1_fast_path_gives_the_rows_of_the_general_one(
    funcs: list[str], window: tuple, steps: list
) -> None:
    """One GROUP BY column and one aggregated column (`_add_columns`, MIN/MAX and the row
    count kept only when asked) against the per-row `_add`: the same windows, rows and late counts, for int and
    float times on and around pane bounds, NULLs, ints, floats and motes' partials."""
    specs = [AggSpec("COUNT", None) if f == "COUNT(*)" else AggSpec(f, 0) for f in funcs]
    outs: list[list] = [[], []]
    aggs = []
    for out in outs:
        agg = WindowAggregate(
            PushQueue(),
            key_fn=key1_ref(column_ref(1)),  # as the planner compiles `GROUP BY station`
            arg_fns=[column_ref(2)],
            specs=specs,
            time_index=0,
            range_s=window[0],
            slide_s=window[1],
            fan=Collect(out.extend),
        )
        aggs.append(agg)
    fast, slow = aggs
    assert fast._key_col == 1 and fast._arg_col == 2
    assert fast._minmax == any(f in ("MIN", "MAX") for f in funcs)
    assert fast._lean == all(f in ("COUNT", "SUM", "AVG") for f in funcs)
    for kind, arg in steps:
        if kind == "rows":
            fast.add_rows(arg)
            for t in arg:
                slow._add(t)
        else:
            for a in aggs:
                a._close(arg)
    for a in aggs:
        a._close(math.inf)
    assert repr(outs[0]) == repr(outs[1])
    assert fast.late == slow.late


def test_pane_bounds_by_comparison_match_the_floor_rule() -> None:
    """`first_at`: `lo <= ts < hi` exactly when `floor(ts * 1000) // pane` is the pane."""
    rng = random.Random(5)
    for pane_ms in (1, 7, 250, 1000, 900_000):
        for _ in range(2000):
            p = rng.randrange(-(10**6), 10**6)
            lo, hi = first_at(p * pane_ms), first_at((p + 1) * pane_ms)
            for ts in (lo, hi, math.nextafter(lo, -math.inf), math.nextafter(hi, -math.inf)):
                assert (lo <= ts < hi) == (math.floor(ts * 1000) // pane_ms == p)


def test_finalize_batch_equals_finalize_per_row() -> None:
    """The planner's per-window finalize (the rows as they are, or picked columns) gives what
    finalize gives row by row."""
    f = new_engine(True)
    for sql in (
        "SELECT segment, AVG(speed) AS a FROM traffic [RANGE 1 MINUTES] GROUP BY segment",
        "SELECT AVG(speed), segment FROM traffic [RANGE 1 MINUTES] GROUP BY segment",
        "SELECT MAX(speed) FROM traffic [RANGE 1 MINUTES]",
        "SELECT segment, COUNT(*), MIN(speed) FROM traffic [RANGE 1 MINUTES] GROUP BY segment",
    ):
        finish = f.plan(sql).operators[0]
        assert isinstance(finish, Finish) and finish.batch_finalize is not None
        width = 2 + sql.count("(") + ("GROUP BY" in sql)
        rows = [tuple(f"{i}.{j}" for j in range(width)) for i in range(5)]
        assert finish.batch_finalize(list(rows)) == [finish.finalize(r) for r in rows], sql
    having = f.plan(
        "SELECT segment FROM traffic [RANGE 1 MINUTES] GROUP BY segment HAVING COUNT(*) > 1"
    )
    assert having.operators[0].batch_finalize is None  # type: ignore[attr-defined]
