"""Operators, one by one, driven directly through their queues."""

from __future__ import annotations

import asyncio
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from fjords.engine import Engine
from fjords.runtime.operators.aggregate import AggSpec, WindowAggregate
from fjords.runtime.operators.joins import IndexJoin, SymmetricHashJoin, ZipperJoin, ZipperMerge
from fjords.runtime.operators.scan import TableScan
from fjords.runtime.operators.simple import Multiplex, Project, Select
from fjords.runtime.operators.sink import QuerySink
from fjords.runtime.progress import Watermark
from fjords.runtime.queues import PullQueue, PushQueue
from fjords.schema import Schema
from fjords.tables import Table


def drain(*ops) -> None:
    while any(op.transition() for op in ops):
        pass


def rows(q: PushQueue) -> list[tuple]:
    return [i for i in q.get_batch(10**9) if i.__class__ is tuple]


def test_select_project_multiplex_pass_watermarks() -> None:
    a, b, c1, c2 = PushQueue(), PushQueue(), PushQueue(), PushQueue()
    sel = Select(lambda t: t[1] > 1, a, b)
    b2 = PushQueue()
    proj = Project([lambda t: t[1] * 10], b, b2)
    mux = Multiplex(b2, [c1, c2])
    for i in range(4):
        a.put((i, i))
    a.put(Watermark(3))
    drain(sel, proj, mux)
    assert c1.get_batch(10) == [(20,), (30,), Watermark(3)]
    out2 = c2.get_batch(10)
    assert out2[0] is not None and out2 == [(20,), (30,), Watermark(3)]


# -- windowed aggregates ------------------------------------------------------------------

SPECS = [
    AggSpec("COUNT", None),
    AggSpec("SUM", 0),
    AggSpec("AVG", 0),
    AggSpec("MIN", 0),
    AggSpec("MAX", 0),
]


def run_agg(
    data: list[tuple[int, str, float]], range_s: float, slide_s: float, rows_mode: bool = False
) -> list:
    inp, out = PushQueue(10**6), PushQueue(10**6)
    op = WindowAggregate(
        inp,
        out,
        key_fn=lambda t: (t[1],),
        arg_fns=[lambda t: t[2]],
        specs=SPECS,
        time_index=0,
        range_s=range_s,
        slide_s=slide_s,
        rows=rows_mode,
    )
    for t in data:
        inp.put(t)
    inp.put(Watermark(math.inf))
    drain(op)
    return rows(out)


def brute_force(data: list[tuple[int, str, float]], range_s: float, slide_s: float) -> list:
    out = []
    if not data:
        return out
    lo = min(t for t, _, _ in data)
    hi = max(t for t, _, _ in data)
    k = math.floor((lo - range_s) / slide_s)
    while k * slide_s <= hi:
        ws, we = k * slide_s, k * slide_s + range_s
        groups: dict[str, list[float]] = {}
        for t, g, v in data:
            if ws <= t < we:
                groups.setdefault(g, []).append(v)
        for g, vs in groups.items():
            out.append(
                (g, len(vs), sum(vs), sum(vs) / len(vs), min(vs), max(vs), float(ws), float(we))
            )
        k += 1
    return out


def _close(a: list, b: list) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x[0] != y[0] or x[1] != y[1] or x[4:] != y[4:]:
            return False
        if not (math.isclose(x[2], y[2], abs_tol=1e-9) and math.isclose(x[3], y[3], abs_tol=1e-9)):
            return False
    return True


stream_strategy = st.lists(
    st.tuples(st.integers(0, 40), st.sampled_from("ab"), st.integers(-50, 50).map(float)),
    max_size=60,
).map(lambda xs: sorted(xs, key=lambda x: x[0]))


@settings(max_examples=150, deadline=None)
@given(
    data=stream_strategy, window=st.sampled_from([(5, 5), (10, 5), (6, 4), (9, 3), (1, 1), (4, 6)])
)
def test_time_windows_equal_brute_force(data: list, window: tuple[int, int]) -> None:
    range_s, slide_s = window
    got = run_agg(data, range_s, slide_s)
    want = brute_force(data, range_s, slide_s)
    key = lambda r: (r[6], r[0])  # noqa: E731
    assert _close(sorted(got, key=key), sorted(want, key=key))


@settings(max_examples=100, deadline=None)
@given(data=stream_strategy, n=st.integers(1, 6), m=st.integers(1, 6))
def test_row_windows_equal_brute_force(data: list, n: int, m: int) -> None:
    got = run_agg(data, n, m, rows_mode=True)
    want = []
    for end in range(m, len(data) + 1, m):
        # "The last n rows, every m rows": a window ending early holds the rows it has.
        window = data[max(0, end - n) : end]
        if not window:
            continue
        groups: dict[str, list[float]] = {}
        for _, g, v in window:
            groups.setdefault(g, []).append(v)
        for g, vs in groups.items():
            want.append((g, len(vs), sum(vs), sum(vs) / len(vs), min(vs), max(vs)))
    trimmed = [r[:6] for r in got]
    # The end of input also closes the trailing partial windows; compare the complete ones.
    complete = len(want)
    assert _close([(*r, 0, 0) for r in trimmed[:complete]], [(*r, 0, 0) for r in want])


def test_tumbling_windows_align_to_epoch_multiples() -> None:
    got = run_agg([(1_330_588_801, "a", 1.0), (1_330_589_699, "a", 3.0)], 900, 900)
    assert got == [("a", 2, 4.0, 2.0, 1.0, 3.0, 1_330_588_800.0, 1_330_589_700.0)]


def test_windows_close_on_watermark_not_before() -> None:
    inp, out = PushQueue(), PushQueue()
    op = WindowAggregate(
        inp,
        out,
        key_fn=lambda t: (),
        arg_fns=[lambda t: t[1]],
        specs=SPECS[:1],
        time_index=0,
        range_s=10,
    )
    inp.put((1, 5.0))
    inp.put((9, 5.0))
    inp.put(Watermark(9.5))
    drain(op)
    assert rows(out) == []
    inp.put(Watermark(10))
    drain(op)
    assert rows(out) == [(2, 0.0, 10.0)]


def test_nulls_are_ignored_by_aggregates_but_counted_by_count_star() -> None:
    got = run_agg([(0, "a", None), (1, "a", 4.0)], 10, 10)  # type: ignore[list-item]
    assert got == [("a", 2, 4.0, 4.0, 4.0, 4.0, 0.0, 10.0)]


# -- joins ---------------------------------------------------------------------------------


def test_symmetric_hash_join_finds_all_pairs_and_cleans_by_window() -> None:
    left, right, out = PushQueue(), PushQueue(), PushQueue()
    j = SymmetricHashJoin(
        left,
        right,
        out,
        left_key=lambda t: t[1],
        right_key=lambda t: t[1],
        left_time=0,
        right_time=0,
        window=10,
    )
    left.put((1, "x", "L1"))
    right.put((2, "x", "R1"))
    right.put((3, "y", "R2"))
    left.put((4, "y", "L2"))
    drain(j)
    assert sorted(rows(out)) == [(1, "x", "L1", 2, "x", "R1"), (4, "y", "L2", 3, "y", "R2")]
    left.put(Watermark(100))
    right.put(Watermark(100))
    drain(j)
    assert j.sizes == [0, 0] and j.evicted == 4  # everything older than 100 - 10 is gone
    left.put((101, "x", "L3"))
    drain(j)
    assert rows(out) == []  # R1 was evicted: no stale match


def test_hash_join_cleaner_runs_at_fill_threshold() -> None:
    left, right, out = PushQueue(), PushQueue(), PushQueue()
    j = SymmetricHashJoin(
        left,
        right,
        out,
        left_key=lambda t: t[1],
        right_key=lambda t: t[1],
        left_time=0,
        right_time=0,
        window=5,
        fill_threshold=50,
    )
    left.put(Watermark(1000))
    right.put(Watermark(1000))
    for i in range(1000):
        left.put((i, i % 7))
    drain(j)
    assert j.sizes[0] <= 51


def test_index_join_pulls_the_table_and_reloads_it(tmp_path) -> None:
    path = tmp_path / "incidents.csv"
    path.write_text("incident_id,segment,description\nI1,S1,crash\nI2,S2,roadwork\nI3,S1,debris\n")
    table = Table.from_file("incidents", path)
    buffer = PushQueue()
    scan = TableScan(table, buffer)
    pull = PullQueue(scan, buffer)
    stream, out = PushQueue(), PushQueue()
    j = IndexJoin(
        stream, pull, out, stream_key=lambda t: t[1], table_key=lambda r: r[1], table_width=3
    )
    assert scan.transitions == 0 and not scan.exhausted  # nothing pulled before it is needed
    stream.put((10, "S1"))
    stream.put((11, "S3"))
    drain(j)
    assert rows(out) == [(10, "S1", "I1", "S1", "crash"), (10, "S1", "I3", "S1", "debris")]
    assert scan.exhausted
    import os

    path.write_text("incident_id,segment,description\nI9,S3,fire\n")
    os.utime(path, ns=(1, 1))
    assert table.reload_if_changed()
    stream.put((12, "S3"))
    drain(j)
    assert rows(out) == [(12, "S3", "I9", "S3", "fire")]


def test_index_join_outer_pads_with_null() -> None:
    table = Table("t", Schema([("k", "str"), ("v", "int")], time=None), [("a", 1)])
    stream, out = PushQueue(), PushQueue()
    j = IndexJoin(
        stream,
        _pull(table),
        out,
        stream_key=lambda t: t[0],
        table_key=lambda r: r[0],
        table_width=2,
        outer=True,
    )
    stream.put(("a",))
    stream.put(("b",))
    drain(j)
    assert rows(out) == [("a", "a", 1), ("b", None, None)]


def test_zipper_join_pairs_within_band_and_outer_joins_at_band_end() -> None:
    up, down, out = PushQueue(), PushQueue(), PushQueue()
    z = ZipperJoin(up, down, out, left_time=0, right_time=0, left_width=2, right_width=2, band=0.5)
    for t in (1.0, 2.0, 3.0):
        up.put((t, "u"))
    for t in (1.2, 3.4, 5.0):
        down.put((t, "d"))
    drain(z)
    got = rows(out)
    assert got[:3] == [(1.0, "u", 1.2, "d"), (2.0, "u", None, None), (3.0, "u", 3.4, "d")]
    assert z.buffers[1]  # 5.0 waits: the upstream has not passed 5.5 yet
    up.put(Watermark(6.0))
    drain(z)
    assert rows(out) == [(None, None, 5.0, "d")]
    assert z.unmatched == 2


def test_zipper_merge_outputs_in_time_order_once_every_input_has_passed() -> None:
    """UNION ALL: a row waits until every input's watermark reached its time; the hidden time
    column (the last) is cut off; the merge's watermark is the least of the inputs'."""
    a, b, out = PushQueue(), PushQueue(), PushQueue()
    m = ZipperMerge([a, b], out, times=[1, 1], width=1)
    for t in (3.0, 1.0, 2.0):  # a stream's sensors interleave: not in time order
        a.put(("a", t))
    b.put(("b", 1.5))
    a.put(Watermark(3.0))
    drain(m)
    assert rows(out) == []  # b has promised nothing yet
    b.put(Watermark(2.0))
    drain(m)
    assert out.get_batch(10) == [("a",), ("b",), ("a",), Watermark(2.0)]
    b.put(("b", 2.5))
    b.put(Watermark(10.0))
    drain(m)
    assert out.get_batch(10) == [("b",), ("a",), Watermark(3.0)]
    a.put(Watermark(math.inf))
    drain(m)
    assert not m.held and out.get_batch(10) == [Watermark(10.0)]


def test_zipper_merge_does_not_wait_for_an_idle_input() -> None:
    """An input whose stream has no sensor holding it (none yet, or all quiet) is not waited
    for; once it holds again, it is."""
    a, b, out = PushQueue(), PushQueue(), PushQueue()
    b_holds = [False]
    m = ZipperMerge(
        [a, b], out, times=[1, 1], width=1, idle=[lambda: False, lambda: not b_holds[0]]
    )
    a.put(("a", 1.0))
    a.put(("a", 2.0))
    a.put(Watermark(1.5))
    drain(m)
    assert out.get_batch(10) == [("a",), Watermark(1.5)]  # b idle: only a's promise counts
    b_holds[0] = True
    a.put(Watermark(3.0))
    drain(m)
    assert rows(out) == []  # b has a sensor now: its rows before 2.0 may still come
    b.put(("b", 1.8))
    b.put(Watermark(2.5))
    drain(m)
    assert out.get_batch(10) == [("b",), ("a",), Watermark(2.5)]


def test_a_union_with_a_stream_without_sensors_still_flows() -> None:
    """`traffic UNION ALL weather` where no weather sensor exists yet: traffic's rows come as
    traffic's progress allows, not after max_union_held_rows."""
    from fjords.runtime.fjord import Fjord

    f = Engine(Fjord())
    f.fjord.add_stream(
        "traffic",
        Schema([("time", "float"), ("station", "str"), ("speed", "float")]),
        sensor_field="station",
    )
    f.fjord.add_stream(
        "weather",
        Schema([("time", "float"), ("site", "str"), ("rain", "float")]),
        sensor_field="site",
    )
    rq = f.add_query(
        "SELECT station AS who, speed AS v FROM traffic UNION ALL SELECT site, rain FROM weather"
    )
    out: list[tuple] = []
    rq.sink.add_batch_callback(out.extend)
    f.fjord.push_many("traffic", [(t, "s1", 50.0 + t) for t in (1.0, 2.0, 3.0)])
    f.fjord.run_until_idle()
    assert out == [("s1", 51.0), ("s1", 52.0), ("s1", 53.0)]


@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 50)), max_size=60),
    st.integers(1, 8),
)
@settings(max_examples=100, deadline=None)
def test_zipper_merge_never_goes_back_in_time_and_loses_nothing_it_need_not(
    events: list[tuple[int, int]], step: int
) -> None:
    """Three inputs, rows at most `step` behind their input's last watermark: the output is in
    time order and holds every row (nothing forced, nothing dropped)."""
    qs = [PushQueue(), PushQueue(), PushQueue()]
    out = PushQueue()
    m = ZipperMerge(qs, out, times=[0, 0, 0], width=2)
    marks = [0, 0, 0]
    sent = []
    for i, (side, t) in enumerate(events):
        t = max(t, marks[side])  # never behind the input's own watermark (as the router)
        qs[side].put((t, i))
        sent.append((t, i))
        if i % step == 0:
            marks[side] = t
            qs[side].put(Watermark(t))
            drain(m)
    for q in qs:
        q.put(Watermark(math.inf))
    drain(m)
    got = rows(out)
    assert [r[0] for r in got] == sorted(r[0] for r in got)
    assert sorted(got) == sorted(sent)
    assert m.forced == m.dropped == 0


def test_zipper_merge_is_bounded_forces_the_earliest_and_drops_what_would_go_back() -> None:
    fast, slow, out = PushQueue(), PushQueue(), PushQueue()
    m = ZipperMerge([fast, slow], out, times=[0, 0], width=1, max_held=2)
    for t in (1, 2, 3, 4):
        fast.put((t,))
    fast.put(Watermark(4))
    drain(m)
    assert rows(out) == [(1,), (2,)] and m.forced == 2  # the slow input said nothing
    slow.put((0,))  # behind what was already output: dropped, counted
    slow.put(Watermark(5))
    drain(m)
    assert rows(out) == [(3,), (4,)] and m.dropped == 1
    assert m.describe()["dropped"] == 1


async def test_sink_async_queue_is_bounded_and_drops_oldest() -> None:
    q = PushQueue()
    sink = QuerySink(q)
    aq = sink.attach_queue(maxsize=3)
    got = []
    sink.add_callback(got.append)
    for i in range(5):
        q.put((i,))
    drain(sink)
    assert got == [(i,) for i in range(5)]
    assert sink.dropped == 2
    assert [aq.get_nowait() for _ in range(3)] == [(2,), (3,), (4,)]
    assert isinstance(aq, asyncio.Queue)


def test_index_join_never_matches_null_keys() -> None:
    table = Table("t", Schema([("k", "str"), ("v", "int")], time=None), [(None, 1), ("a", 2)])
    stream, out = PushQueue(), PushQueue()
    j = IndexJoin(
        stream,
        _pull(table),
        out,
        stream_key=lambda t: (t[0],),
        table_key=lambda r: (r[0],),
        table_width=2,
    )
    stream.put((None,))
    stream.put(("a",))
    drain(j)
    assert rows(out) == [("a", "a", 2)]


def _pull(table: Table) -> PullQueue:
    """A table's rows through a pull queue, as the planner reads a table for a join."""
    buffer = PushQueue()
    return PullQueue(TableScan(table, buffer), buffer)
