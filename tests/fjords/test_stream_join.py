"""Windowed stream-stream equi-joins: the symmetric hash join's tumbling mode, and the plans the
SQL gets on the Fjord (both sides through the stream routers, bounded state, early output)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjords.engine import Engine
from fjords.runtime.fjord import Fjord
from fjords.runtime.operators.joins import SymmetricHashJoin
from fjords.runtime.progress import Watermark
from fjords.runtime.queues import PushQueue
from fjords.schema import Schema

SCHEMA = Schema(
    [("time", "int"), ("station", "str"), ("speed", "float"), ("segment", "str")], time="time"
)
JOIN = "FROM traffic AS a [RANGE 5 MINUTES], traffic AS b [RANGE 5 MINUTES]"


def drain(*ops) -> None:
    while any(op.transition() for op in ops):
        pass


def items(q: PushQueue) -> list:
    return q.get_batch(10**9)


def rows(q: PushQueue) -> list[tuple]:
    return [i for i in items(q) if i.__class__ is tuple]


def tumbling_join(**kw) -> tuple[PushQueue, PushQueue, PushQueue, SymmetricHashJoin]:
    left, right, out = PushQueue(), PushQueue(), PushQueue()
    j = SymmetricHashJoin(
        left,
        right,
        out,
        left_key=lambda t: t[1],
        right_key=lambda t: t[1],
        left_time=0,
        right_time=0,
        tumbling=10,
        stamp=True,
        **kw,
    )
    return left, right, out, j


# -- the operator --------------------------------------------------------------------------


def test_pairs_come_out_as_soon_as_both_partners_are_there() -> None:
    left, right, out, j = tumbling_join()
    left.put((1, "x", "L1"))
    drain(j)
    assert rows(out) == []
    right.put((7, "x", "R1"))
    drain(j)
    # no watermark yet: the pair is out anyway (non-blocking), stamped with the later time
    assert rows(out) == [(1, "x", "L1", 7, "x", "R1", 7)]


def test_only_tuples_of_the_same_window_join() -> None:
    left, right, out, j = tumbling_join()
    left.put((9, "x", "L1"))  # window [0, 10)
    right.put((10, "x", "R1"))  # window [10, 20): one second later, another window
    right.put((0, "x", "R0"))
    drain(j)
    assert rows(out) == [(9, "x", "L1", 0, "x", "R0", 9)]


def test_windows_are_evicted_when_both_watermarks_pass_their_end() -> None:
    left, right, out, j = tumbling_join()
    for t in (1, 2, 11):
        left.put((t, "x", "L"))
        right.put((t, "x", "R"))
    drain(j)
    assert j.sizes == [3, 3]
    left.put(Watermark(10))
    drain(j)
    assert j.sizes == [3, 3]  # the right side may still send window [0, 10)
    right.put(Watermark(10))
    drain(j)
    assert j.sizes == [1, 1] and j.evicted == 4
    assert [i.time for i in items(out) if isinstance(i, Watermark)] == [10]
    right.put((5, "x", "late"))
    drain(j)
    assert j.late == 1 and rows(out) == []  # its window was evicted: dropped, counted


def test_a_full_side_drops_its_oldest_window_and_counts_it() -> None:
    left, _right, _out, j = tumbling_join(fill_threshold=50)
    for t in range(100):
        left.put((t, t % 3, "L"))  # ten windows, no watermark ever
    drain(j)
    assert j.sizes[0] <= 50
    assert j.dropped == 100 - j.sizes[0] and j.dropped > 0
    assert j.describe()["dropped"] == j.dropped
    left.put((0, 0, "late"))  # window 0 was dropped: later tuples of it are late
    drain(j)
    assert j.late == 1


def test_many_pairs_wait_for_the_consumer_instead_of_overflowing_the_output() -> None:
    left, right = PushQueue(), PushQueue()
    out = PushQueue(bound=50)  # room for one tuple's 20 pairs, not for 400
    j = SymmetricHashJoin(
        left,
        right,
        out,
        left_key=lambda t: t[1],
        right_key=lambda t: t[1],
        left_time=0,
        right_time=0,
        tumbling=10,
    )
    for i in range(20):
        left.put((1, "k", i))
        right.put((2, "k", i))
    got: list[tuple] = []
    while j.transition() or len(out):
        got += rows(out)
    assert len(got) == 20 * 20 and out.drops == 0


def test_null_keys_never_join_and_residual_filters_pairs() -> None:
    left, right, out, j = tumbling_join(residual=lambda r: r[2] != r[5])
    left.put((1, None, "L"))
    right.put((2, None, "R"))
    left.put((1, "k", "same"))
    right.put((2, "k", "same"))
    right.put((3, "k", "other"))
    drain(j)
    assert rows(out) == [(1, "k", "same", 3, "k", "other", 3)]
    assert j.null_keys == 2


def test_end_of_input_empties_the_tables() -> None:
    left, right, _out, j = tumbling_join()
    left.put((1, "x", "L"))
    right.put((2, "x", "R"))
    left.put(Watermark(math.inf))
    right.put(Watermark(math.inf))
    drain(j)
    assert j.sizes == [0, 0] and j.tables == ({}, {})


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(0, 59), st.sampled_from("abc")),
        max_size=60,
    ),
    st.integers(1, 7),
)
def test_the_join_equals_the_nested_loop_whatever_the_arrival_order(data, every) -> None:
    """Any interleaving of the two sides, with watermarks at each side's own progress, gives
    exactly the pairs of a nested loop over the same windows and keys."""
    left, right, out, j = tumbling_join()
    seen: dict[bool, list[tuple]] = {True: [], False: []}
    progress = {True: -math.inf, False: -math.inf}
    data = sorted(data, key=lambda x: x[1])  # each side's watermark needs its own order
    for n, (is_left, t, k) in enumerate(data):
        row = (t, k, n)
        (left if is_left else right).put(row)
        seen[is_left].append(row)
        progress[is_left] = t
        if n % every == 0:
            (left if is_left else right).put(Watermark(progress[is_left]))
        drain(j)
    left.put(Watermark(math.inf))
    right.put(Watermark(math.inf))
    drain(j)
    want = sorted(
        a + b + (max(a[0], b[0]),)
        for a in seen[True]
        for b in seen[False]
        if a[1] == b[1] and a[0] // 10 == b[0] // 10
    )
    assert sorted(rows(out)) == want
    assert j.late == 0 and j.sizes == [0, 0]


# -- the SQL plan on the Fjord -------------------------------------------------------------


def fjord() -> Engine:
    f = Engine(Fjord())
    f.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    return f


def readings(t0: int = 0, minutes: int = 20) -> list[tuple]:
    out = []
    for t in range(t0, t0 + minutes * 60, 60):
        out += [
            (t, "A", 20.0 + t % 7, "S1"),
            (t, "B", 60.0, "S1"),
            (t, "C", 50.0, "S2"),
        ]
    return out


def test_both_sides_are_routed_through_the_predicate_index() -> None:
    f = fjord()
    rq = f.add_query(
        f"SELECT a.station, b.station AS fast {JOIN} "
        "WHERE a.segment = b.segment AND a.speed < 30 AND b.speed >= 60",
        query_id="j",
    )
    router = f.fjord.streams["traffic"].router
    assert len(router.index) == 2  # one entry per side, each with its own filter
    assert [sh["predicates"] for sh in rq.describe()["shared"]] == [
        ["speed < 30"],
        ["speed >= 60"],
    ]
    assert rq.plan.shape == "stream-stream join"
    out: list[tuple] = []
    rq.sink.add_batch_callback(out.extend)
    f.fjord.push_many("traffic", readings(minutes=4))  # one window, still open
    f.fjord.run_until_idle()
    # every pair is out before its window closes: A (slow) with B (fast), once per reading pair
    assert len(out) == 4 * 4 and set(out) == {("A", "B")}
    f.fjord.remove_query("j")
    assert len(router.index) == 0


def test_join_state_is_evicted_by_the_watermark_and_shown_in_explain() -> None:
    f = fjord()
    rq = f.add_query(
        f"SELECT a.segment, COUNT(*) AS n {JOIN} WHERE a.segment = b.segment GROUP BY a.segment",
        query_id="j",
    )
    out: list[tuple] = []
    rq.sink.add_batch_callback(out.extend)
    f.fjord.push_many("traffic", readings(minutes=60))
    f.fjord.run_until_idle()
    join = rq.operators[0]
    assert isinstance(join, SymmetricHashJoin)
    # the watermark is at the last reading: only the last window is held
    assert join.sizes[0] <= 3 * 5 and join.evicted > 0
    d = rq.describe()["operators"][0]
    assert d["operator"] == "symmetric_hash_join" and d["tumbling_s"] == 300.0
    assert set(d) >= {"held", "fill_threshold", "evicted", "dropped", "late"}
    f.fjord.end_of_stream()
    f.fjord.run_until_idle()
    got = [rq.as_dict(r) for r in out]
    # per 5-minute window: S1 has 2 stations x 5 readings, so 10 x 10 pairs; S2 5 x 5
    assert {(r["segment"], r["n"]) for r in got} == {("S1", 100), ("S2", 25)}
    assert len(got) == 2 * 12


def test_a_failed_join_query_leaves_both_routes_and_the_others() -> None:
    f = fjord()
    bad = f.add_query(
        f"SELECT a.station, b.station AS o {JOIN} WHERE a.segment = b.segment",
        query_id="bad",
    )
    ok = f.add_query("SELECT station FROM traffic WHERE speed > 55", query_id="ok")
    got: list[tuple] = []
    ok.sink.add_batch_callback(got.extend)
    bad.operators[0].residual = lambda r: 1 / 0  # the join raises
    f.fjord.push_many("traffic", readings(minutes=2))
    f.fjord.run_until_idle()
    assert "bad" in f.fjord.failed and "ZeroDivisionError" in (f.fjord.failed["bad"].error or "")
    assert len(f.fjord.streams["traffic"].router.index) == 1  # only "ok" is routed
    assert got


def test_two_different_streams_join_on_their_common_key() -> None:
    f = fjord()
    f.fjord.add_stream(
        "weather",
        Schema([("time", "int"), ("segment", "str"), ("rain", "float")], time="time"),
        sensor_field="segment",
    )
    rq = f.add_query(
        "SELECT t.station, w.rain FROM traffic AS t [RANGE 5 MINUTES], "
        "weather AS w [RANGE 5 MINUTES] WHERE t.segment = w.segment AND w.rain > 1",
        query_id="tw",
    )
    assert rq.demand.stream == "traffic"
    # the proxies of both streams count the join (their sensors must not sleep through it)
    assert len(rq.demands) == 2 and rq.demands[0] is rq.demand
    assert rq.demands[1].stream == "weather"
    assert set(rq.demands[1].fields) >= {"rain", "segment", "time"}
    out: list[tuple] = []
    rq.sink.add_batch_callback(out.extend)
    f.fjord.push_many("traffic", readings(minutes=5))
    f.fjord.push_many("weather", [(60, "S1", 2.5), (120, "S2", 0.5), (400, "S1", 9.0)])
    f.fjord.run_until_idle()
    assert sorted(set(out)) == [("A", 2.5), ("B", 2.5)] and len(out) == 10
    assert len(f.fjord.streams["weather"].router.index) == 1
    f.fjord.remove_query("tw")
    assert len(f.fjord.streams["weather"].router.index) == 0
    assert len(f.fjord.streams["traffic"].router.index) == 0


# -- the CLI ---------------------------------------------------------------------------------


def _write_traces(tmp_path) -> tuple[str, str]:
    traffic = tmp_path / "traffic.csv"
    traffic.write_text(
        "time,station,speed,segment\n"
        + "".join(f"{t},{st},{sp},{seg}\n" for t, st, sp, seg in readings(minutes=10))
    )
    weather = tmp_path / "weather.csv"
    weather.write_text("time,segment,rain\n30,S1,2.5\n330,S2,4.0\n")
    return str(traffic), str(weather)


def test_the_cli_runs_a_self_join_with_one_trace(tmp_path) -> None:
    import json
    import subprocess
    import sys

    from tests.support import ROOT

    traffic, _ = _write_traces(tmp_path)
    sql = (
        f"SELECT a.segment, COUNT(*) AS pairs {JOIN} "
        "WHERE a.segment = b.segment AND a.station < b.station GROUP BY a.segment"
    )
    done = subprocess.run(
        [sys.executable, "-m", "fjords", "--trace", traffic, "--query", sql],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=True,
    )
    got = [json.loads(line) for line in done.stdout.splitlines()]
    # S1 has A and B: 5 x 5 pairs with A < B per 5-minute window; S2 one station, no pair
    assert got == [
        {"query": 0, "segment": "S1", "pairs": 25, "window_start": ws, "window_end": ws + 300.0}
        for ws in (0.0, 300.0)
    ]


def test_the_cli_joins_two_named_traces(tmp_path, capsys) -> None:
    import json

    from fjords.__main__ import main

    traffic, weather = _write_traces(tmp_path)
    sql = (
        "SELECT t.station, t.time, w.rain FROM traffic AS t [RANGE 5 MINUTES], "
        "weather AS w [RANGE 5 MINUTES] WHERE t.segment = w.segment AND t.time = 60 * 5"
    )
    assert main(["--trace", traffic, "--trace", f"weather={weather}", "--query", sql]) == 0
    got = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert got == [{"query": 0, "station": "C", "time": 300, "rain": 4.0}]
    with pytest.raises(SystemExit):
        main(["--trace", traffic, "--trace", weather, "--query", sql])  # two for one stream
