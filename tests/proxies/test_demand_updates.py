"""Registering queries stays cheap however many there are: while the manager runs, a change only
marks every sensor's demand stale, and one background pass (in slices) folds a whole burst."""

from __future__ import annotations

from fjords.fjord import Fjord
from gateway.daemon import TRAFFIC_SCHEMA
from proxies.manager import ProxyManager
from sensors.protocol import Hello
from sensors.transports.inprocess import InProcessHub


def hello(i: int) -> Hello:
    return Hello(
        sensor_id=f"s{i}",
        schema=(("speed", "float"),),
        programs=("raw", "filter", "aggregate"),
        program="raw",
        sample_period_ms=300_000.0,
        attributes={"station": f"s{i}", "segment": f"S{i % 5}"},
    )


async def test_a_burst_of_registrations_is_folded_once_per_sensor() -> None:
    f = Fjord()
    f.add_stream("traffic", TRAFFIC_SCHEMA, sensor_field="station")
    async with InProcessHub() as hub, ProxyManager(f, [hub]) as pm:
        for i in range(40):
            pm._create(hello(i), 0.0)
        await pm.settle()
        calls = 0
        real = pm._sensor_demand

        def counting(proxy, extra=None):  # noqa: ANN001, ANN202
            nonlocal calls
            calls += 1
            return real(proxy, extra)

        pm._sensor_demand = counting  # type: ignore[method-assign]
        for k in range(200):  # as the HTTP API does: register, tell the proxies, return
            f.add_query(f"SELECT station, speed FROM traffic WHERE speed > {k % 70}")
            pm.queries_changed()
        assert calls == 0, "registering did the sensors x queries work in the request"
        await pm.settle()
        assert calls <= 2 * 40  # one pass (another if a change came mid-pass), not one per query
        for proxy in pm.proxies.values():
            assert len(proxy.demand.queries) == 200
            assert proxy.demand.ranges == ((0.0, None),) or proxy.demand.ranges is not None


def test_without_a_running_manager_the_demand_is_updated_at_once() -> None:
    f = Fjord()
    f.add_stream("traffic", TRAFFIC_SCHEMA, sensor_field="station")
    pm = ProxyManager(f, [])
    pm._create(hello(0), 0.0)
    f.add_query("SELECT station, speed FROM traffic WHERE speed > 50")
    pm.queries_changed()
    assert len(pm.proxies["s0"].demand.queries) == 1
