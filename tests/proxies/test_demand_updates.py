"""Registering queries stays cheap however many there are: while the manager runs, a change only
marks every sensor's demand stale, and one background pass (in slices) folds a whole burst."""

from __future__ import annotations

from fjords.engine import Engine
from fjords.runtime.fjord import Fjord
from gateway.daemon import TRAFFIC_SCHEMA
from proxies.manager import ProxyManager
from sensors.protocol import Hello
from sensors.transports.inprocess import InProcessHub
from tests.proxies.helpers import traffic_hello


def hello(i: int) -> Hello:
    return traffic_hello(i, i % 5)


async def test_a_burst_of_registrations_is_folded_in_slices_not_per_request() -> None:
    import time

    f = Fjord()
    engine = Engine(f)
    f.add_stream("traffic", TRAFFIC_SCHEMA, sensor_field="station")
    async with InProcessHub() as hub, ProxyManager(f, [hub]) as pm:
        for i in range(40):
            pm.registry.create(hello(i), 0.0)
        await pm.settle()
        calls = 0
        real = pm.fanout.update

        def slow(proxy, now):
            nonlocal calls
            calls += 1
            time.sleep(0.001)
            real(proxy, now)

        pm.fanout.update = slow  # type: ignore[method-assign]
        longest = 0.0
        for k in range(100):  # as the HTTP API does: register, tell the proxies, return
            engine.add_query(f"SELECT station, speed FROM traffic WHERE speed > {k % 70}")
            t = time.perf_counter()
            pm.queries_changed()
            longest = max(longest, time.perf_counter() - t)
        assert calls < 100 * 40 / 4, "each registration folded every sensor in the request"
        await pm.settle()
        assert calls < 100 * 40 / 2  # passes were replaced by newer ones, not run to the end
        for proxy in pm.proxies.values():
            assert len(proxy.demand.queries) == 100
        print(f"longest queries_changed: {longest * 1000:.1f} ms for 40 sensors at 1 ms each")


def test_without_a_running_manager_the_demand_is_updated_at_once() -> None:
    f = Fjord()
    engine = Engine(f)
    f.add_stream("traffic", TRAFFIC_SCHEMA, sensor_field="station")
    pm = ProxyManager(f, [])
    pm.registry.create(hello(0), 0.0)
    engine.add_query("SELECT station, speed FROM traffic WHERE speed > 50")
    pm.queries_changed()
    assert len(pm.proxies["s0"].demand.queries) == 1


def test_a_union_demands_what_every_branch_needs() -> None:
    """A UNION ALL of two filters: the sensor keeps the readings either branch passes (a
    pushed-down filter for the first branch alone would lose the second's rows), and a sensor
    only the second branch selects is not put to sleep."""
    f = Fjord()
    engine = Engine(f)
    f.add_stream("traffic", TRAFFIC_SCHEMA, sensor_field="station")
    pm = ProxyManager(f, [])
    pm.registry.create(hello(0), 0.0)  # segment S0
    pm.registry.create(hello(1), 0.0)  # segment S1
    engine.add_query(
        "SELECT station, speed FROM traffic WHERE segment = 'S0' AND speed < 20 "
        "UNION ALL SELECT station, speed FROM traffic WHERE speed > 70"
    )
    pm.queries_changed()
    s0, s1 = pm.proxies["s0"].demand, pm.proxies["s1"].demand
    assert s0.ranges == ((None, 20.0), (70.0, None)) and s0.queries == ("q1",)
    assert not s1.idle and s1.ranges == ((70.0, None),)
