"""SAMPLE EVERY n ROWS pushed to the sensors: a sensor whose every query takes each n-th reading
samples n times slower, and says so in band (`Pace.every`) so the router's count goes on in
the readings it no longer sends; one query needing every reading keeps it at its own rate."""

from __future__ import annotations

from itertools import pairwise

import pytest

from fjords.engine import Engine
from proxies.actions import PushPace
from proxies.demand import SensorDemand, SensorView, analyse, sensor_demand
from proxies.manager import ProxyManager
from proxies.proxy import SendControl, SensorProxy
from sensors.motes import TraceReplayFleet
from sensors.protocol import Ack, ControlOp
from tests.proxies.helpers import TRAFFIC, ControlHub, make_fjord
from tests.proxies.test_power import EPOCH, day, hello, listen

__all__ = ["day"]  # the module's METR-LA fixture


def _demand(*sqls: str) -> SensorDemand:
    engine = Engine(make_fjord(traffic=TRAFFIC))
    view = SensorView(static={"station": "s1", "segment": "S1"}, value_field="speed")
    needs = [analyse(f"q{i}", engine.plan(s).demand, view) for i, s in enumerate(sqls)]
    return sensor_demand(needs, view)


def test_the_sensor_may_sample_slower_only_when_every_query_samples() -> None:
    every3 = "SELECT * FROM traffic WHERE speed < 40 SAMPLE EVERY 3 ROWS"
    d = _demand(every3, "SELECT AVG(speed) FROM traffic [RANGE 1 HOUR] SAMPLE EVERY 6 ROWS")
    # The gcd; each reading counted (no mote-side filter or partials: the router counts them).
    assert d.sample_every_rows == 3 and d.ranges is None and d.window_s is None
    assert _demand(every3, "SELECT * FROM traffic").sample_every_rows is None
    assert _demand(every3, "SELECT * FROM traffic SAMPLE PERIOD 1 HOUR").sample_every_rows is None


def test_the_proxy_lowers_the_rate_and_tells_the_router_once_acked() -> None:
    p = SensorProxy(hello(), stream="traffic", schema=TRAFFIC, sensor_field="station", now=0.0)
    p.set_demand(SensorDemand(("q",), sample_every_rows=3), now=0.0)
    out = p.on_message(listen(), EPOCH)
    (slow,) = [a.control for a in out if isinstance(a, SendControl)]
    assert slow.op == ControlOp.SET_PERIOD and slow.period_ms == 900_000.0
    assert p.choice is not None and p.choice.every_rows == 3
    paces = [
        a
        for a in p.on_message(Ack(sensor_id="s1", ack_seq=slow.seq), EPOCH)
        if isinstance(a, PushPace)
    ]
    assert [a.every for a in paces] == [3]
    # Another query needs every reading: back to its own rate, and each reading counts once.
    p.set_demand(SensorDemand(("q", "r"), sample_every_rows=None), now=EPOCH)
    out = p.on_message(listen(), EPOCH + 900)
    (fast,) = [a.control for a in out if isinstance(a, SendControl)]
    assert fast.period_ms == 300_000.0
    paces = [
        a
        for a in p.on_message(Ack(sensor_id="s1", ack_seq=fast.seq), EPOCH)
        if isinstance(a, PushPace)
    ]
    assert [a.every for a in paces] == [1]


async def test_sample_every_lowers_the_simulated_motes_rate_when_it_is_their_only_query(
    day,
) -> None:
    trace, stations = day
    fjord = make_fjord(traffic=TRAFFIC)
    engine = Engine(fjord)
    got: list[tuple] = []
    engine.add_query(
        "SELECT station, time, speed FROM traffic SAMPLE EVERY 3 ROWS", query_id="q"
    ).sink.add_callback(got.append)
    hub = ControlHub()
    async with hub:
        fleet = TraceReplayFleet(trace, stations, hub.link, yield_every=1)
        async with ProxyManager(fjord, [hub]) as manager:
            await fleet.run()
            await manager.settle()
    fjord.end_of_stream()
    fjord.run_until_idle()
    skipped = fjord.stats()["queries"]["q"]["sampled_out"]
    for sid, mote in fleet.motes.items():
        assert mote.period_s == 900.0, sid
        assert mote.stats.samples < len(trace[sid]) * 0.45, (sid, mote.stats.samples)
        times = [r[1] for r in got if r[0] == sid]
        # Every third reading: before the slower rate went out the router took them, after
        # it every reading the mote sent (each stands for three).
        assert len(times) == pytest.approx(len(trace[sid]) / 3, abs=2), sid
        assert all(b - a >= 899.0 for a, b in pairwise(times)), sid
    # Only the readings sent before the slower rate was acked were left out by the router.
    assert 0 < skipped < 0.1 * sum(len(v) for v in trace.values())
