"""Sleep until woken, rate control on trace motes, and energy on the sensor's own clock.

With METR-LA's 300 s readings a 5 s `sleep` must not wake the proxy's belief at every reading
(a `sleep` control per reading, forever); a replay mote that refuses a faster `set_period` is
capped at its trace's rate, and still takes a slower one; energy is counted from the sensor's
first reading, not from 0 up to the first epoch timestamp.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fjords.engine import Engine
from gateway.sensors_view import sensor_entry, sensors_catalog
from proxies.demand import SensorDemand
from proxies.manager import ProxyManager
from proxies.proxy import PushRelease, SendControl, SensorProxy
from sensors.motes import TraceReplayFleet, load_stations, load_trace
from sensors.protocol import Ack, Control, ControlOp, Hello, Listen, Samples
from tests.proxies.helpers import TRAFFIC, ControlHub, make_fjord
from tests.support import shared_file

DAY = 86_400.0
EPOCH = 1_338_508_800.0  # METR-LA's first day (2012-06-01)


def hello(period_ms: float = 300_000.0) -> Hello:
    return Hello(
        sensor_id="s1",
        schema=(("speed", "float"),),
        programs=("aggregate", "deadband", "filter", "raw"),
        program="raw",
        sample_period_ms=period_ms,
        battery=1.0,
        attributes={"station": "s1", "segment": "S1", "latitude": 34.0, "longitude": -118.0},
    )


def controls(actions: list) -> list[Control]:
    return [a.control for a in actions if isinstance(a, SendControl)]


def listen(ms: float = 20.0) -> Listen:
    return Listen(sensor_id="s1", duration_ms=ms)


def test_sleep_lasts_until_woken_and_its_windows_keep_it_asleep() -> None:
    p = SensorProxy(
        hello(), stream="traffic", schema=TRAFFIC, sensor_field="station", now=0.0, sleep_s=60.0
    )
    p.set_demand(SensorDemand(), now=0.0)
    t = EPOCH
    out = p.on_message(Samples(sensor_id="s1", times=(t,), rows=((60.0,),), listen_ms=20.0), t)
    (sleep,) = controls(out)
    assert sleep.op == ControlOp.SLEEP and sleep.duration_ms == 60_000.0  # the wake check
    p.on_message(Ack(sensor_id="s1", ack_seq=sleep.seq), t)
    assert p.status == "asleep" and p.pending == []
    assert p.tick(t + 1) == []
    # An older mote's listens carry no clock: released from the stream's progress at the first.
    assert PushRelease("traffic", "s1") in p.on_message(listen(), t + 60.0)
    # A day of duty-cycled windows: nothing to say, never offline, asleep throughout.
    for k in range(2, 24 * 60):
        now = t + 60.0 * k
        assert controls(p.on_message(listen(), now)) == []
        p.tick(now)
    assert p.status == "asleep" and p.stats.controls_sent == 1 and p.stats.offline_spells == 0
    assert sensor_entry(p, t + DAY)["pending_controls"] == []
    # A query arrives: wake goes out in the next window, then the program.
    p.set_demand(SensorDemand(("q",), ranges=((0.0, 40.0),)), now=t + DAY)
    sent = controls(p.on_message(listen(), t + DAY + 30))
    assert [c.op for c in sent] == [ControlOp.WAKE, ControlOp.LOAD_PROGRAM]
    for c in sent:
        p.on_message(Ack(sensor_id="s1", ack_seq=c.seq), t + DAY + 30)
    assert p.status == "online" and p.believed.program == "filter" and p.pending == []
    # The query is deleted: back to sleep; another that needs every reading: raw again.
    p.set_demand(SensorDemand(), now=t + DAY + 60)
    (again,) = controls(p.on_message(listen(), t + DAY + 90))
    assert again.op == ControlOp.SLEEP
    p.on_message(Ack(sensor_id="s1", ack_seq=again.seq), t + DAY + 90)
    p.set_demand(SensorDemand(("r",)), now=t + DAY + 100)
    sent = controls(p.on_message(listen(), t + DAY + 150))
    assert [(c.op, c.program) for c in sent] == [
        (ControlOp.WAKE, None),
        (ControlOp.LOAD_PROGRAM, "raw"),
    ]


def test_energy_clock_starts_at_the_first_reading_not_at_zero() -> None:
    p = SensorProxy(hello(), stream="traffic", schema=TRAFFIC, sensor_field="station", now=0.0)
    p.set_demand(SensorDemand(("q",)), now=0.0)
    p.tick(0.0)
    for k in range(289):  # one day of 5-minute readings, a message per 8
        t = EPOCH + 300.0 * k
        if k % 8 == 7 or k == 288:
            times = tuple(EPOCH + 300.0 * j for j in range(k - k % 8, k + 1))
            p.on_message(
                Samples(
                    sensor_id="s1",
                    times=times,
                    rows=tuple((60.0,) for _ in times),
                    listen_ms=20.0,  # a receive window per packet, as a replay mote opens
                ),
                t,
            )
        p.tick(t)
    cat = sensor_entry(p, EPOCH + DAY)
    # About a day at the raw program's power: a few joules, not 1.3e9 s of it.
    assert cat["energy_j_estimate"] == pytest.approx(cat["power_mw_estimate"] * 86.4, rel=0.01)
    assert cat["energy_j_estimate"] < 5 and cat["battery_estimate"] > 0.99


def test_a_refused_faster_period_caps_the_rate_and_a_slower_one_still_goes_out() -> None:
    p = SensorProxy(hello(), stream="traffic", schema=TRAFFIC, sensor_field="station", now=0.0)
    p.set_demand(SensorDemand(("q",), sample_period_s=60.0), now=0.0)
    (fast,) = controls(p.on_message(listen(), EPOCH))
    assert fast.op == ControlOp.SET_PERIOD and fast.period_ms == 60_000.0
    p.on_message(Ack(sensor_id="s1", ack_seq=fast.seq, ok=False, error="not a multiple"), EPOCH)
    assert p.refusals.max_rate_hz == pytest.approx(1 / 300) and p.refusals.rate_adjustable
    assert p.pending == []  # it runs that rate already
    p.set_demand(SensorDemand(("q",), sample_period_s=900.0), now=EPOCH)
    (slow,) = controls(p.on_message(listen(), EPOCH + 600))
    assert slow.op == ControlOp.SET_PERIOD and slow.period_ms == 900_000.0


# -- the METR-LA replay through the proxies --------------------------------------------------


@pytest.fixture(scope="module")
def day() -> tuple[dict[str, list[tuple[float, float]]], dict[str, dict[str, Any]]]:
    stations = load_stations(shared_file("data/metr-la/stations.csv"))
    chosen = dict(list(stations.items())[:6])
    trace = load_trace(shared_file("data/metr-la/readings.csv"), stations=set(chosen))
    t0 = min(s[0][0] for s in trace.values())
    trace = {k: [r for r in v if r[0] < t0 + DAY] for k, v in trace.items()}
    return trace, chosen


async def lockstep(
    fleet: TraceReplayFleet,
    manager: ProxyManager,
    trace: dict[str, list[tuple[float, float]]],
    steps: range,
    on_step: dict[int, Any] | None = None,
) -> None:
    """Every mote takes reading k in turn (the proxies handle each before the next)."""
    for k in steps:
        if on_step and k in on_step:
            on_step[k]()
            await manager.settle()
        for sid, mote in fleet.motes.items():
            if k < len(trace[sid]):
                await mote.step(*trace[sid][k])
        await manager.settle()
        await asyncio.sleep(0)


async def test_replay_sleeps_until_a_query_wakes_it_and_deleting_the_filter_sleeps_it(
    day,
) -> None:
    trace, stations = day
    fjord = make_fjord(traffic=TRAFFIC)
    engine = Engine(fjord)
    got: list[tuple] = []
    hub = ControlHub()
    async with hub:
        fleet = TraceReplayFleet(trace, stations, hub.link)
        async with ProxyManager(fjord, [hub]) as manager:
            for mote in fleet.motes.values():
                await mote.link.send(mote.hello())
            await manager.settle()

            def add_filter() -> None:
                q = engine.add_query(
                    "SELECT station, time, speed FROM traffic WHERE speed < 50", query_id="f"
                )
                q.sink.add_callback(got.append)
                manager.queries_changed()

            def delete_filter() -> None:
                fjord.remove_query("f")
                manager.queries_changed()

            # Six hours with no query: every sensor asleep after one sleep, not one per reading.
            await lockstep(fleet, manager, trace, range(72))
            for e in sensors_catalog(manager):
                assert e["status"] == "asleep" and e["pending_controls"] == [], e
                assert e["counters"]["controls_sent"] == 1, e["counters"]
            assert all(m.asleep for m in fleet.motes.values())
            asleep_samples = {s: m.stats.samples for s, m in fleet.motes.items()}
            await lockstep(fleet, manager, trace, range(72, 96))
            assert {s: m.stats.samples for s, m in fleet.motes.items()} == asleep_samples
            # A filter query wakes them in their next window (every 30 s, so at the next
            # 5-minute reading of the trace), and they filter.
            await lockstep(fleet, manager, trace, range(96, 160), {96: add_filter})
            for sid, mote in fleet.motes.items():
                assert not mote.asleep and mote.program_name == "filter", sid
            fjord.run_until_idle()
            assert got and all(r[2] < 50 for r in got)
            n_rows = len(got)
            # Deleted: they go back to sleep (not left filtering).
            await lockstep(fleet, manager, trace, range(160, 200), {160: delete_filter})
            for e in sensors_catalog(manager):
                assert e["status"] == "asleep" and e["wanted"]["program"] == "sleep", e
                assert e["pending_controls"] == []
            assert all(m.asleep for m in fleet.motes.values())
            fjord.run_until_idle()
            assert len(got) <= n_rows + 8 * len(fleet.motes)  # at most a packet sent before


async def test_sample_period_subsamples_the_trace(day) -> None:
    trace, stations = day
    fjord = make_fjord(traffic=TRAFFIC)
    engine = Engine(fjord)
    got: list[tuple] = []
    engine.add_query(
        "SELECT station, time, speed FROM traffic SAMPLE PERIOD 15 MINUTES", query_id="q"
    ).sink.add_callback(got.append)
    hub = ControlHub()
    async with hub:
        fleet = TraceReplayFleet(trace, stations, hub.link, yield_every=1)
        async with ProxyManager(fjord, [hub]) as manager:
            await fleet.run()
            await manager.settle()
    fjord.end_of_stream()
    fjord.run_until_idle()
    for sid, mote in fleet.motes.items():
        assert mote.period_s == 900.0, sid
        # Three times fewer readings once the period went out (in its first receive window).
        assert mote.stats.samples < len(trace[sid]) * 0.45, (sid, mote.stats.samples)
    for e in sensors_catalog(manager):
        assert e["sample_rate_hz"] == pytest.approx(1 / 900) and e["pending_controls"] == []


async def test_energy_estimate_agrees_with_the_mote_over_a_day(day) -> None:
    trace, stations = day
    fjord = make_fjord(traffic=TRAFFIC)
    engine = Engine(fjord)
    engine.add_query("SELECT station, time, speed FROM traffic", query_id="all")
    hub = ControlHub()
    async with hub:
        fleet = TraceReplayFleet(trace, stations, hub.link, yield_every=1)
        async with ProxyManager(fjord, [hub]) as manager:
            await fleet.run()
            await manager.settle()
            catalog = {e["id"]: e for e in sensors_catalog(manager)}
    for sid, mote in fleet.motes.items():
        e = catalog[sid]
        spent = mote.energy.total_j
        # The mote's account covers one sample period before its first reading; the proxy's
        # clock starts at that first reading.
        assert e["energy_j_estimate"] == pytest.approx(spent, rel=0.05), (sid, e, spent)
        assert mote.energy.elapsed_s == pytest.approx(DAY, rel=0.02)
        assert e["battery_estimate"] > 0.99


def test_a_replayed_sensor_beside_a_live_fleet_is_not_charged_for_the_years_between() -> None:
    """The caller's clock is the stream's time, which another fleet (epoch now) may drive."""
    live = 1_790_000_000.0
    p = SensorProxy(hello(), stream="traffic", schema=TRAFFIC, sensor_field="station", now=EPOCH)
    p.set_demand(SensorDemand(("q",)), now=EPOCH)
    for k in range(0, 288, 8):
        times = tuple(EPOCH + 300.0 * j for j in range(k, k + 8))
        now = times[-1] if k < 16 else live + 300.0 * k  # the live fleet joins after 2 packets
        p.on_message(
            Samples(
                sensor_id="s1", times=times, rows=tuple((60.0,) for _ in times), listen_ms=20.0
            ),
            now,
        )
        p.tick(now + 600.0)
    cat = sensor_entry(p, live + DAY)
    assert cat["energy_j_estimate"] == pytest.approx(cat["power_mw_estimate"] * 86.4, rel=0.05)


def test_displayed_power_follows_the_receive_windows_at_most_once_a_second() -> None:
    """The cost model runs on a change of belief at once, else at most once per REESTIMATE_S
    per proxy (it is the costliest step of a proxy's message)."""
    from dataclasses import dataclass
    from unittest import mock

    from proxies import energy
    from proxies.energy import REESTIMATE_S, EnergyEstimator

    @dataclass
    class B:
        program: str | None = "raw"
        params: tuple | None = None
        rate_hz: float | None = 1.0
        asleep: bool = False

    est = EnergyEstimator("mica2", now=0.0, sleep_s=60.0)
    with mock.patch.object(energy, "predict", wraps=energy.predict) as model:
        est.window(200.0, 0.1, asleep=False, cap_s=10.0)
        est.refresh(B(), 0.1)
        first = est.power_mw
        est.window(200.0, 0.5, asleep=False, cap_s=10.0)
        est.window(200.0, 0.6, asleep=False, cap_s=10.0)  # 2,000 ms per s: far more receiving
        est.refresh(B(), 0.6)
        assert model.call_count == 1 and est.power_mw == first
        est.refresh(B(rate_hz=2.0), 0.7)  # a new belief: at once
        assert model.call_count == 2
        est.refresh(B(rate_hz=2.0), 0.7 + REESTIMATE_S)  # and again after a second
        assert model.call_count == 3 and est.power_mw > first


def test_a_replayed_fleets_windows_are_estimated_by_the_wall_clock_not_the_stream_time() -> None:
    """Replayed 14,400x fast, a mote's receive windows are five minutes of stream time apart
    but a fraction of a millisecond of wall time: the cost model must not run for every one
    (it would take ~4% of the gateway's CPU at 10,000 samples/s)."""
    from unittest import mock

    from proxies import energy

    p = SensorProxy(hello(), stream="traffic", schema=TRAFFIC, sensor_field="station", now=0.0)
    with mock.patch.object(energy, "predict", wraps=energy.predict) as model:
        for i in range(1, 50):
            t = i * 300.0
            msg = Samples(sensor_id="s1", times=(t,), rows=((50.0,),), listen_ms=20.0)
            p.on_message(msg, now=t, wall=1000.0 + i * 1e-4)
        assert model.call_count <= 3  # the first belief, and a change or two
        assert p.stats.listen_windows == 49
