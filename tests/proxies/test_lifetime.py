"""LIFETIME 30 DAYS: the highest rate the cost model says will last, confirmed by the mote."""

from __future__ import annotations

import asyncio
import math

from firmware_sim.model import predict

from fjords.engine import Engine
from fjords.schema import Field, Schema
from gateway.sensors_view import sensors_catalog
from proxies.choice import rate_grid
from proxies.manager import ProxyManager
from sensors.motes import SimulatedMote
from sensors.transports.inprocess import InProcessHub
from tests.proxies.helpers import make_fjord

ENV = Schema([Field("time", "float"), Field("sensor", "str"), Field("temp", "float")], time="time")
DAYS30 = 30 * 86_400.0


async def drive(mote: SimulatedMote, until: float, marks: list[tuple[float, float, float]]) -> None:
    """Sample at the mote's current period; note (time, joules, seconds) when it changes."""
    t, period = 0.0, mote.period_s
    while t < until:
        await mote.step(t, 20.0 + math.sin(t / 60.0))
        if mote.period_s != period:
            period = mote.period_s
            marks.append((t, mote.energy.total_j, mote.energy.elapsed_s))
        t += period
        await asyncio.sleep(0)
    await mote.finish()


async def test_lifetime_30_days_highest_rate_confirmed_by_energy_account() -> None:
    fjord = make_fjord(env=ENV)
    engine = Engine(fjord)
    engine.add_query("SELECT * FROM env LIFETIME 30 DAYS", query_id="q")
    hub = InProcessHub()
    marks: list[tuple[float, float, float]] = []
    async with hub, ProxyManager(fjord, [hub]) as manager:
        mote = SimulatedMote("m1", hub.link("m1"), field="temp", period_s=0.01, listen_ms=20.0)
        mote.period_adjustable = True
        await hub.link("m1").send(mote.hello())
        await drive(mote, 300.0, marks)
        await manager.settle()
        entry = sensors_catalog(manager)[0]
    choice = manager.proxies["m1"].choice
    assert choice is not None and choice.lifetime_met and choice.program == "raw"
    rate = choice.rate_hz
    assert rate is not None and entry["sample_rate_hz"] == rate
    assert len(marks) == 1 and math.isclose(1.0 / mote.period_s, rate)
    # The cost model: this rate lasts 30 days (with the receive windows the proxy assumed)...
    listen = 20.0  # ms per second, until the proxy has seen two windows
    assert predict("raw", rate, listen_ms_per_s=listen).lifetime_s >= DAYS30
    grid = rate_grid()
    assert predict("raw", grid[grid.index(rate) + 1], listen_ms_per_s=listen).lifetime_s < DAYS30
    # ... and the mote's own account, from the switch on, agrees.
    _, j0, s0 = marks[0]
    power_mw = (mote.energy.total_j - j0) / (mote.energy.elapsed_s - s0) * 1e3
    lifetime_s = mote.energy.battery.lifetime_s(power_mw)
    assert lifetime_s >= DAYS30, lifetime_s / 86400
    assert entry["lifetime_days_estimate"] >= 30 and "30 days" in entry["wanted"]["reason"]
