"""The runtime installs what the compiler built: every stage's output is named in the physical
plan before anything runs, and installing a plan re-wires none of its operators."""

from __future__ import annotations

import dataclasses

import pytest

from fjords.engine import Engine
from fjords.runtime.fjord import Fjord
from fjords.runtime.operators.aggregate import AggSpec, WindowAggregate
from fjords.runtime.queues import PushQueue
from fjords.schema import Schema
from fjords.tables import Table

SCHEMA = Schema(
    [("time", "int"), ("station", "str"), ("speed", "float"), ("segment", "str")], time="time"
)
SHAPES = {
    "filter": "SELECT * FROM traffic WHERE speed < 30",
    "project": "SELECT station, speed * 2 AS s FROM traffic WHERE speed < 30",
    "window": "SELECT segment, AVG(speed) AS a FROM traffic [RANGE 1 MINUTE] GROUP BY segment",
    "groups": "SELECT segment, AVG(speed) AS a FROM traffic [RANGE 1 MINUTE] "
    "WHERE segment IN ('S1') GROUP BY segment",
    "top": "SELECT segment, AVG(speed) AS a FROM traffic [RANGE 1 MINUTE] GROUP BY segment "
    "ORDER BY a LIMIT 1",
    "rows": "SELECT station, COUNT(*) AS n FROM traffic [ROWS 10] GROUP BY station",
    "distinct": "SELECT segment, COUNT(DISTINCT station) AS n FROM traffic [RANGE 1 MINUTE] "
    "GROUP BY segment",
    "table": "SELECT t.station, z.name FROM traffic AS t, zones AS z WHERE t.segment = z.segment",
    "table window": "SELECT z.name, AVG(t.speed) AS a FROM traffic AS t [RANGE 1 MINUTE], "
    "zones AS z WHERE t.segment = z.segment GROUP BY z.name",
    "stream join": "SELECT a.station AS x, b.station AS y FROM traffic AS a [RANGE 1 MINUTE], "
    "traffic AS b [RANGE 1 MINUTE] WHERE a.segment = b.segment",
    "union": "SELECT station, speed FROM traffic WHERE speed < 10 UNION ALL "
    "SELECT station, speed FROM traffic WHERE speed > 90",
}


def _engine(fuse: bool) -> Engine:
    engine = Engine(Fjord(), fuse=fuse)
    engine.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    zones = Table("zones", Schema([("segment", "str"), ("name", "str")], time=None), [("S1", "z")])
    engine.fjord.add_table("zones", zones)
    return engine


def _wiring(operators: list) -> list[tuple]:
    return [(op, tuple(op.inputs), tuple(op.outputs)) for op in operators]


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "scheduled"])
@pytest.mark.parametrize("shape", SHAPES)
def test_installing_a_plan_rewires_none_of_its_operators(shape: str, fuse: bool) -> None:
    engine = _engine(fuse)
    prepared = engine.prepare(SHAPES[shape])
    before = _wiring(prepared.plan.operators)
    q = engine.add_query(prepared)
    assert _wiring(q.plan.operators) == before
    # data flows through what was built (the stream's router, then the plan's stages)
    fjord = engine.fjord
    fjord.push_many("traffic", [(t, f"s{t % 3}", float(t % 100), "S1") for t in range(0, 300, 5)])
    fjord.end_of_stream()
    fjord.run_until_idle()
    assert _wiring(q.plan.operators) == before
    assert not fjord.failed


def test_a_plan_is_frozen() -> None:
    plan = _engine(True).plan(SHAPES["filter"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.routes = ()  # type: ignore[misc]


def test_a_shared_window_is_built_with_its_fan_out_when_fused() -> None:
    engine = _engine(True)
    q = engine.add_query(SHAPES["window"])
    assert q.plan.window is not None and q.plan.window.fused
    assert q.shared is not None
    agg = q.shared.aggregate
    assert agg.fan is q.shared.fanout and agg.outputs == []  # its one output: the fan-out


def test_a_window_aggregate_takes_exactly_one_output() -> None:
    kw = {
        "key_fn": lambda t: (),
        "arg_fns": [],
        "specs": [AggSpec("COUNT", None)],
        "time_index": 0,
        "range_s": 60,
    }
    with pytest.raises(ValueError, match="one output"):
        WindowAggregate(PushQueue(), **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="one output"):
        WindowAggregate(PushQueue(), PushQueue(), fan=object(), **kw)  # type: ignore[arg-type]
