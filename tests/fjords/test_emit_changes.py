"""EMIT CHANGES in the Fjord: the clause as parsed, early rows of sliding windows while sensors
arrive out of step (brute-force checked), a plain query beside it unchanged, explain's rhythm,
and a watermark jumping over many instants handled a slice at a time."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest

from fjords.compile.sql import ast
from fjords.compile.sql.parser import parse
from fjords.engine import Engine
from fjords.errors import QueryError
from fjords.runtime.fjord import Fjord
from fjords.runtime.operators.aggregate import changes as changes_mod
from fjords.schema import Schema

SCHEMA = Schema(
    [("time", "int"), ("station", "str"), ("speed", "float"), ("segment", "str")], time="time"
)
STATIONS = {"st0": "S0", "st1": "S0", "st2": "S1"}
# A reading per station every 60 s for three hours, speeds spread deterministically.
ROWS = [
    (t, st, float(5 + (t // 60 * 7 + i * 13) % 75), seg)
    for t in range(0, 3 * 3600, 60)
    for i, (st, seg) in enumerate(STATIONS.items())
]


def _engine() -> Engine:
    e = Engine(Fjord())
    e.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    return e


def _run(e: Engine, sqls: list[str], rows: list[tuple], step: int = 50) -> list[list[dict]]:
    """Each query's rows; the readings pushed `step` at a time, the Fjord run in between (so
    watermarks move while the windows are open)."""
    qs = [e.add_query(sql, query_id=f"q{i}") for i, sql in enumerate(sqls)]
    outs: list[list[tuple]] = [[] for _ in qs]
    for q, out in zip(qs, outs, strict=True):
        q.sink.add_batch_callback(out.extend)
    for i in range(0, len(rows), step):
        for t in rows[i : i + step]:
            e.fjord.push("traffic", t)
        e.fjord.run_until_idle()
    e.fjord.end_of_stream()
    e.fjord.run_until_idle()
    return [
        [dict(zip(q.columns, r, strict=True)) for r in out] for q, out in zip(qs, outs, strict=True)
    ]


def test_the_clause_as_parsed() -> None:
    q = parse("SELECT COUNT(*) FROM traffic [RANGE 1 HOUR]\n  EMIT CHANGES EVERY 10 MINUTES")
    assert q.changes == ast.Changes(every_s=600.0) and q.changes.pos == (2, 22)
    assert q.pos_of("EMIT CHANGES") == (2, 3) and q.emit_every_s is None
    q = parse("SELECT COUNT(*) FROM traffic GROUP BY segment EMIT CHANGES EVERY 25 ROWS")
    assert q.changes == ast.Changes(every_rows=25)
    assert parse("SELECT COUNT(*) FROM traffic EMIT CHANGES").changes == ast.Changes()
    assert parse("SELECT COUNT(*) FROM traffic [RANGE 1 HOUR] EMIT EVERY 1 MINUTE").changes is None
    # `changes` stays a name where it is not the clause
    assert parse("SELECT changes FROM traffic").changes is None
    for sql, pos in [
        ("SELECT COUNT(*) FROM traffic EMIT CHANGES EVERY 2.5 ROWS", (1, 49)),
        ("SELECT COUNT(*) FROM traffic EMIT CHANGES EMIT CHANGES", (1, 43)),
        ("SELECT COUNT(*) FROM traffic EMIT CHANGES EVERY", (1, 48)),
        ("SELECT speed FROM traffic UNION ALL SELECT speed FROM traffic EMIT CHANGES", (1, 63)),
    ]:
        with pytest.raises(QueryError) as e:
            parse(sql)
        assert (e.value.line, e.value.column) == pos, str(e.value)  # type: ignore[attr-defined]


def test_sliding_windows_early_rows_with_sensors_out_of_step() -> None:
    """st2 runs 20 minutes of event time ahead of the others: an instant's row still counts
    exactly the readings before it, whichever arrived first (the watermark decides)."""
    ahead = [r for r in ROWS if r[1] == "st2"]
    behind = [r for r in ROWS if r[1] != "st2"]
    rows: list[tuple] = ahead[:20]  # st2's first 20 minutes before anyone else's
    for i in range(0, len(behind), 2):  # then st2's reading of t + 20 minutes with the others' of t
        rows += behind[i : i + 2]
        rows += ahead[i // 2 + 20 : i // 2 + 21]
    assert sorted(rows) == sorted(ROWS)
    sql = (
        "SELECT segment, COUNT(*) AS n, AVG(speed) AS a, MAX(speed) AS top FROM traffic "
        "[RANGE 1 HOUR SLIDE 30 MINUTES] GROUP BY segment EMIT CHANGES EVERY 15 MINUTES"
    )
    (got,) = _run(_engine(), [sql], rows)
    want: dict[tuple[int, str, int], list[float]] = defaultdict(list)
    for t, _, speed, seg in rows:
        for ws in range((t // 1800) * 1800 - 1800, t + 1, 1800):
            if not ws <= t < ws + 3600:
                continue
            for x in range(ws + 900, ws + 3601, 900):
                if t < x:
                    want[(ws, seg, x)].append(speed)
    assert {(r["window_start"], r["segment"], r["as_of"]) for r in got} == set(want)
    assert len(got) == len(want)
    for r in got:
        speeds = want[(int(r["window_start"]), r["segment"], int(r["as_of"]))]
        assert r["n"] == len(speeds) and r["top"] == max(speeds)
        assert math.isclose(r["a"], sum(speeds) / len(speeds), rel_tol=1e-12)
        assert r["final"] == (r["as_of"] == r["window_end"])
    # each window's rows in as_of order, the final last
    per: dict[tuple, list[dict]] = defaultdict(list)
    for r in got:
        per[(r["window_start"], r["segment"])].append(r)
    for rs in per.values():
        assert [r["as_of"] for r in rs] == sorted(r["as_of"] for r in rs) and rs[-1]["final"]


PLAIN = "SELECT segment, AVG(speed) AS a FROM traffic [RANGE 1 HOUR] GROUP BY segment"


def test_a_plain_query_beside_it_gets_what_it_gets_alone() -> None:
    """The EMIT CHANGES query has its own aggregate: the plain one's shared, fused window is
    untouched (same rows, same plan), and two plain queries still share theirs."""
    (alone,) = _run(_engine(), [PLAIN], ROWS)
    e = _engine()
    plain, _, other = _run(
        e, [PLAIN, f"{PLAIN} EMIT CHANGES EVERY 20 MINUTES", f"{PLAIN} HAVING COUNT(*) > 0"], ROWS
    )
    assert plain == alone and "final" not in plain[0]
    assert other == alone
    assert e.fjord.queries["q0"].describe()["shape"] == "windowed aggregate"
    assert e.explain(PLAIN)["aggregate_shared_with"] == ["q0"]


def test_explain_shows_the_rhythm() -> None:
    e = _engine()
    for sql, words in [
        (f"{PLAIN} EMIT CHANGES EVERY 10 MINUTES", "changes every 600 s of event time"),
        (f"{PLAIN} EMIT CHANGES EVERY 5 ROWS", "changes every 5 rows of a window"),
        ("SELECT COUNT(*) AS n FROM traffic EMIT CHANGES", "online aggregation"),
    ]:
        plan = e.explain(sql)
        assert plan["shape"] == "aggregate with EMIT CHANGES"
        assert any(words in str(op.get("emit")) for op in plan["operators"]), plan


def test_online_every_change_and_a_long_watermark_jump(monkeypatch) -> None:
    """Without a window: every change outputs the group that changed; EVERY d over a watermark
    that jumps past many instants goes through them a slice per transition, all exact."""
    monkeypatch.setattr(changes_mod, "INSTANTS_PER_TRANSITION", 3)
    few = [(t, "st0", float(t), "S0") for t in (0, 60, 61, 3000)] + [(4000, "st0", 1.0, "S1")]
    every, online = _run(
        _engine(),
        [
            "SELECT segment, SUM(speed) AS s FROM traffic GROUP BY segment EMIT CHANGES",
            "SELECT COUNT(*) AS n, SUM(speed) AS s FROM traffic EMIT CHANGES EVERY 1 MINUTE",
        ],
        few,
        step=5,
    )
    assert [(r["segment"], r["s"], r["as_of"], r["final"]) for r in every] == [
        ("S0", 0.0, 0, False),
        ("S0", 60.0, 60, False),
        ("S0", 121.0, 61, False),
        ("S0", 3121.0, 3000, False),
        ("S1", 1.0, 4000, False),
    ]
    # every minute from the first reading's to the last's: 67 instants, each exact
    assert [r["as_of"] for r in online] == [60.0 * k for k in range(1, 68)]
    for r in online:
        before = [t for t, *_ in few if t < r["as_of"]]
        assert (r["n"], r["final"]) == (len(before), False)


def test_a_reading_behind_its_rows_is_dropped_and_counted(caplog) -> None:
    """Behind an instant already out, a reading cannot be counted any more: dropped, counted
    (Fjord.stats -> fjords_dropped_total{reason="changes_late"}), logged once."""
    from fjords.runtime.operators.aggregate.changes import ChangesAggregate
    from fjords.runtime.operators.aggregate.state import AggSpec
    from fjords.runtime.progress import Watermark
    from fjords.runtime.queues import PushQueue

    inq, outq = PushQueue(100), PushQueue(100)
    op = ChangesAggregate(
        inq,
        outq,
        key_fn=lambda t: (),
        arg_fns=[],
        specs=[AggSpec("COUNT", None)],
        time_index=0,
        range_s=3600.0,
        slide_s=3600.0,
        every_s=600.0,
        every_rows=None,
        finalize=lambda r: r,
    )
    for item in [(10,), (700,), Watermark(1200.0), (5,), (1199,), (1300,), Watermark(1800.0)]:
        inq.put(item)
    with caplog.at_level("WARNING"):
        while op.transition():
            pass
    assert op.late == 2 and caplog.text.count("late") == 1
    assert [r[-1] for r in outq.get_batch(100)] == [600.0, 1200.0, 1800.0]
    e = _engine()
    _run(e, [f"{PLAIN} EMIT CHANGES EVERY 30 MINUTES"], ROWS)
    assert e.fjord.stats()["queries"]["q0"]["changes_late"] == 0


def test_groups_over_the_limit_fail_that_query_alone() -> None:
    from fjords.limits import Limits

    e = Engine(Fjord(limits=Limits(max_groups_per_window=2)))
    e.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    by_station = "SELECT station, COUNT(*) AS n FROM traffic GROUP BY station EMIT CHANGES"
    _, plain = _run(e, [by_station, PLAIN], ROWS)
    assert list(e.fjord.failed) == ["q0"] and "max_groups_per_window" in str(
        e.fjord.failed["q0"].error
    )
    assert plain and all(r["a"] is not None for r in plain)


def test_online_aggregation_since_a_time_with_history() -> None:
    """`since` (a stream keeping a history): online aggregation counts from then, the history
    first, then the live readings; a late windowed query starts with its open window whole."""
    from tests.fjords.test_backfill import ROWS as MANY
    from tests.fjords.test_backfill import engine, feed, install

    e = engine()
    feed(e, MANY[: len(MANY) // 2])
    online = install(
        e,
        "SELECT segment, COUNT(*) AS n FROM traffic GROUP BY segment EMIT CHANGES EVERY 1000 SECONDS",
        "online",
        since=3000.0,
    )
    late = install(
        e,
        "SELECT segment, COUNT(*) AS n FROM traffic [RANGE 1000 SECONDS] GROUP BY segment "
        "EMIT CHANGES EVERY 500 SECONDS",
        "late",
    )
    feed(e, MANY[len(MANY) // 2 :])
    e.fjord.end_of_stream()
    e.fjord.run_until_idle()
    last = max(t for t, *_ in MANY)
    want = [
        (seg, sum(1 for t, _, _, s in MANY if s == seg and 3000 <= t < x), False, float(x))
        for x in range(4000, int(last) // 1000 * 1000 + 1001, 1000)
        for seg in ("S0", "S1")
    ]
    assert online == want
    first = [r for r in late if r[2] == min(r[2] for r in late)]
    ws = first[0][2]
    assert ws < 10_000 and [(r[1], r[4]) for r in first] == [(100, False)] * 2 + [(200, True)] * 2


def test_spark_refuses_it_at_the_clause() -> None:
    """Compiling needs no JVM: Spark refuses EMIT CHANGES with the reason, never ignores it."""
    from gateway.spark.compiler import SparkUnsupportedError, compile_query

    with pytest.raises(SparkUnsupportedError, match=r"EMIT CHANGES .* runs on the Fjord") as e:
        compile_query(f"{PLAIN}\n EMIT CHANGES EVERY 10 MINUTES", {"traffic": SCHEMA})
    assert (e.value.line, e.value.column) == (2, 2)
