"""A fused tumbling window closes in one batch (as for 100 windowed aggregates): the windows a
watermark closes go out in one fan-out delivery (`WindowAggregate._close_tumbling`), exactly the
rows, order, counters and budget of the general close, and whole Fjords give the rows of the
queued (unfused) path, with HAVING, ORDER BY/LIMIT (which stay unfused), late rows, queries
joining a running stream and several router batch sizes."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fjords.engine import Engine
from fjords.limits import Limits
from fjords.partial import Partial
from fjords.runtime.fjord import Fjord
from fjords.runtime.operators.aggregate import AggSpec, WindowAggregate
from fjords.runtime.operators.aggregate.columns import column_ref, key1_ref
from fjords.runtime.progress import ProgressPolicy, Watermark
from fjords.runtime.queues import PushQueue
from fjords.schema import Schema
from tests.fjords.doubles import Collect

_FUNCS = st.sampled_from(["COUNT", "SUM", "AVG", "MIN", "MAX", "COUNT(*)"])
_VALUE = st.one_of(
    st.floats(-100, 100, allow_nan=False),
    st.integers(-100, 100),
    st.none(),
    st.sampled_from([Partial.of([1.5, 4.0]), Partial(3)]),
)
_TIME = st.one_of(
    st.integers(0, 300),
    st.integers(0, 300_000).map(lambda ms: ms / 1000),
)
_ROWS = st.lists(st.tuples(_TIME, st.sampled_from("abc"), _VALUE), min_size=1, max_size=40)
# floats whose sums round (the order of additions shows), and plain ones
_FLOAT = st.one_of(
    st.integers(-(10**6), 10**6).map(lambda i: i / 997), st.floats(-100, 100, allow_nan=False)
)
_FLOATS = st.one_of(  # one kind of time per batch, as a stream's schema gives
    *(
        st.lists(
            st.tuples(t, st.sampled_from("abcd"), _FLOAT),
            min_size=1,
            max_size=40,
        )
        for t in (st.integers(0, 300), st.integers(0, 300_000).map(lambda ms: ms / 1000))
    )
)
_STEP = st.one_of(
    st.tuples(st.just("rows"), _ROWS),
    st.tuples(st.just("rows"), _FLOATS),  # the dense state's batches
    st.tuples(st.just("rows"), _FLOATS.map(lambda rs: sorted(rs, key=lambda r: r[0]))),
    st.tuples(st.just("rows"), _ROWS.map(lambda rs: sorted(rs, key=lambda r: r[0]))),
    st.tuples(st.just("close"), _TIME),
)


def _aggregate(
    specs: list[AggSpec],
    range_s: float,
    budget: int,
    start: float,
    fan: Callable[[list], object] | None = None,
) -> WindowAggregate:
    """An aggregate as the planner builds one; `fan`: fused, each delivery handed to it."""
    return WindowAggregate(
        PushQueue(),
        None if fan is not None else PushQueue(bound=1_000_000),
        key_fn=key1_ref(column_ref(1)),  # as the planner compiles `GROUP BY station`
        arg_fns=[column_ref(2)],
        specs=specs,
        time_index=0,
        range_s=range_s,
        start_time=start,
        fan=Collect(fan) if fan is not None else None,
        limits=Limits(max_windows_per_transition=budget),
    )


def _close(agg: WindowAggregate, limit: float) -> int:
    """Close up to `limit`, resuming a close cut short by the budget; the calls it took."""
    calls = 1
    while not agg._close(limit):
        calls += 1
    return calls


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    funcs=st.lists(_FUNCS, min_size=1, max_size=3),
    range_s=st.sampled_from([10, 60, 0.25, 1]),
    budget=st.integers(1, 4),
    start=st.sampled_from([-math.inf, 0, 30.5, 120]),
    dense_min=st.sampled_from([1, 5, 10**9]),
    steps=st.lists(_STEP, max_size=12),
)
def test_the_batched_tumbling_close_gives_the_rows_of_the_general_one(
    funcs: list[str], range_s: float, budget: int, start: float, dense_min: int, steps: list
) -> None:
    """Fused (a fan-out: `_close_tumbling`) against the per-row path and the general close
    into the output queue: the same rows in the same order, the same late rows, windows,
    bytes and budget slices."""
    _compare(funcs, range_s, budget, start, dense_min, steps)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    funcs=st.lists(st.sampled_from(["COUNT", "SUM", "AVG"]), min_size=1, max_size=3),
    range_s=st.sampled_from([10, 60, 0.25, 1]),
    budget=st.integers(1, 4),
    start=st.sampled_from([-math.inf, 0, 30.5]),
    dense_min=st.sampled_from([1, 5]),
    steps=st.lists(_STEP, max_size=12),
)
def test_the_dense_state_gives_the_rows_of_the_row_path(
    funcs: list[str], range_s: float, budget: int, start: float, dense_min: int, steps: list
) -> None:
    """COUNT/SUM/AVG of a float column (`_add_dense`: numpy, sums in arrival order), in and
    out of the dense state as NULLs, ints and partials come, against the row path: the same
    rows (averages to the last bit), order, late rows, windows and bytes."""
    _compare(funcs, range_s, budget, start, dense_min, steps)


def _compare(
    funcs: list[str], range_s: float, budget: int, start: float, dense_min: int, steps: list
) -> None:
    specs = [AggSpec("COUNT", None) if f == "COUNT(*)" else AggSpec(f, 0) for f in funcs]
    got: list = []
    fused = _aggregate(specs, range_s, budget, start, fan=got.extend)
    general, per_row = (_aggregate(specs, range_s, budget, start) for _ in range(2))
    fused.dense_min = dense_min
    for kind, arg in steps:
        for agg in (fused, general, per_row):
            if kind == "rows":
                if agg is per_row:
                    for t in arg:
                        agg._add(t)
                else:
                    agg.add_rows(list(arg))
            else:
                assert _close(agg, arg) >= 1
        assert fused.late == general.late == per_row.late
        assert fused._bytes == general._bytes == per_row._bytes
    assert _close(fused, math.inf) == _close(general, math.inf) == _close(per_row, math.inf)
    for agg in (fused, general, per_row):  # every pane's bytes uncounted as they were counted
        assert agg._bytes == 0 and not agg._pane_nb and not agg._panes and not agg._dense
    want = general.outputs[0].get_batch(10**9)  # type: ignore[attr-defined]
    assert repr(want) == repr(per_row.outputs[0].get_batch(10**9))  # type: ignore[attr-defined]
    assert repr([r for r in got if r.__class__ is tuple]) == repr(
        [r for r in want if r.__class__ is tuple]
    )
    assert got[-1] == want[-1] == Watermark(math.inf)
    for a in ("late", "windows_emitted", "tuples_out", "tuples_in", "_bytes", "_next_k"):
        assert getattr(fused, a) == getattr(general, a), a


def test_a_dense_sum_adds_each_value_in_arrival_order() -> None:
    """0.1 then (0.2, 0.3) in a later batch: ((0.1 + 0.2) + 0.3), as the row path adds,
    not 0.1 + (0.2 + 0.3)."""
    got: list = []
    agg = _aggregate(
        [AggSpec("SUM", 0), AggSpec("AVG", 0)], 60, budget=64, start=-math.inf, fan=got.extend
    )
    agg.dense_min = 1
    agg.add_rows([(1, "a", 0.1)])
    agg.add_rows([(2, "a", 0.2), (3, "a", 0.3)])
    assert agg._dense and not agg._panes
    _close(agg, math.inf)
    assert got[0] == ("a", ((0.1 + 0.2) + 0.3), ((0.1 + 0.2) + 0.3) / 3, 0.0, 60.0)
    assert ((0.1 + 0.2) + 0.3) != 0.1 + (0.2 + 0.3)


def test_one_watermark_closing_many_windows_is_one_delivery_within_the_budget() -> None:
    calls: list[list] = []
    agg = _aggregate([AggSpec("AVG", 0)], 10, budget=3, start=-math.inf, fan=calls.append)
    agg.add_rows([(float(t), "a", 1.0) for t in range(0, 100, 5)])  # 10 windows
    assert not agg._close(100.0)  # cut short after 3 windows: one delivery of their rows
    assert len(calls) == 1 and [r[2] for r in calls[0]] == [0.0, 10.0, 20.0]
    assert _close(agg, 100.0) == 3  # the rest resumed, 3 windows at a time
    assert [len(c) for c in calls] == [3, 3, 3, 1]
    assert agg.windows_emitted == 10 and agg.tuples_out == 10


# -- whole Fjords: fused against queued ------------------------------------------------------

SCHEMA = Schema(
    [("time", "int"), ("station", "str"), ("speed", "float"), ("segment", "str")], time="time"
)
STATIONS = [f"st{i}" for i in range(5)]


def _engine(fuse: bool) -> Engine:
    f = Engine(
        Fjord(
            max_lag=float("inf"),
            progress=ProgressPolicy(idle_timeout_s=float("inf")),
            limits=Limits(max_queries=10000, max_windows_per_transition=4),
        ),
        fuse=fuse,
    )
    f.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    return f


def _query(rng: random.Random) -> str:
    lo = round(rng.uniform(0, 60), 1)
    hi = round(lo + rng.uniform(1, 30), 1)
    window = rng.choice(
        ["[RANGE 1 MINUTES]", "[RANGE 15 MINUTES]", "[RANGE 2 MINUTES SLIDE 1 MINUTES]"]
    )
    agg = rng.choice(
        ["AVG(speed)", "SUM(speed)", "COUNT(speed)", "MAX(speed)", "AVG(speed), COUNT(*)"]
    )
    tail = rng.choice(
        [
            "",
            " HAVING COUNT(*) > 1",
            " HAVING AVG(speed) < 50",
            " ORDER BY segment DESC LIMIT 2",
        ]
    )
    return (
        f"SELECT segment, {agg} FROM traffic {window} WHERE speed >= {lo} AND speed < {hi} "
        f"GROUP BY segment{tail}"
    )


def _trace(rng: random.Random, n: int) -> list[tuple]:
    rows, t = [], 1_330_588_800
    for _ in range(n):
        t += rng.choice([0, 0, 7, 30, 60, 300])
        lag = rng.choice([0, 0, 0, 0, 400])  # now and then a reading from the past (late)
        rows.append(
            (t - lag, rng.choice(STATIONS), round(rng.uniform(0, 80) * 8) / 8, rng.choice("PQR"))
        )
    return rows


def _run(queries: list[str], rows: list[tuple], chunk: int, join_at: int, fuse: bool) -> tuple:
    f = _engine(fuse)
    out: dict[str, list] = {}

    def add(i: int, sql: str) -> None:
        q = f.add_query(sql, query_id=f"q{i}")
        out[q.id] = []
        q.sink.add_batch_callback(out[q.id].extend)

    for i, sql in enumerate(queries[:join_at]):
        add(i, sql)
    for k in range(0, len(rows), chunk):
        if k // chunk == 1:  # the rest join a running stream
            for i, sql in enumerate(queries[join_at:], join_at):
                add(i, sql)
        f.fjord.push_many("traffic", rows[k : k + chunk])
        f.fjord.run_until_idle()
    if len(out) < len(queries):
        for i, sql in enumerate(queries[len(out) :], len(out)):
            add(i, sql)
    f.fjord.end_of_stream()
    f.fjord.run_until_idle()
    assert not f.fjord.failed
    return out, f.fjord.streams["traffic"].router.late


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    n_queries=st.integers(1, 10),
    n_rows=st.integers(0, 400),
    chunk=st.sampled_from([1, 7, 64, 500]),
)
def test_fused_windowed_queries_give_the_queued_rows(
    seed: int, n_queries: int, n_rows: int, chunk: int
) -> None:
    rng = random.Random(seed)
    queries = [_query(rng) for _ in range(n_queries)]
    rows = _trace(rng, n_rows)
    join_at = rng.randrange(n_queries + 1)
    assert _run(queries, rows, chunk, join_at, True) == _run(queries, rows, chunk, join_at, False)


def test_many_keys_few_per_pane_stay_in_dicts() -> None:
    """Dense arrays are as long as the keys seen: with thousands of keys spread over
    thousands of panes they would outgrow the groups, so such a batch takes the row path."""
    got: list = []
    fused = _aggregate([AggSpec("AVG", 0)], 1, 64, -math.inf, fan=got.extend)
    general = _aggregate([AggSpec("AVG", 0)], 1, 64, -math.inf)
    fused.dense_min = 1
    fused.add_rows([(1, "a", 1.5), (2, "b", 2.5)])
    assert fused._dense  # a small batch: dense
    rows = [(t, f"k{t}", t / 7) for t in range(3, 3000)]
    fused.add_rows(rows)
    general.add_rows([(1, "a", 1.5), (2, "b", 2.5), *rows])
    assert not fused._dense and fused._panes  # moved back to dicts
    assert fused._bytes == general._bytes
    _close(fused, math.inf)
    _close(general, math.inf)
    want = general.outputs[0].get_batch(10**9)  # type: ignore[attr-defined]
    assert got == want


def test_a_large_delivery_of_floats_takes_the_dense_state() -> None:
    agg = _aggregate([AggSpec("AVG", 0)], 900, 64, -math.inf, fan=lambda rows: None)
    agg.add_rows([(1_330_588_800 + 60 * i, f"S{i % 40:02d}", i / 8) for i in range(4096)])
    assert agg._dense and not agg._panes and len(agg._pane_keys) == 274


def test_large_groups_go_back_to_dicts_for_good() -> None:
    """Query 1's shape (a few groups of many rows each): dicts update faster than numpy
    regroups, so the first dense batch that shows it moves the state back, for good."""
    got: list = []
    fused = _aggregate([AggSpec("AVG", 0)], 900, 64, -math.inf, fan=got.extend)
    general = _aggregate([AggSpec("AVG", 0)], 900, 64, -math.inf)
    fused.dense_min = 1
    rows = [(60 * (i // 40), f"S{i % 4}", i / 7) for i in range(4096)]
    fused.add_rows(rows[:2048])
    assert not fused._dense and not fused._dense_ok
    fused.add_rows(rows[2048:])
    general.add_rows(rows)
    assert not fused._dense
    _close(fused, math.inf)
    _close(general, math.inf)
    assert repr(got) == repr(general.outputs[0].get_batch(10**9))  # type: ignore[attr-defined]
