"""Stalls (proxies.stall): a sensor whose data stops while the program the gateway gave it
should send is stalled after `stall_after` of its periods (and `stall_min_s` of wall clock),
whatever a control it acknowledged claimed; not a sleeping sensor whose listens arrive, not a
filter that may send nothing, not a sensor that said it goes offline; its data clears it."""

from __future__ import annotations

import logging

import pytest

from proxies.admission import NewIdLimit, TokenBucket
from proxies.demand import SensorDemand
from proxies.discovery import Discovery
from proxies.stall import StallWatch
from proxies.stats import RateLimitedLog
from sensors.protocol import Ack, ControlOp, Listen, Status
from tests.proxies.test_proxy import controls, proxy, samples


def test_the_watch_needs_silence_on_both_clocks_and_clears_on_data() -> None:
    w = StallWatch(0.0, wall=0.0, stall_after=3.0, min_wall_s=10.0)
    assert w.check(100.0, wall=100.0) is None  # nothing owed
    w.expect(1.0, 0.0, 0.0)
    assert w.limit() == 3.0
    assert w.check(3.0, wall=3.0) is None  # not past 3 periods
    assert w.check(5.0, wall=5.0) is None  # past them, but not 10 s of wall clock
    assert w.check(500.0, wall=5.0) is None  # stream time raced ahead: the wall says no
    why = w.check(500.0, wall=11.0)
    assert why is not None and "no data" in why and w.stalled and w.spells == 1
    assert w.check(600.0, wall=20.0) is None  # once per stall
    assert w.data(600.0, 20.0) is True and not w.stalled
    # A new, longer expectation is owed from now on; none owed clears a stall.
    w.expect(60.0, 700.0, 30.0)
    assert w.check(800.0, wall=45.0) is None
    assert w.check(900.0, wall=45.0) is None  # (own seconds taken as wall: 180 s)
    assert w.check(900.0, wall=250.0) is not None
    assert w.expect(None, 901.0, 46.0) is True and not w.stalled
    # Without a wall clock the caller's clock alone decides; a pace shortens the wall limit.
    solo = StallWatch(0.0, stall_after=3.0)
    solo.expect(2.0, 0.0)
    assert solo.check(6.5) is not None
    fast = StallWatch(0.0, wall=0.0, stall_after=3.0, min_wall_s=1.0)
    fast.expect(300.0, 0.0, 0.0)
    assert fast.check(901.0, wall=2.0, wall_limit=lambda own: own / 600.0) is not None


def test_a_forged_sleep_it_acked_stalls_it_and_its_data_clears_it() -> None:
    p = proxy(stall_min_s=0.0)
    p.set_demand(SensorDemand(("q",)), now=0.0)  # every reading: raw at its 1 s period
    assert p.owed_gap() == 1.0
    for t in range(1, 5):
        p.on_message(samples(float(t)), now=float(t), wall=float(t))
    # Someone else's sleep (seq 999): the mote acks it and only listens from now on.
    p.on_message(Ack(sensor_id="773869", ack_seq=999), now=4.5, wall=4.5)
    assert p.stats.unknown_acks == 1 and not p.believed.asleep
    for t in (6.0, 7.0, 8.0):
        p.on_message(Listen(sensor_id="773869", duration_ms=20.0, time=t), now=t, wall=t)
        p.tick(t, wall=t)
    assert p.status == "stalled" and p.online and p.stall.spells == 1
    assert ("stalled" in [h[1] for h in p.history]) and p.stall.why
    p.on_message(samples(9.0), now=9.0, wall=9.0)
    assert p.status == "online" and p.history[-1][1] == "unstalled"


def test_asleep_by_the_gateway_a_filter_and_an_offline_status_owe_no_data() -> None:
    p = proxy(stall_min_s=0.0, sleep_s=5.0)
    p.set_demand(SensorDemand(), now=0.0)  # nobody needs it: the gateway puts it to sleep
    (sleep,) = controls(p.on_message(samples(1.0, listen=20.0), now=1.0, wall=1.0))
    assert sleep.op == ControlOp.SLEEP
    assert p.owed_gap() is None  # the gateway itself wants it asleep
    p.on_message(Ack(sensor_id="773869", ack_seq=sleep.seq), now=1.1, wall=1.1)
    for t in (6.0, 11.0, 16.0):
        p.on_message(Listen(sensor_id="773869", duration_ms=20.0, time=t), now=t, wall=t)
        p.tick(t, wall=t)
    assert p.status == "asleep" and p.stall.spells == 0
    f = proxy(stall_min_s=0.0)
    f.set_demand(SensorDemand(("q",), ranges=((80.0, None),)), now=0.0)
    (load,) = controls(f.on_message(samples(1.0, listen=20.0), now=1.0, wall=1.0))
    f.on_message(Ack(sensor_id="773869", ack_seq=load.seq), now=1.1, wall=1.1)
    assert f.believed.program == "filter" and f.owed_gap() is None
    f.tick(100.0, wall=100.0)
    assert f.status != "stalled"
    o = proxy(stall_min_s=0.0)
    o.set_demand(SensorDemand(("q",)), now=0.0)
    o.on_message(Status(sensor_id="773869", online=False, reason="will"), now=1.0, wall=1.0)
    o.tick(100.0, wall=100.0)
    assert o.status == "offline" and o.stall.spells == 0


def test_a_replay_as_fast_as_it_goes_is_not_stalled_within_the_wall_floor() -> None:
    p = proxy()  # stall_min_s 10 s
    p.set_demand(SensorDemand(("q",)), now=0.0)
    p.on_message(samples(1.0), now=1.0, wall=0.0)
    p.tick(10_000.0, wall=0.5)  # hours of stream time in half a second of wall clock
    assert p.status == "online"


def test_token_bucket_and_new_id_limit_per_source() -> None:
    b = TokenBucket(1.0, 2.0, 0.0)
    assert b.take(0.0) and b.take(0.0) and not b.take(0.0)
    assert b.take(1.0) and not b.take(1.0)
    lim = NewIdLimit(60.0, startup=5, startup_s=30.0)
    assert sum(lim.admit("mqtt", 0.0) for _ in range(100)) == 60
    assert lim.admit("serial", 0.0)  # its own bucket
    assert sum(lim.admit("mqtt", 1.0, hello=True) for _ in range(10)) == 6  # +1, +5 at start
    # 30 s later: 30 more, and no start-up allowance any more
    assert sum(lim.admit("mqtt", 31.0, hello=True) for _ in range(40)) == 30
    assert lim.refused == 40 + 4 + 10
    with pytest.raises(ValueError):
        NewIdLimit(0)


def test_discovery_forgets_ids_without_a_hello_and_logs_a_few_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    d = Discovery(max_sensors=100, forget_after_s=5.0)
    with caplog.at_level(logging.INFO, logger="proxies.discovery"):
        for i in range(200):
            d.hold(f"junk{i}", samples(1.0), now=0.0)
        d.hold("real", samples(2.0), now=4.0)
    assert len(d) == 100 and d.stats.dropped_too_many_unknown == 101  # "real" too
    assert len(caplog.records) < 15  # not one per id
    assert d.forget_idle(3.0) == []
    gone = d.forget_idle(6.0)
    assert len(gone) == 99 and "real" in d and d.stats.forgotten == 99
    assert d.forget_idle(10.0) == ["real"] and len(d) == 0


def test_rate_limited_log_says_how_many_it_left_out(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("tests.stall")
    rl = RateLimitedLog(log, "things", burst=2, interval_s=60.0)
    with caplog.at_level(logging.INFO, logger="tests.stall"):
        for k in range(10):
            rl.log(float(k), logging.WARNING, "thing %d", k)
        rl.flush(30.0)
        rl.flush(61.0)
    assert [r.getMessage() for r in caplog.records] == [
        "thing 0",
        "thing 1",
        "8 more things in the last 60 s (not logged one by one)",
    ]


def test_a_control_the_gateway_sends_is_what_it_expects() -> None:
    """A program the gateway loads (aggregate, 10 s windows) is owed once acknowledged."""
    p = proxy(stall_min_s=0.0)
    p.set_demand(SensorDemand(("q",), window_s=10.0), now=0.0)
    (load,) = controls(p.on_message(samples(1.0, listen=20.0), now=1.0, wall=1.0))
    assert load.program == "aggregate"
    assert p.owed_gap() == 10.0  # on its way: the longer of raw (believed) and the window
    p.on_message(Ack(sensor_id="773869", ack_seq=load.seq), now=1.1, wall=1.1)
    assert p.owed_gap() == 10.0
    for t in (10.0, 20.0, 25.0):  # it listens, but no window comes
        p.on_message(Listen(sensor_id="773869", duration_ms=20.0), now=t, wall=t)
    p.tick(25.0, wall=25.0)
    assert p.status == "online"
    p.on_message(Listen(sensor_id="773869", duration_ms=20.0), now=32.0, wall=32.0)
    p.tick(32.0, wall=32.0)
    assert p.status == "stalled" and p.stall.stalled
    # Silent altogether later: offline, still counted as stalled (it never said it goes).
    p.tick(500.0, wall=500.0)
    assert p.status == "offline" and p.stalled
