"""Memory per installed query: at most 3 KiB per filter query and 10 KiB per
windowed query, and the sharing that gets there changes nothing a caller sees.

Measured like `benchmarks.fast_path` part (d): tracemalloc around installing pre-parsed
queries with overlapping ~1% speed ranges (1,000 here; the benchmark also does 10,000).
"""

from __future__ import annotations

import gc
import random
import tracemalloc

import pytest

from fjords.compile.analysis import analyze
from fjords.compile.sql.parser import parse
from fjords.engine import Engine
from fjords.limits import Limits
from fjords.runtime.fjord import Fjord
from fjords.runtime.operators.aggregate import Finish, WindowAggregate
from fjords.runtime.operators.simple import Project
from fjords.runtime.operators.sink import QuerySink
from fjords.runtime.progress import ProgressPolicy
from fjords.schema import Schema

SCHEMA = Schema(
    [("time", "int"), ("station", "str"), ("speed", "float"), ("segment", "str")], time="time"
)
FILTER = "SELECT * FROM traffic WHERE speed >= {lo} AND speed < {hi}"
WINDOWED = (
    "SELECT segment, AVG(speed) FROM traffic [RANGE 15 MINUTES] "
    "WHERE speed >= {lo} AND speed < {hi} GROUP BY segment"
)
PROJECTED = "SELECT station, speed * 2 AS s2 FROM traffic WHERE speed >= {lo} AND speed < {hi}"


def _engine() -> Engine:
    f = Engine(
        Fjord(
            max_lag=float("inf"),
            progress=ProgressPolicy(idle_timeout_s=float("inf")),
            limits=Limits(max_queries=100000),
        )
    )
    f.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    return f


def _ranges(n: int) -> list[tuple[float, float]]:
    rng = random.Random(n)
    return [(lo := round(rng.uniform(0, 69.3), 3), round(lo + 0.7, 3)) for _ in range(n)]


def _bytes_per_query(template: str, n: int) -> float:
    trees = [parse(template.format(lo=lo, hi=hi)) for lo, hi in _ranges(n)]  # not installing
    f = _engine()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for tree in trees:
            f.add_query(tree)
        f.fjord.streams["traffic"].router.index.matches(
            (0, "", 1.0, "")
        )  # any deferred index build
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return (after - before) / n


@pytest.mark.parametrize(("template", "limit_kib"), [(FILTER, 3), (WINDOWED, 10)])
def test_memory_per_installed_query(template: str, limit_kib: int) -> None:
    per = _bytes_per_query(template, 1000)
    assert per <= limit_kib * 1024, f"{per / 1024:.2f} KiB per query (goal {limit_kib})"


def _drive(f: Engine) -> None:
    rows = [(t * 60, f"st{t % 7}", float(t % 70), f"S{t % 3}") for t in range(200)]
    f.fjord.push_many("traffic", rows)
    f.fjord.run_until_idle()
    f.fjord.end_of_stream()
    f.fjord.run_until_idle()


def _instance_dict(o: object) -> dict | None:
    """An object's attribute dict if one was made, without making one (reading `__dict__`
    of a slotted object with a `__dict__` slot would create it)."""
    values = [
        getattr(o, n)
        for c in type(o).__mro__
        for n in getattr(c, "__slots__", ())
        if n not in ("__dict__", "__weakref__") and hasattr(o, n)
    ]
    for r in gc.get_referents(o):
        if type(r) is dict and not any(r is v for v in values):
            return r
    return None


def test_per_query_operators_keep_no_attribute_dict() -> None:
    """Every attribute of the per-query operators lives in a slot, through a run."""
    f = _engine()
    qs = [f.add_query(t.format(lo=10, hi=40)) for t in (FILTER, WINDOWED, PROJECTED)]
    _drive(f)
    assert qs[1].shared is not None
    ops = [op for q in qs for op in q.operators] + [qs[1].shared.aggregate]
    kinds = {type(op) for op in ops}
    assert {QuerySink, Finish, WindowAggregate, Project} <= kinds
    for op in ops:
        assert _instance_dict(op) is None, f"{type(op).__name__} has {_instance_dict(op)}"


def test_an_attribute_not_in_slots_still_works() -> None:
    """A subclass or caller may still set its own attributes (a lazy __dict__ holds them)."""
    f = _engine()
    q = f.add_query(WINDOWED.format(lo=1, hi=2))
    q.sink.note = "mine"  # type: ignore[attr-defined]
    assert q.shared is not None
    q.shared.aggregate.note = 1  # type: ignore[attr-defined]
    assert q.sink.note == "mine"  # type: ignore[attr-defined]
    assert q.shared.aggregate.note == 1  # type: ignore[attr-defined]


def test_queries_of_one_shape_share_immutable_parts_and_differ_in_nothing_visible() -> None:
    f = _engine()
    a = f.add_query(WINDOWED.format(lo=10, hi=20))
    b = f.add_query(WINDOWED.format(lo=30, hi=40))
    catalog, limits = f.fjord.catalog, f.fjord.limits
    ba = analyze(parse(WINDOWED.format(lo=10, hi=20)), catalog, limits)  # as `a` was
    bb = analyze(parse(WINDOWED.format(lo=30, hi=40)), catalog, limits)
    assert a.demand.fields is b.demand.fields
    assert ba.refs is bb.refs and ba.columns is bb.columns and a.columns is b.columns
    assert ba.demand.fields is bb.demand.fields
    assert ba.demand.atoms != bb.demand.atoms  # each its own filter
    assert f.explain(WINDOWED.format(lo=10, hi=20))["columns"] == list(a.columns)
    assert [op.describe() for op in a.operators] == [op.describe() for op in b.operators]
    got: dict[str, list] = {"a": [], "b": []}
    a.sink.add_batch_callback(got["a"].extend)
    b.sink.add_batch_callback(got["b"].extend)
    _drive(f)
    assert got["a"] and got["b"]
    assert all(10 <= r[1] < 20 for r in got["a"]) and all(30 <= r[1] < 40 for r in got["b"])


def test_sink_consumers_added_at_any_time() -> None:
    """A sink's consumer lists start empty (no list until the first consumer): callbacks,
    batch callbacks and asyncio queues added before or after rows flowed all get rows."""
    f = _engine()
    q = f.add_query(FILTER.format(lo=0, hi=100))
    assert not q.sink.callbacks and not q.sink.batch_callbacks and not q.sink.async_queues
    rows: list = []
    batches: list = []
    q.sink.add_callback(rows.append)
    f.fjord.push("traffic", (0, "a", 1.0, "S1"))
    f.fjord.run_until_idle()
    q.sink.add_batch_callback(batches.append)
    aq = q.sink.attach_queue(maxsize=1)
    q.sink.add_callback(rows.append)
    f.fjord.push_many("traffic", [(60, "a", 2.0, "S1"), (120, "a", 3.0, "S1")])
    f.fjord.run_until_idle()
    later = [(60, "a", 2.0, "S1"), (120, "a", 3.0, "S1")]
    assert rows == [(0, "a", 1.0, "S1"), *later, *later]  # each callback, in turn
    assert batches == [later]
    assert aq.get_nowait() == (120, "a", 3.0, "S1") and q.sink.dropped == 1
    assert q.sink.rows == 3
