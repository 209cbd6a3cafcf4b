"""Demand folding and program choice, pure functions over real planner Demands."""

from __future__ import annotations

import math

import pytest
from firmware_sim.model import predict

from fjords.engine import Engine
from proxies.choice import choose_program, rate_grid
from proxies.demand import SensorDemand, SensorView, analyse, sensor_demand, union_ranges
from tests.proxies.helpers import TRAFFIC, VEHICLES, make_fjord

S21 = SensorView(
    {"station": "773869", "segment": "S21", "latitude": 34.1, "longitude": -118.3}, "speed"
)
S10 = SensorView({"station": "767541", "segment": "S10"}, "speed")
PAIR = SensorView({"pair": "p1"}, "speed", kind="pair")


def demand_of(view: SensorView, *sqls: str, default_period_s: float | None = None) -> SensorDemand:
    fjord = make_fjord(traffic=TRAFFIC, vehicles=VEHICLES)
    engine = Engine(fjord)
    needs = [
        analyse(f"q{i}", engine.add_query(sql, query_id=f"q{i}").demand, view)
        for i, sql in enumerate(sqls)
    ]
    return sensor_demand(needs, view, default_period_s=default_period_s)


def test_static_conditions_exclude_other_sensors() -> None:
    sqls = (
        "SELECT * FROM traffic WHERE segment IN ('S21', 'S22')",
        "SELECT * FROM traffic WHERE station = 767541 AND speed < 40",
        "SELECT * FROM traffic WHERE segment = 'S10' SAMPLE PERIOD 2 SECONDS",
    )
    d21, d10 = demand_of(S21, *sqls), demand_of(S10, *sqls)
    assert d21.queries == ("q0",) and d21.ranges is None and d21.sample_period_s is None
    assert d10.queries == ("q1", "q2") and d10.sample_period_s == 2.0
    assert d10.ranges is None  # q2 needs every reading
    assert demand_of(S10, "SELECT * FROM traffic WHERE segment = 'S99'").idle


def test_union_of_value_ranges() -> None:
    d = demand_of(
        S21,
        "SELECT * FROM traffic WHERE speed < 30",
        "SELECT * FROM traffic WHERE speed > 70 AND segment = 'S21'",
        "SELECT * FROM traffic WHERE speed BETWEEN 40 AND 45",
        "SELECT * FROM traffic WHERE speed >= 42 AND speed <= 50",
        "SELECT * FROM traffic WHERE speed IN (60, 61)",
        "SELECT * FROM traffic WHERE speed > 10 AND speed < 5",  # nothing: not interested
    )
    assert d.ranges == ((None, 30.0), (40.0, 50.0), (60.0, 60.0), (61.0, 61.0), (70.0, None))
    assert len(d.queries) == 5
    # A residual condition or a query with no value condition needs every reading.
    assert demand_of(S21, "SELECT * FROM traffic WHERE speed * 2 < 60").ranges is None
    assert (
        demand_of(
            S21, "SELECT * FROM traffic WHERE speed < 3", "SELECT station FROM traffic"
        ).ranges
        is None
    )
    assert union_ranges([(None, 5.0), (3.0, None)]) is None


AVG5 = "SELECT station, AVG(speed) AS a FROM traffic [RANGE 5 MINUTES] GROUP BY station"
AVG15 = "SELECT segment, AVG(speed), MIN(speed), MAX(speed), SUM(speed), COUNT(*) FROM traffic [RANGE 15 MINUTES] GROUP BY segment"


def test_aggregate_pushdown_window() -> None:
    assert demand_of(S21, AVG5, AVG15).window_s == 300.0
    sliding = "SELECT AVG(speed) FROM traffic [RANGE 1 HOUR SLIDE 10 MINUTES]"
    assert demand_of(S21, AVG15, sliding).window_s == 300.0
    assert (
        demand_of(S21, AVG15, "SELECT MAX(speed) FROM traffic [RANGE 7 MINUTES]").window_s == 60.0
    )
    not_pushable = [
        "SELECT * FROM traffic",
        "SELECT AVG(speed) FROM traffic [RANGE 5 MINUTES] WHERE speed > 10",
        "SELECT speed, COUNT(*) FROM traffic [RANGE 5 MINUTES] GROUP BY speed",
        "SELECT AVG(speed * 2) FROM traffic [RANGE 5 MINUTES]",
        "SELECT MAX(time) FROM traffic [RANGE 5 MINUTES]",
        "SELECT AVG(speed) FROM traffic [ROWS 10]",
    ]
    for sql in not_pushable:
        assert demand_of(S21, AVG5, sql).window_s is None, sql
    # A query that excludes this sensor does not stop the pushdown.
    assert demand_of(S21, AVG5, "SELECT * FROM traffic WHERE segment = 'S10'").window_s == 300.0


def test_period_lifetime_fields_and_pair_needs() -> None:
    d = demand_of(
        S21,
        "SELECT station FROM traffic SAMPLE PERIOD 10 SECONDS LIFETIME 60 DAYS",
        "SELECT speed FROM traffic SAMPLE PERIOD 2 SECONDS LIFETIME 30 DAYS",
        default_period_s=60,
    )
    assert (d.sample_period_s, d.lifetime_s) == (2.0, 30 * 86400.0)
    assert d.fields == ("station", "speed")
    assert demand_of(S21, "SELECT station FROM traffic", default_period_s=60).sample_period_s == 60
    counts = "SELECT pair, COUNT(*) AS n FROM vehicles [RANGE 1 MINUTE] GROUP BY pair"
    speeds = "SELECT pair, AVG(speed) FROM vehicles [RANGE 1 MINUTE] GROUP BY pair"
    assert demand_of(PAIR, counts).needs == "counts"
    assert demand_of(PAIR, counts).window_s == 60.0
    assert demand_of(PAIR, counts, speeds).needs == "vehicles"
    assert demand_of(PAIR, "SELECT * FROM vehicles").needs == "vehicles"
    assert demand_of(PAIR, counts, "SELECT * FROM vehicles WHERE pair = 'p2'").needs == "counts"


ALL = ("raw", "filter", "aggregate", "count", "vehicle", "deadband")


def test_choice_by_demand() -> None:
    assert choose_program(SensorDemand(), capabilities=ALL).program == "sleep"
    agg = choose_program(SensorDemand(("q",), window_s=300.0), capabilities=ALL)
    assert (agg.program, agg.params) == ("aggregate", {"window_ms": 300000})
    flt = choose_program(SensorDemand(("q",), ranges=((None, 45.0),)), capabilities=ALL)
    assert (flt.program, flt.params) == ("filter", {"ranges": [[None, 45.0]]})
    assert choose_program(SensorDemand(("q",)), capabilities=ALL).program == "raw"
    # A capability the mote lacks is never chosen.
    only_raw = choose_program(SensorDemand(("q",), window_s=300.0), capabilities=("raw",))
    assert only_raw.program == "raw"
    # Pairs: count at >= 60 Hz, vehicle at >= 180 Hz, raw (detected here) as a last resort.
    c = choose_program(
        SensorDemand(("q",), window_s=60.0, needs="counts"), kind="pair", capabilities=ALL
    )
    assert (c.program, c.params, c.rate_hz) == ("count", {"period_ms": 1000}, 60.0)
    v = choose_program(
        SensorDemand(("q",), needs="vehicles"), kind="pair", capabilities=ALL, role="downstream"
    )
    assert (v.program, v.params, v.rate_hz) == ("vehicle", {"role": "downstream"}, 180.0)
    r = choose_program(SensorDemand(("q",), needs="vehicles"), kind="pair", capabilities=("raw",))
    assert r.program == "raw" and r.gateway_detects
    # The rate: the shortest SAMPLE PERIOD, else the sensor's own rate.
    assert (
        choose_program(SensorDemand(("q",), sample_period_s=0.5), current_rate_hz=10).rate_hz == 2.0
    )
    assert choose_program(SensorDemand(("q",)), current_rate_hz=10).rate_hz == 10


def test_lifetime_picks_highest_lasting_rate_or_says_none_does() -> None:
    days30 = 30 * 86400.0
    c = choose_program(
        SensorDemand(("q",), lifetime_s=days30), capabilities=ALL, listen_ms_per_s=20
    )
    assert c.lifetime_met and c.program == "raw"
    assert c.prediction is not None and c.prediction.lifetime_s >= days30
    grid = rate_grid()
    faster = grid[grid.index(c.rate_hz) + 1]
    assert predict("raw", faster, listen_ms_per_s=20).lifetime_s < days30
    # Capped by what the queries ask for.
    slow = choose_program(
        SensorDemand(("q",), lifetime_s=days30, sample_period_s=1.0), capabilities=ALL
    )
    assert slow.rate_hz == 1.0 and slow.lifetime_met
    # 10 years cannot be had even at the slowest rate of a pair's vehicle program.
    none = choose_program(
        SensorDemand(("q",), lifetime_s=3650 * 86400.0, needs="vehicles"),
        kind="pair",
        capabilities=ALL,
    )
    assert none.lifetime_met is False and "none does" in none.reason
    assert none.rate_hz == 180.0  # the slowest useful rate: the longest-lived option


@pytest.mark.parametrize("rate", [0.0, math.inf, None])
def test_no_rate_no_prediction(rate: float | None) -> None:
    c = choose_program(SensorDemand(("q",)), current_rate_hz=rate)
    assert c.program == "raw" and c.prediction is None
