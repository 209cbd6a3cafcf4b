"""Simulated motes: programs, energy, controls, faults, METR-LA replay, vehicle reconstruction."""

from __future__ import annotations

import pytest

from sensors.motes import FaultConfig, FaultInjector, MoteClock, TraceReplayFleet, TrafficPair
from sensors.motes.replay import TraceFormatError, load_stations, load_trace
from sensors.protocol import Ack, AggregateReport, Control, Events, Hello, Listen, Samples
from sensors.reconstruct import PairStreams, VehicleReconstructor
from sensors.transports.inprocess import InProcessHub
from tests.support import shared_file


async def drain(hub: InProcessHub) -> list:
    return hub._inbound.queue.drain()


async def test_vehicle_pair_reconstructs_speed_and_length() -> None:
    async with InProcessHub() as hub:
        pair = TrafficPair("p", hub.link, duration_s=30, vehicles_per_second=0.5, seed=2)
        await pair.run()
        got = await drain(hub)
    streams = PairStreams()
    vehicles = [v for v in streams.feed_all(got) + streams.flush() if v.matched]
    truth = pair.trace.vehicles
    assert len(vehicles) == len(truth) > 5
    for v, t in zip(vehicles, truth, strict=True):
        assert v.speed_fps == pytest.approx(t.speed_fps, rel=0.15)
        assert v.length_ft == pytest.approx(t.length_ft, rel=0.2)
    # exact energy account: every sample charged, radio bits as the firmware sends them
    up = pair.upstream
    assert up.energy.elapsed_s == pytest.approx(30, rel=0.01)
    assert up.program.total.samples == up.stats.samples
    assert up.energy.joules["radio"] > 0 and up.energy.joules["listen"] > 0


async def test_count_and_raw_programs_and_listen_windows() -> None:
    async with InProcessHub() as hub:
        pair = TrafficPair("c", hub.link, duration_s=5, program="count", vehicles_per_second=2)
        await pair.run()
        got = [m for _, m in await drain(hub)]
    aggs = [m for m in got if isinstance(m, AggregateReport) and m.sensor_id == "c-u"]
    assert sum(a.values["count"] for a in aggs) == len(pair.trace.vehicles)
    assert any(getattr(m, "listen_ms", None) for m in got)  # windows ride on data packets
    async with InProcessHub() as hub:
        raw = TrafficPair("r", hub.link, duration_s=1, program="raw", rate_hz=40)
        await raw.run()
        got = [m for _, m in await drain(hub)]
    samples = [m for m in got if isinstance(m, Samples) and m.sensor_id == "r-u"]
    assert sum(len(m.times) for m in samples) == 40
    assert max(len(m.times) for m in samples) == 8  # the firmware batches 8 readings


async def test_controls_are_applied_in_listen_windows_and_acked() -> None:
    async with InProcessHub() as hub:
        pair = TrafficPair("k", hub.link, duration_s=6, program="vehicle", listen_every_s=0.5)
        await hub.send("k-u", Control.load_program("k-u", "count", {"period_ms": 500}, seq=1))
        await hub.send("k-d", Control.load_program("k-d", "nonsense", seq=2))
        await hub.send("k-d", Control.set_period("k-d", 10.0, seq=3))
        await pair.run()
        got = [m for _, m in await drain(hub)]
    acks = {(m.sensor_id, m.ack_seq): m for m in got if isinstance(m, Ack)}
    assert acks[("k-u", 1)].ok and pair.upstream.program_name == "count"
    assert not acks[("k-d", 2)].ok and "unknown program" in acks[("k-d", 2)].error
    assert acks[("k-d", 3)].ok and pair.downstream.period_s == pytest.approx(0.01)
    assert any(isinstance(m, AggregateReport) and m.sensor_id == "k-u" for m in got)
    assert pair.downstream.stats.samples < pair.upstream.stats.samples  # 100 Hz vs 180 Hz


async def test_faults_loss_garbling_delay_skew_and_offline() -> None:
    faults = FaultInjector(
        FaultConfig(loss=0.1, garble=0.1, delay=0.2, max_delay_s=3.0, offline=((2.0, 3.0),), seed=5)
    )
    async with InProcessHub() as hub:
        pair = TrafficPair(
            "f",
            hub.link,
            duration_s=8,
            program="raw",
            rate_hz=60,
            faults=(faults, FaultInjector()),
            clocks=(MoteClock(offset_s=100.0, drift_ppm=50), MoteClock()),
        )
        await pair.run()
        got = [m for _, m in await drain(hub)]
    s = faults.stats
    assert s.lost and s.garbled and s.delayed and s.offline_dropped
    assert hub.stats.dropped_bad > 0  # garbled packets fail decoding and are counted
    up = [m for m in got if isinstance(m, Samples) and m.sensor_id == "f-u"]
    assert min(t for m in up for t in m.times) >= 100.0  # the skewed clock shows
    seqs = [m.seq for m in up]
    assert seqs != sorted(seqs)  # delayed packets arrive out of order
    hellos = [m for m in got if isinstance(m, Hello) and m.sensor_id == "f-u"]
    assert len(hellos) == 2  # back from offline, it says hello again
    assert not any(isinstance(m, Listen) and m.sensor_id == "x" for m in got)


def test_reconstructor_outer_joins_lost_events() -> None:
    r = VehicleReconstructor(separation_ft=10.0, pair="p", max_travel_s=0.5)
    out = r.upstream(0.0, 0.3) + r.downstream(0.1, 0.4)  # 100 ft/s, 30 ft
    out += r.upstream(2.0, 2.2)  # its downstream event is lost
    out += r.upstream(4.0, 4.1) + r.downstream(4.05, 4.15)
    out += r.downstream(5.0, 5.1)  # no upstream partner
    out += r.flush()
    assert out[0].speed_fps == pytest.approx(100.0) and out[0].length_ft == pytest.approx(30.0)
    assert [v.matched for v in out] == [True, False, True, False]
    assert out[2].speed_fps == pytest.approx(200.0)
    assert r.stats.upstream_only == 1 and r.stats.downstream_only == 1
    assert r.feed(Events(sensor_id="x", name="sideways", times=((1.0, 2.0),))) == []
    assert r.stats.bad == 1


async def test_metr_la_fleet_one_mote_per_station() -> None:
    readings = shared_file("data/metr-la/readings.csv")
    stations_csv = shared_file("data/metr-la/stations.csv")
    stations = load_stations(stations_csv)
    assert len(stations) == 207
    some = set(list(stations)[:5])
    trace = load_trace(readings, stations=some)
    async with InProcessHub() as hub:
        fleet = TraceReplayFleet(trace, stations, hub.link)
        await fleet.run()
        got = await drain(hub)
    hellos = {sid: m for sid, m in got if isinstance(m, Hello)}
    assert set(hellos) == some
    for sid, h in hellos.items():
        assert h.attributes["segment"] == stations[sid]["segment"]
        assert h.attributes["latitude"] == stations[sid]["latitude"]
    values = [r[0] for sid, m in got if isinstance(m, Samples) and sid == "773869" for r in m.rows]
    assert values == [v for _, v in trace["773869"]]


def test_bad_trace_files_say_where(tmp_path) -> None:
    bad = tmp_path / "r.csv"
    bad.write_text("time,station,speed\n1,a,fast\n")
    with pytest.raises(TraceFormatError, match=r"r.csv:2"):
        load_trace(bad)
    bad.write_text("when,station\n")
    with pytest.raises(TraceFormatError, match="missing column"):
        load_trace(bad)


async def test_a_mote_asked_to_introduce_itself_answers_with_its_hello() -> None:
    """Discovery when the mote booted first: the gateway asks in a listen window; the hello is
    the answer (no ack: the gateway has no proxy to take one yet)."""
    async with InProcessHub() as hub:
        pair = TrafficPair("h", hub.link, duration_s=4, program="count", listen_every_s=0.5)
        await hub.send("h-u", Control.hello_request("h-u", seq=7))
        await pair.run()
        got = [m for _, m in await drain(hub)]
    hellos = [m for m in got if isinstance(m, Hello) and m.sensor_id == "h-u"]
    assert len(hellos) == 2, "the mote did not answer the hello request (one hello at boot)"
    assert not [m for m in got if isinstance(m, Ack) and m.sensor_id == "h-u" and m.ack_seq == 7]


def five_minute_trace(hours: float, t0: float = 1_338_508_800.0) -> list[tuple[float, float]]:
    return [(t0 + 300.0 * k, 50.0 + k % 7) for k in range(int(hours * 12))]


async def test_a_replay_mote_takes_periods_that_are_multiples_of_its_trace_step() -> None:
    """SET_PERIOD sub-samples the trace, so a query's SAMPLE PERIOD takes effect on a replayed
    mote; a period that is no multiple of the trace's step, or faster than it, is refused."""
    from sensors.motes import SimulatedMote

    series = five_minute_trace(24)
    async with InProcessHub() as hub:
        mote = SimulatedMote("m", hub.link("m"), field="speed", period_s=300.0, trace_step_s=300.0)
        assert mote.apply(Control.set_period("m", 420_000.0, seq=1)).ok is False
        assert "multiple" in mote.apply(Control.set_period("m", 420_000.0, seq=1)).error
        assert mote.apply(Control.set_period("m", 60_000.0, seq=2)).ok is False  # faster
        assert mote.apply(Control.set_period("m", 900_000.0, seq=3)).ok
        assert mote.hello().sample_period_ms == 900_000.0
        await mote.run(series)
        got = [m for _, m in await drain(hub)]
    times = [t for m in got if isinstance(m, Samples) for t in m.times]
    assert times == [t for t, _ in series][::3]
    assert mote.stats.samples == len(series) // 3
    # The skipped readings' time is spent idle: the account still covers the whole day.
    assert mote.energy.elapsed_s == pytest.approx(len(series) * 300.0, rel=0.01)


async def test_sleep_lasts_until_wake_with_a_receive_window_every_duration() -> None:
    """Asleep: no readings, a bare listen every `duration` (charged), until a wake."""
    from sensors.motes import SimulatedMote

    series = five_minute_trace(12)
    async with InProcessHub() as hub:
        mote = SimulatedMote(
            "m", hub.link("m"), field="speed", period_s=300.0, listen_every_s=2400.0
        )
        for t, v in series[:4]:
            await mote.step(t, v)
        assert mote.apply(Control.sleep("m", 600_000.0, seq=1)).ok and mote.asleep
        for t, v in series[4:100]:
            await mote.step(t, v)
        got = [m for _, m in await drain(hub)]
        listens = [m for m in got if isinstance(m, Listen)]
        assert not [m for m in got if isinstance(m, Samples)]
        assert len(listens) == 48 and mote.stats.samples == 4  # every 600 s, for 8 hours
        assert mote.energy.joules["listen"] > 0 and mote.stats.asleep_s == 96 * 300.0
        await hub.send("m", Control.wake("m", seq=2))
        for t, v in series[100:]:
            await mote.step(t, v)
        got = [m for _, m in await drain(hub)]
    assert not mote.asleep
    assert any(isinstance(m, Ack) and m.ack_seq == 2 and m.ok for m in got)
    # Woken in its next window (reading 101, 600 s after the one at 99): samples from 102.
    assert mote.stats.samples == 4 + len(series) - 102


async def test_a_loop_pair_can_run_on_epoch_time() -> None:
    """The embedded defaults' pair shares stream time with the epoch-dated fleet."""
    start = 1_700_000_000.0
    async with InProcessHub() as hub:
        pair = TrafficPair("e", hub.link, duration_s=3, program="raw", rate_hz=20, start=start)
        await pair.run()
        got = [m for _, m in await drain(hub)]
    times = [t for m in got if isinstance(m, Samples) and m.sensor_id == "e-u" for t in m.times]
    assert len(times) == 60 and start <= min(times) and max(times) < start + 3
    assert pair.value_at("upstream", start) == pair.trace.upstream[0]


async def test_an_asleep_mote_asked_for_its_hello_wakes() -> None:
    """A gateway restarted while the mote slept takes its hello to mean awake."""
    from sensors.motes import SimulatedMote

    series = five_minute_trace(2)
    async with InProcessHub() as hub:
        mote = SimulatedMote("m", hub.link("m"), field="speed", period_s=300.0)
        await mote.step(*series[0])
        mote.apply(Control.sleep("m", 300_000.0, seq=1))
        await hub.send("m", Control.hello_request("m", seq=2))
        await mote.step(*series[1])
        assert not mote.asleep
        got = [m for _, m in await drain(hub)]
    assert [type(m) for m in got] == [Listen, Hello]


async def test_asleep_listens_carry_the_clock_and_nothing_sent_later_is_older() -> None:
    """SLEEP in a receive window: the mote first sends the readings its raw batch holds, then
    acks; asleep, every listen carries its clock; after the wake every reading is later than
    the last listen (a heartbeat the gateway may trust). Sleep and wake are recorded."""
    from sensors.motes import SimulatedMote

    series = five_minute_trace(12)
    async with InProcessHub() as hub:
        mote = SimulatedMote(
            "m", hub.link("m"), field="speed", period_s=300.0, listen_every_s=600.0
        )
        await hub.send("m", Control.sleep("m", 600_000.0, seq=1))
        for t, v in series[:80]:
            await mote.step(t, v)
        assert mote.asleep
        await hub.send("m", Control.wake("m", seq=2))
        for t, v in series[80:]:
            await mote.step(t, v)
        await mote.finish()
        got = [m for _, m in await drain(hub)]
    sleep_ack = next(i for i, m in enumerate(got) if isinstance(m, Ack) and m.ack_seq == 1)
    before = [t for m in got[:sleep_ack] if isinstance(m, Samples) for t in m.times]
    # The first window is a bare listen at reading 5 (no raw packet yet): the 5 readings the
    # batch holds go out before the ack.
    assert before == [t for t, _ in series[:5]]
    wake_ack = next(i for i, m in enumerate(got) if isinstance(m, Ack) and m.ack_seq == 2)
    asleep = [m for m in got[sleep_ack:wake_ack] if isinstance(m, Listen)]
    timed = [m.time for m in asleep if m.time is not None]
    assert len(timed) == len(asleep) == 38 and timed == sorted(timed)  # 80 - 5 readings / 2
    # Awake, a bare listen says nothing of its clock (its raw batch may hold older readings).
    awake = [m for m in got[:sleep_ack] + got[wake_ack:] if isinstance(m, Listen)]
    assert awake and all(m.time is None for m in awake)
    after = [t for m in got[sleep_ack:] if isinstance(m, Samples) for t in m.times]
    assert after and min(after) > max(timed)
    assert [k for k, _ in mote.stats.transitions] == ["sleep", "wake"]
    assert mote.stats.transitions[1][1] == max(timed)  # woken in its last listen window
    assert len(before) + len(after) == mote.stats.samples  # every reading taken was sent
