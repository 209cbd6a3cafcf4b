"""The Fjord as a whole: sharing, folding queries in and out while tuples flow, progress."""

from __future__ import annotations

import random

import pytest

from fjords.engine import Engine
from fjords.errors import QueryError, QuerySyntaxError
from fjords.runtime.fjord import Fjord
from fjords.schema import Schema
from fjords.tables import Table

SCHEMA = Schema([("time", "int"), ("station", "str"), ("speed", "float"), ("segment", "str")])
STATIONS = {f"st{i}": f"S{i % 4}" for i in range(8)}


def make_trace(n_steps: int = 120, seed: int = 7, step: int = 60) -> list[tuple]:
    rng = random.Random(seed)
    rows = []
    for k in range(n_steps):
        for st, seg in STATIONS.items():
            if rng.random() < 0.9:
                rows.append((1_000_000 + k * step, st, round(rng.uniform(5, 80), 1), seg))
    return rows


def new_engine(**kw) -> Engine:
    f = Engine(Fjord(**kw))
    f.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    return f


def run(f: Engine, rows: list[tuple], queries: list[str]) -> list[list[tuple]]:
    outs: list[list[tuple]] = []
    for i, q in enumerate(queries):
        out: list[tuple] = []
        f.add_query(q, query_id=f"q{i}").sink.add_batch_callback(out.extend)
        outs.append(out)
    for i, t in enumerate(rows):
        f.fjord.push("traffic", t)
        if i % 500 == 0:
            f.fjord.run_until_idle()
    f.fjord.end_of_stream()
    f.fjord.run_until_idle()
    return outs


def random_query(rng: random.Random) -> str:
    lo = rng.randint(0, 60)
    hi = lo + rng.randint(1, 40)
    segs = ", ".join(f"'S{s}'" for s in rng.sample(range(4), rng.randint(1, 3)))
    shape = rng.randrange(6)
    if shape == 0:
        return f"SELECT * FROM traffic WHERE speed >= {lo} AND speed < {hi}"
    if shape == 1:
        return f"SELECT station, speed FROM traffic WHERE segment IN ({segs}) AND speed > {lo}"
    if shape == 2:
        return f"SELECT * FROM traffic WHERE station = 'st{rng.randrange(8)}' OR speed < {lo}"
    if shape == 3:
        r = rng.choice([5, 10, 15])
        return f"SELECT segment, AVG(speed) AS a, COUNT(*) AS n FROM traffic [RANGE {r} MINUTES] WHERE segment IN ({segs}) GROUP BY segment"
    if shape == 4:
        return (
            f"SELECT station, MAX(speed) AS m, MIN(speed) AS mn FROM traffic [RANGE 30 MINUTES SLIDE 10 MINUTES] "
            f"WHERE speed BETWEEN {lo} AND {hi} GROUP BY station HAVING MAX(speed) > {lo + 5}"
        )
    return f"SELECT SUM(speed) AS s, COUNT(speed) AS c FROM traffic [ROWS 20 SLIDE 5] WHERE speed < {hi}"


def test_folding_100_queries_gives_each_the_results_it_gets_alone() -> None:
    rng = random.Random(3)
    queries = [random_query(rng) for _ in range(100)]
    rows = make_trace()
    together = run(new_engine(), rows, queries)
    for i, q in enumerate(queries):
        alone = run(new_engine(), rows, [q])[0]
        assert together[i] == alone, q
    assert sum(len(o) for o in together) > 1000  # the queries did produce results


def test_one_tuple_object_is_shared_by_all_queries() -> None:
    f = new_engine()
    outs = run(
        f,
        [(1_000_000, "st1", 50.0, "S1")],
        ["SELECT * FROM traffic"] * 3 + ["SELECT * FROM traffic WHERE speed > 10"],
    )
    objs = [o[0] for o in outs]
    assert all(o is objs[0] for o in objs)  # never copied per query


def test_adding_a_query_mid_stream_equals_having_it_from_its_start_time() -> None:
    rows = make_trace(n_steps=200)
    q = "SELECT segment, AVG(speed) AS a FROM traffic [RANGE 10 MINUTES] GROUP BY segment"
    full = run(new_engine(), rows, [q])[0]
    f = new_engine()
    cut = len(rows) // 2
    for t in rows[:cut]:
        f.fjord.push("traffic", t)
    f.fjord.run_until_idle()
    late: list[tuple] = []
    rq = f.add_query(q)
    rq.sink.add_batch_callback(late.extend)
    for t in rows[cut:]:
        f.fjord.push("traffic", t)
    f.fjord.end_of_stream()
    f.fjord.run_until_idle()
    start = rq.start_time
    assert late == [r for r in full if r[-2] >= start]
    assert late  # and it produced something


def test_removing_a_query_never_disturbs_another() -> None:
    rows = make_trace()
    q_keep = "SELECT station, COUNT(*) AS n FROM traffic [RANGE 15 MINUTES] GROUP BY station"
    q_drop = "SELECT * FROM traffic WHERE speed > 30"
    expected = run(new_engine(), rows, [q_keep])[0]
    f = new_engine()
    keep: list[tuple] = []
    f.add_query(q_keep).sink.add_batch_callback(keep.extend)
    drop: list[tuple] = []
    f.add_query(q_drop, query_id="drop").sink.add_batch_callback(drop.extend)
    for i, t in enumerate(rows):
        f.fjord.push("traffic", t)
        if i == len(rows) // 3:
            f.fjord.run_until_idle()
            f.fjord.remove_query("drop")
            seen = len(drop)
    f.fjord.end_of_stream()
    f.fjord.run_until_idle()
    assert keep == expected
    assert len(drop) == seen  # nothing after removal
    with pytest.raises(QueryError):
        f.fjord.remove_query("drop")


def test_a_silent_sensor_holds_windows_back_at_most_max_lag() -> None:
    f = new_engine(max_lag=300)
    out: list[tuple] = []
    f.add_query(
        "SELECT station, COUNT(*) AS n FROM traffic [RANGE 60 SECONDS] GROUP BY station"
    ).sink.add_batch_callback(out.extend)
    f.fjord.push("traffic", (0, "quiet", 1.0, "S0"))
    for t in range(0, 200, 10):
        f.fjord.push("traffic", (t, "busy", 1.0, "S0"))
    f.fjord.run_until_idle()
    assert out == []  # 'quiet' is at 0: the window [0, 60) may still get its samples
    for t in range(200, 400, 10):
        f.fjord.push("traffic", (t, "busy", 1.0, "S0"))
    f.fjord.run_until_idle()
    # 'busy' reached 390; 'quiet' may hold progress back only to 390 - 300 = 90.
    assert [(r[0], r[-1]) for r in out] == [("quiet", 60.0), ("busy", 60.0)]
    f.fjord.push("traffic", (30, "quiet", 1.0, "S0"))  # too late now: dropped and counted
    f.fjord.run_until_idle()
    assert f.fjord.streams["traffic"].router.late == 1


def test_heartbeats_close_windows_for_a_sensor_with_nothing_to_send() -> None:
    f = new_engine(max_lag=10_000)
    out: list[tuple] = []
    f.add_query("SELECT COUNT(*) AS n FROM traffic [RANGE 60 SECONDS]").sink.add_batch_callback(
        out.extend
    )
    f.fjord.push("traffic", (0, "a", 1.0, "S0"))
    f.fjord.push("traffic", (5, "b", 1.0, "S0"))
    f.fjord.push("traffic", (70, "a", 1.0, "S0"))
    f.fjord.run_until_idle()
    assert out == []  # b is silent
    f.fjord.heartbeat("traffic", "b", 65)
    f.fjord.run_until_idle()
    assert out == [(2, 0.0, 60.0)]


INCIDENTS = [
    ("I1", 1_000_600, "S1", "crash"),
    ("I2", 1_003_000, "S2", "roadwork"),
    ("I3", 1_000_100, "S3", "fire"),
]


def test_windowed_aggregate_joined_with_a_static_table_equals_brute_force() -> None:
    rows = make_trace(n_steps=120)
    f = new_engine()
    f.fjord.add_table(
        "incidents",
        Table(
            "incidents",
            Schema(
                [
                    ("incident_id", "str"),
                    ("time", "int"),
                    ("segment", "str"),
                    ("description", "str"),
                ]
            ),
            list(INCIDENTS),
        ),
    )
    q = (
        "SELECT i.incident_id, i.description, s.segment, AVG(s.speed) AS avg_speed, COUNT(*) AS n "
        "FROM traffic AS s [RANGE 30 MINUTES], incidents AS i "
        "WHERE i.segment = s.segment AND i.time >= NOW - 30 MINUTES AND i.time < NOW "
        "GROUP BY i.incident_id, i.description, s.segment HAVING AVG(s.speed) < 60"
    )
    got = run(f, rows, [q])[0]
    want = []
    starts = sorted({(t // 1800) * 1800 for t, *_ in rows})
    for ws in starts:
        we = ws + 1800
        for iid, itime, iseg, desc in INCIDENTS:
            if not (we - 1800 <= itime < we):
                continue
            speeds = [sp for t, _, sp, seg in rows if ws <= t < we and seg == iseg]
            if speeds and sum(speeds) / len(speeds) < 60:
                want.append(
                    (iid, desc, iseg, sum(speeds) / len(speeds), len(speeds), float(ws), float(we))
                )
    assert len(got) == len(want) > 0
    for g, w in zip(sorted(got), sorted(want), strict=True):
        assert g[:3] == w[:3] and g[4:] == w[4:]
        assert g[3] == pytest.approx(w[3], abs=1e-9)


def test_stream_joined_with_table_per_tuple() -> None:
    f = new_engine()
    f.fjord.add_table(
        "segments",
        Table(
            "segments",
            Schema([("segment", "str"), ("name", "str")], time=None),
            [("S1", "Harbor Fwy"), ("S2", "Hollywood Fwy")],
        ),
    )
    out = run(
        f,
        [(1, "a", 50.0, "S1"), (2, "b", 20.0, "S3"), (3, "c", 30.0, "S2")],
        [
            "SELECT s.station, g.name FROM traffic AS s, segments AS g WHERE s.segment = g.segment AND s.speed > 25"
        ],
    )[0]
    assert out == [("a", "Harbor Fwy"), ("c", "Hollywood Fwy")]


def test_result_columns_and_window_bounds() -> None:
    f = new_engine()
    rq = f.add_query(
        "SELECT s.segment, AVG(s.speed) AS avg_speed, MAX(speed) FROM traffic AS s [RANGE 1 MINUTE] GROUP BY s.segment"
    )
    assert rq.columns == ("segment", "avg_speed", "max_speed", "window_start", "window_end")


@pytest.mark.parametrize(
    "sql, message",
    [
        ("SELECT * FROM nowhere", "unknown stream or table"),
        ("SELECT nope FROM traffic", "unknown column"),
        ("SELECT AVG(speed) FROM traffic", "need a window"),
        ("SELECT station, AVG(speed) FROM traffic [RANGE 1 MINUTE]", "GROUP BY"),
        ("SELECT * FROM traffic WHERE AVG(speed) > 3", "not allowed in WHERE"),
        ("SELECT * FROM traffic WHERE speed > 'fast'", "cannot compare"),
        (
            "SELECT AVG(speed) FROM traffic [RANGE 1 MINUTE SLIDE 10 SECONDS] EMIT EVERY 1 MINUTE",
            "either SLIDE or EMIT EVERY",
        ),
    ],
)
def test_bad_queries_get_clear_errors(sql: str, message: str) -> None:
    f = new_engine()
    with pytest.raises(QueryError, match=message):
        f.add_query(sql)
    assert f.fjord.queries == {}


def test_syntax_errors_say_where() -> None:
    f = new_engine()
    with pytest.raises(QuerySyntaxError) as e:
        f.add_query("SELECT *\nFROM traffic WHERE speed >")
    assert e.value.line == 2


def test_count_min_max_work_on_text_and_sum_is_refused() -> None:
    f = new_engine()
    out = run(
        f,
        [(0, "b", 1.0, "S0"), (10, "a", 2.0, "S0"), (20, None, 3.0, "S0")],
        [
            "SELECT COUNT(station) AS n, MIN(station) AS lo, MAX(station) AS hi FROM traffic [RANGE 1 MINUTE]"
        ],
    )[0]
    assert out == [(2, "a", "b", 0.0, 60.0)]
    with pytest.raises(QueryError, match="needs numbers"):
        new_engine().add_query("SELECT AVG(station) FROM traffic [RANGE 1 MINUTE]")


def test_emit_every_outputs_the_window_at_that_period() -> None:
    f = new_engine()
    out = run(
        f,
        [(t, "a", 1.0, "S0") for t in range(0, 600, 10)],
        ["SELECT COUNT(*) AS n FROM traffic [RANGE 5 MINUTES] EMIT EVERY 1 MINUTE"],
    )[0]
    ends = [r[-1] for r in out]
    assert ends[:6] == [60.0, 120.0, 180.0, 240.0, 300.0, 360.0]
    assert out[4] == (30, 0.0, 300.0)  # a full 5-minute window of 10 s samples


def test_stats_count_drops_and_rows() -> None:
    f = new_engine(queue_bound=10)
    f.add_query("SELECT * FROM traffic")
    for t in range(100):
        f.fjord.push("traffic", (t, "a", 1.0, "S0"))
    stats = f.fjord.stats()
    assert stats["streams"]["traffic"]["queue_drops"] == 90
    f.fjord.run_until_idle()
    assert f.fjord.stats()["queries"]["q1"]["rows"] == 10


def test_queries_with_the_same_aggregate_share_one_operator() -> None:
    rows = make_trace()
    base = "SELECT segment, AVG(speed) AS a, COUNT(*) AS n FROM traffic [RANGE 10 MINUTES] WHERE speed > 20 GROUP BY segment"
    q_having = base + " HAVING AVG(speed) > 45"
    q_other_select = (
        "SELECT t.segment AS seg, AVG(t.speed) * 1.609 AS kmh, COUNT(*) AS cnt FROM traffic AS t "
        "[RANGE 10 MINUTES] WHERE t.speed > 20 GROUP BY t.segment"
    )
    alone = [run(new_engine(), rows, [q])[0] for q in (base, q_having, q_other_select)]
    f = new_engine()
    together = run(f, rows, [base, q_having, q_other_select])
    assert together == alone
    aggs = [op for op in f.fjord.scheduler.operators if op.kind == "window_aggregate"]
    assert len(aggs) == 1  # one aggregate serves all three
    assert f.fjord.queries["q1"].describe()["shared"][1]["queries_sharing"] == 3
    assert f.explain(base)["aggregate_shared_with"] == ["q0", "q1", "q2"]
    for qid in ("q0", "q1"):
        f.fjord.remove_query(qid)
    assert len([op for op in f.fjord.scheduler.operators if op.kind == "window_aggregate"]) == 1
    f.fjord.remove_query("q2")
    assert not [
        op for op in f.fjord.scheduler.operators if op.kind in ("window_aggregate", "multiplex")
    ]
    assert len(f.fjord.streams["traffic"].router.index) == 0


def test_joining_a_running_shared_aggregate_gives_windows_from_the_join() -> None:
    rows = make_trace(n_steps=200)
    q = "SELECT segment, MAX(speed) AS m FROM traffic [RANGE 10 MINUTES] GROUP BY segment"
    full = run(new_engine(), rows, [q])[0]
    f = new_engine()
    first: list[tuple] = []
    f.add_query(q).sink.add_batch_callback(first.extend)
    cut = len(rows) // 2
    for t in rows[:cut]:
        f.fjord.push("traffic", t)
    f.fjord.run_until_idle()
    late: list[tuple] = []
    rq = f.add_query(q + " HAVING MAX(speed) > 0")
    rq.sink.add_batch_callback(late.extend)
    assert len([op for op in f.fjord.scheduler.operators if op.kind == "window_aggregate"]) == 1
    for t in rows[cut:]:
        f.fjord.push("traffic", t)
    f.fjord.end_of_stream()
    f.fjord.run_until_idle()
    assert first == full
    assert late == [r for r in full if r[-2] >= rq.start_time] and late


def test_a_burst_is_absorbed_without_dropping_inside_a_query() -> None:
    """The router hands each query up to a batch of tuples per transition; the query's operator
    must take as much per transition, or under a burst its queue grows round after round until
    it drops (how a replay under load lost Query 2 rows with nothing late)."""
    f = new_engine()
    q = f.add_query("SELECT station, COUNT(*) AS n FROM traffic [RANGE 1 HOURS] GROUP BY station")
    rows: list[tuple] = []
    q.sink.add_batch_callback(rows.extend)
    n, burst = 0, 4096
    for _ in range(40):  # as in the daemon: a burst arrives between two turns of the scheduler
        for _ in range(burst):
            f.fjord.push("traffic", (n // 10, f"s{n % 10}", 50.0, "S1"))
            n += 1
        f.fjord.run_until_idle(max_steps=2)  # the router's turn, then the query's
    f.fjord.end_of_stream()
    f.fjord.run_until_idle()
    assert f.fjord.stats()["queries"][q.id]["queue_drops"] == 0
    assert sum(r[1] for r in rows) == n
