"""Standing demands: consumers that are not the Fjord's queries (the archive, a Spark query) keep
the sensors of their streams sampling as a query would, and EXPLAIN names who a sensor serves."""

from __future__ import annotations

from fjords.demand import Demand
from fjords.engine import Engine
from proxies.manager import ProxyManager
from proxies.standing import StandingDemands
from tests.proxies.helpers import TRAFFIC, VEHICLES, make_fjord, traffic_hello


def every_reading(stream: str = "traffic", period_s: float | None = None) -> Demand:
    """What the archive asks: every field, no condition, no window."""
    fields = (TRAFFIC if stream == "traffic" else VEHICLES).names
    return Demand(stream, period_s, None, tuple(fields), (), True, (), None, ())


def manager(standing: StandingDemands, sensors: int = 3) -> tuple[ProxyManager, Engine]:
    fjord = make_fjord(traffic=TRAFFIC, vehicles=VEHICLES)
    pm = ProxyManager(fjord, [], standing=standing)
    for i in range(sensors):
        pm.registry.create(traffic_hello(i, i % 2), 0.0)
    return pm, Engine(fjord)


def test_a_standing_demand_wakes_the_sensors_and_its_removal_puts_them_back_to_sleep() -> None:
    standing = StandingDemands()
    pm, _ = manager(standing)
    assert all(p.choice.program == "sleep" for p in pm.proxies.values())  # nobody asks
    standing.set("archive", [every_reading()])
    pm.queries_changed()
    for p in pm.proxies.values():
        assert p.demand.queries == ("archive",) and p.demand.ranges is None
        assert p.demand.fields == TRAFFIC.names and p.demand.sample_period_s is None
        assert p.choice.program == "raw", p.choice
    standing.discard("archive")
    pm.queries_changed()
    assert all(p.demand.idle and p.choice.program == "sleep" for p in pm.proxies.values())


def test_a_standing_demand_set_before_the_manager_reaches_every_sensor_that_joins() -> None:
    """The gateway names the archive's demand at start; the proxies are made later, each
    sensor's demand is taken as it says hello."""
    standing = StandingDemands()
    standing.set("archive", [every_reading(period_s=600.0)])
    pm, _ = manager(standing)
    for p in pm.proxies.values():
        assert p.demand.queries == ("archive",) and p.demand.sample_period_s == 600.0
    pm.registry.create(traffic_hello(7, 3), 0.0)  # another shape of sensor, later
    assert pm.proxies["s7"].demand.queries == ("archive",)


def test_a_standing_demand_is_united_with_the_queries_and_concerns_only_its_stream() -> None:
    standing = StandingDemands()
    standing.set("archive", [every_reading(period_s=60.0)])
    standing.set("pairs-only", [every_reading("vehicles")])
    pm, engine = manager(standing)
    q = engine.add_query(
        "SELECT station, speed FROM traffic WHERE segment = 'S1' AND speed > 50 "
        "SAMPLE PERIOD 10 SECONDS"
    )
    pm.queries_changed()
    s0, s1 = pm.proxies["s0"].demand, pm.proxies["s1"].demand
    assert s0.queries == ("archive",) and s0.sample_period_s == 60.0
    # The archive takes every reading, so the query's range is no filter on the mote.
    assert s1.queries == ("archive", q.id) and s1.ranges is None and s1.sample_period_s == 10.0
    assert pm.proxies["s1"].choice.program == "raw"
    # Replaced: the new demand counts, the old one is gone.
    standing.set("archive", [every_reading(period_s=5.0)])
    pm.queries_changed()
    assert pm.proxies["s0"].demand.sample_period_s == 5.0
    assert pm.proxies["s1"].demand.queries == ("archive", q.id)  # (stream-wide first)
    standing.discard("archive")
    pm.queries_changed()
    s0, s1 = pm.proxies["s0"].demand, pm.proxies["s1"].demand
    assert s0.idle and s1.queries == (q.id,) and s1.ranges == ((50.0, None),)
    assert pm.proxies["s1"].choice.program == "filter"


def test_no_demands_named_the_sensors_sleep_as_without_any() -> None:
    standing = StandingDemands()
    standing.set("nothing", [])  # (an archive with sample_period_s = 0 names no demand)
    assert "nothing" not in standing
    pm, _ = manager(standing)
    assert all(p.demand.idle and p.choice.program == "sleep" for p in pm.proxies.values())


def test_what_if_names_the_consumers_a_sensor_serves_now() -> None:
    standing = StandingDemands()
    standing.set("archive", [every_reading(period_s=300.0)])
    pm, engine = manager(standing, sensors=2)
    q = engine.add_query("SELECT speed FROM traffic WHERE segment = 'S1'")
    pm.queries_changed()
    fast = engine.plan("SELECT speed FROM traffic SAMPLE PERIOD 1 SECONDS").demand
    changes = {c["sensor"]: c for c in pm.what_if(fast)}
    assert changes["s0"]["consumers"] == ["archive"]
    assert changes["s1"]["consumers"] == ["archive", q.id]
    assert changes["s0"]["before"]["program"] == "raw"
    assert changes["s0"]["after"]["sample_rate_hz"] == 1.0
    # Nothing changes for a query the archive's demand already covers.
    assert pm.what_if(engine.plan("SELECT speed FROM traffic").demand) == []
    standing.discard("archive")
    fjord = engine.fjord
    fjord.remove_query(q.id)
    pm.queries_changed()
    (woken, _) = pm.what_if(engine.plan("SELECT speed FROM traffic").demand)
    assert woken["before"]["program"] == "sleep" and woken["consumers"] == []
