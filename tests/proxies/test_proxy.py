"""SensorProxy as a state machine: messages in, actions out, no I/O."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fjords.partial import Partial
from gateway.sensors_view import sensor_entry
from proxies.demand import SensorDemand
from proxies.proxy import PushHeartbeat, PushPace, PushRelease, PushRow, SendControl, SensorProxy
from sensors.protocol import (
    Ack,
    AggregateReport,
    Control,
    ControlOp,
    Hello,
    Listen,
    Samples,
    Status,
)
from tests.proxies.helpers import TRAFFIC

PROGRAMS = ("aggregate", "deadband", "filter", "raw")


def hello(**kw: object) -> Hello:
    base = {
        "sensor_id": "773869",
        "schema": (("speed", "float"),),
        "programs": PROGRAMS,
        "program": "raw",
        "sample_period_ms": 1000.0,
        "battery": 1.0,
        "attributes": {
            "station": "773869",
            "segment": "S21",
            "latitude": 34.1,
            "longitude": -118.3,
        },
    }
    base.update(kw)
    return Hello(**base)  # type: ignore[arg-type]


def proxy(**kw: object) -> SensorProxy:
    return SensorProxy(
        hello(), stream="traffic", schema=TRAFFIC, sensor_field="station", now=0.0, **kw
    )


def samples(*times: float, listen: float | None = None, value: float = 50.0) -> Samples:
    return Samples(
        sensor_id="773869",
        times=tuple(times),
        rows=tuple((value + t,) for t in times),
        listen_ms=listen,
    )


def rows(actions: list) -> list[tuple]:
    return [a.row for a in actions if isinstance(a, PushRow)]


def controls(actions: list) -> list[Control]:
    return [a.control for a in actions if isinstance(a, SendControl)]


def test_samples_become_tuples_with_static_attributes() -> None:
    p = proxy()
    out = p.on_message(samples(1.0, 2.0), now=2.0)
    assert rows(out) == [
        (1.0, "773869", 51.0, 34.1, -118.3, "S21"),
        (2.0, "773869", 52.0, 34.1, -118.3, "S21"),
    ]
    bad = Samples(sensor_id="773869", times=(3.0,), rows=((1.0, 2.0),))
    assert rows(p.on_message(bad, now=3.0)) == [] and p.stats.bad == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=60))
def test_duplicates_and_reordered_samples_are_dropped_and_counted(times: list[int]) -> None:
    p = proxy()
    pushed: list[float] = []
    for t in times:
        pushed += [r[0] for r in rows(p.on_message(samples(float(t)), now=float(t)))]
    assert pushed == sorted(set(pushed))  # strictly increasing: each sample exactly once
    assert len(pushed) + p.stats.duplicates + p.stats.out_of_order == len(times)
    # A duplicate repeats a time already pushed; anything else not newer is out of order.
    seen: set[int] = set()
    dups = 0
    for t in times:
        if seen and t <= max(seen):
            dups += t in seen
        else:
            seen.add(t)
    assert p.stats.duplicates == dups


def test_a_repeat_is_a_duplicate_while_among_the_last_256_pushed_then_out_of_order() -> None:
    """The proxy remembers the last 256 pushed times (a ring that wraps) to tell a repeated
    sample from a reordered one; the ring is an array, whose numbers the garbage collector
    does not visit (per sensor, a set and a deque of floats would be most of what its full
    passes visit in a running gateway)."""
    import gc

    p = proxy()
    for t in range(300):
        assert len(rows(p.on_message(samples(float(t)), now=float(t)))) == 1
    for t, dups, late in ((299.0, 1, 0), (100.0, 2, 0), (44.0, 3, 0), (43.0, 3, 1), (5.0, 3, 2)):
        assert rows(p.on_message(samples(t), now=300.0)) == []
        assert (p.stats.duplicates, p.stats.out_of_order) == (dups, late), t
    assert rows(p.on_message(samples(300.0), now=300.0))  # still takes new readings
    assert len(gc.get_referents(p.tuples._recent)) <= 1  # its type, not its 256 times


def test_controls_only_in_listen_windows_retried_and_superseded() -> None:
    p = proxy(retry_windows=2)
    p.set_demand(SensorDemand(("q",), ranges=((None, 40.0),)), now=1.0)
    assert controls(p.on_message(samples(1.0), now=1.0)) == []  # no window announced
    first = controls(p.on_message(samples(2.0, listen=20.0), now=2.0))
    assert [(c.op, c.program, dict(c.params)) for c in first] == [
        (ControlOp.LOAD_PROGRAM, "filter", {"ranges": [[None, 40.0]]})
    ]
    assert controls(p.on_message(Listen(sensor_id="773869", duration_ms=20), now=3.0)) == []
    again = controls(p.on_message(samples(4.0, listen=20.0), now=4.0))
    assert again == first and p.stats.retries == 1  # not acked: re-sent two windows later
    # A newer demand supersedes the pending control before it is acked.
    before = p.stats.superseded
    p.set_demand(SensorDemand(("q",), window_s=60.0), now=4.5)
    assert p.stats.superseded == before + 1
    newer = controls(p.on_message(samples(5.0, listen=20.0), now=5.0))
    assert [c.program for c in newer] == ["aggregate"]
    # The old control's late ack still tells us what the mote runs; the new one stays pending.
    p.on_message(Ack(sensor_id="773869", ack_seq=first[0].seq), now=5.1)
    assert p.believed.program == "filter" and [c.control.program for c in p.pending] == [
        "aggregate"
    ]
    p.on_message(Ack(sensor_id="773869", ack_seq=newer[0].seq), now=5.2)
    assert p.believed.program == "aggregate" and p.pending == []
    assert controls(p.on_message(samples(9.0, listen=20.0), now=9.0)) == []  # nothing to say


def test_refused_rate_and_unanswered_program_fall_back() -> None:
    p = proxy(max_sends=2, retry_windows=1)
    p.set_demand(SensorDemand(("q",), sample_period_s=0.5, ranges=((10.0, 20.0),)), now=0.0)
    sent = controls(p.on_message(samples(1.0, listen=20.0), now=1.0))
    assert [c.op for c in sent] == [ControlOp.LOAD_PROGRAM, ControlOp.SET_PERIOD]
    p.on_message(Ack(sensor_id="773869", ack_seq=sent[1].seq, ok=False, error="trace"), now=1.1)
    # Faster than it runs was refused: it is capped at its own rate, not fixed for good.
    assert p.refusals.rate_adjustable and p.refusals.max_rate_hz == 1.0 and p.stats.refused == 1
    assert p.choice is not None and p.choice.rate_hz == 1.0
    (again,) = controls(p.on_message(samples(2.0, listen=20.0), now=2.0))
    assert again.program == "filter"  # re-sent, the 2nd and last time
    assert controls(p.on_message(samples(3.0, listen=20.0), now=3.0)) == []
    # Never acknowledged: given up, and the proxy settles for a program that needs no control.
    assert p.stats.unanswered == 1 and p.choice is not None and p.choice.program == "raw"
    assert p.pending == [] and any("no ack" in e for e in p.errors)


def test_an_unanswered_program_is_asked_for_again_after_a_doubling_cooldown() -> None:
    """No ack is not a refusal (the ack may have been lost): the proxy falls back for a while,
    then asks again; only the mote's `no` is for good."""
    from proxies.refusals import COOLDOWN_S

    p = proxy(max_sends=1, retry_windows=1, retry_after_s=0.0)
    p.set_demand(SensorDemand(("q",), ranges=((10.0, 20.0),)), now=0.0)

    def window(t: float) -> list[Control]:
        return controls(p.on_message(samples(t, listen=20.0), now=t))

    (first,) = window(1.0)
    assert first.program == "filter"
    assert window(2.0) == []  # unanswered: given up, raw for now
    assert p.choice is not None and p.choice.program == "raw" and p.stats.unanswered == 1
    assert window(2.0 + COOLDOWN_S / 2) == []  # still cooling down
    (again,) = window(2.0 + COOLDOWN_S)
    assert again.program == "filter" and again.seq != first.seq
    t = 3.0 + COOLDOWN_S
    assert window(t) == [] and p.stats.unanswered == 2  # unanswered again: twice as long now
    assert window(t + COOLDOWN_S * 1.5) == []
    (third,) = window(t + COOLDOWN_S * 2)
    p.on_message(Ack(sensor_id="773869", ack_seq=third.seq), now=t + COOLDOWN_S * 2 + 0.1)
    assert (
        p.believed.program == "filter" and p.refusals.unanswered == {}
    )  # an ack resets the backoff
    # A refusal is for good.
    p.set_demand(SensorDemand(("q",), window_s=60.0), now=t + 200 * COOLDOWN_S)
    (agg,) = window(t + 201 * COOLDOWN_S)
    assert agg.program == "aggregate"
    p.on_message(
        Ack(sensor_id="773869", ack_seq=agg.seq, ok=False, error="no"), now=t + 202 * COOLDOWN_S
    )
    for k in range(3):
        assert all(c.program != "aggregate" for c in window(t + (300 + 100 * k) * COOLDOWN_S))


def test_aggregate_windows_become_partials_then_heartbeats() -> None:
    p = proxy()
    p.set_demand(SensorDemand(("q",), window_s=300.0), now=0.0)
    msg = AggregateReport(
        sensor_id="773869",
        start=600.0,
        end=900.0,
        values={"count": 3, "sum": 150.0, "min": 40.0, "max": 60.0},
    )
    out = p.on_message(msg, now=900.0)
    (row,) = rows(out)
    assert row[0] == 600.0 and row[2].__class__ is Partial and row[2].count == 3
    assert out[-1] == PushHeartbeat("traffic", "773869", 900.0)
    assert rows(p.on_message(msg, now=901.0)) == [] and p.stats.duplicates == 1
    # Once no query allows partials, windows still in flight are dropped, not pushed.
    p.set_demand(SensorDemand(("q",)), now=902.0)
    later = AggregateReport(
        sensor_id="773869",
        start=900.0,
        end=1200.0,
        values={"count": 1, "sum": 1.0, "min": 1.0, "max": 1.0},
    )
    assert rows(p.on_message(later, now=1200.0)) == [] and p.stats.stale_partials == 1
    garbage = AggregateReport(sensor_id="773869", start=1.0, end=2.0, values={"sum": 1.0})
    assert p.on_message(garbage, now=1201.0) == [] and p.stats.bad == 1


def test_a_flushed_partial_at_a_window_boundary_is_new_and_its_repeat_a_duplicate() -> None:
    """A mote told to load a program (a retry of one it already runs, say) sends what its old
    program holds first: right after the reading at a window's start that is a zero-length
    partial [900, 900], whose reading is not in the window [600, 900) before it."""
    p = proxy()
    p.set_demand(SensorDemand(("q",), window_s=300.0), now=0.0)

    def report(start: float, end: float, value: float) -> AggregateReport:
        values = {"count": 1, "sum": value, "min": value, "max": value}
        return AggregateReport(sensor_id="773869", start=start, end=end, values=values)

    assert len(rows(p.on_message(report(600.0, 900.0, 1.0), now=900.0))) == 1
    flushed = report(900.0, 900.0, 2.0)
    (row,) = rows(p.on_message(flushed, now=900.5))
    assert row[0] == 900.0 and row[2].sum == 2.0
    assert rows(p.on_message(flushed, now=901.0)) == [] and p.stats.duplicates == 1
    # The new program's window holds the readings after it.
    (rest,) = rows(p.on_message(report(900.0, 1200.0, 3.0), now=1200.0))
    assert rest[0] == 900.0 and rest[2].sum == 3.0 and p.stats.duplicates == 1


def test_offline_without_event_time_heartbeats_and_return_resends_program() -> None:
    p = proxy(offline_after=3)
    p.set_demand(SensorDemand(("q",), window_s=300.0), now=0.0)
    for t in range(1, 6):
        out = p.on_message(samples(float(t), listen=20.0 if t == 2 else None), now=float(t))
        if t == 2:
            (load,) = controls(out)
    p.on_message(Ack(sensor_id="773869", ack_seq=load.seq), now=2.5)
    assert p.believed.program == "aggregate" and p.status == "online"
    # Normal silence is a raw packet's worth of periods (8 s here); offline after 3 of those.
    assert p.tick(20.0) == [] and p.status == "online"
    out = p.tick(30.0)
    assert p.status == "offline" and p.stats.offline_spells == 1
    # Its progress is not carried forward in event time (that made its readings late when
    # other sensors raced ahead): the stream's router releases it by wall-clock idleness.
    assert out == [] and p.tick(33.0) == []
    # It comes back (a new hello): online, and its program is sent again in its next window.
    p.on_message(hello(program="raw"), now=40.0)
    assert p.status == "online" and p.believed.program == "raw"
    (resent,) = controls(p.on_message(samples(40.0, listen=20.0), now=40.0))
    assert resent.program == "aggregate" and dict(resent.params) == {"window_ms": 300000}
    assert [h[1] for h in p.history][-3:] == ["online", "hello", "sent"]
    # MQTT's last will goes straight to offline.
    p.on_message(Status(sensor_id="773869", online=False, reason="will"), now=41.0)
    assert p.status == "offline"


def test_sleep_when_unneeded_and_wake_check() -> None:
    p = proxy(sleep_s=5.0)
    p.set_demand(SensorDemand(), now=0.0)
    (sleep,) = controls(p.on_message(samples(1.0, listen=20.0), now=1.0))
    assert sleep.op == ControlOp.SLEEP and sleep.duration_ms == 5000.0
    p.on_message(Ack(sensor_id="773869", ack_seq=sleep.seq), now=1.1)
    assert p.status == "asleep"
    # Asleep, its listens carry its clock: each is a heartbeat, it stays in the stream's
    # progress (its readings after waking are never behind the watermark).
    assert p.tick(8.0) == [] and p.status == "asleep"
    out = p.on_message(Listen(sensor_id="773869", duration_ms=20.0, time=6.0), now=6.0)
    assert out == [PushHeartbeat("traffic", "773869", 6.0)] and p.status == "asleep"
    # A listen without a clock (an older mote): released from the progress, once only.
    assert p.on_message(Listen(sensor_id="773869", duration_ms=20.0), now=7.0) == [
        PushRelease("traffic", "773869")
    ]
    assert p.on_message(Listen(sensor_id="773869", duration_ms=20.0), now=8.0) == []
    assert p.tick(8.5) == []
    # It wakes to check: still nobody needs it, so it goes back to sleep in that window.
    (again,) = controls(p.on_message(samples(9.0, listen=20.0), now=9.0))
    assert again.op == ControlOp.SLEEP and p.status == "online"
    cat = sensor_entry(p, 9.0)
    assert cat["status"] == "online" and cat["wanted"]["program"] == "sleep"
    assert cat["counters"]["controls_sent"] == 2 and cat["battery_estimate"] <= 1.0


def test_pace_is_announced_on_hello_and_on_a_rate_change() -> None:
    p = proxy()
    # 1 s period, a raw packet of 8 readings: a message about every 8 s.
    assert p.progress_actions() == [PushPace("traffic", "773869", 8.0)]
    assert p.progress_actions() == []  # unchanged: not announced again
    p.set_demand(SensorDemand(("q",), sample_period_s=0.5), now=0.0)
    out = p.on_message(samples(1.0, listen=20.0), now=1.0)
    ctl = next(c for c in controls(out) if c.op == ControlOp.SET_PERIOD)
    out = p.on_message(Ack(sensor_id="773869", ack_seq=ctl.seq), now=1.1)
    assert PushPace("traffic", "773869", 4.0) in out


def test_a_reading_the_future_bound_rejects_is_counted_and_does_not_block_later_ones() -> None:
    p = proxy(admit=lambda key, t: t < 1e9)
    out = p.on_message(samples(5e9), now=1.0)
    assert rows(out) == [] and p.stats.clock_rejects == 1
    assert len(rows(p.on_message(samples(2.0), now=2.0))) == 1  # not "out of order"


def test_a_control_waits_for_its_ack_in_wall_time_as_well_as_in_windows() -> None:
    """A mote replayed as fast as possible opens windows milliseconds apart: the wake must not
    be re-sent, nor given up, before a round trip can bring its ack back (`retry_after_s` of
    the caller's wall clock), however many windows pass meanwhile."""
    p = proxy(sleep_s=30.0, retry_after_s=2.0)  # retry_windows=2, max_sends=5
    p.set_demand(SensorDemand(), now=0.0)
    (sleep,) = controls(p.on_message(samples(1.0, listen=20.0), now=1.0, wall=100.0))
    p.on_message(Ack(sensor_id="773869", ack_seq=sleep.seq), now=1.0, wall=100.01)
    assert p.status == "asleep"
    p.set_demand(SensorDemand(("q",)), now=2.0)

    def window(k: int, wall: float) -> list[Control]:
        listen = Listen(sensor_id="773869", duration_ms=20.0, time=2.0 + k)
        return controls(p.on_message(listen, now=2.0 + k, wall=wall))

    (wake,) = window(0, 100.1)
    assert wake.op == ControlOp.WAKE
    for k in range(1, 50):  # 49 windows within one second of wall time
        assert window(k, 100.1 + 0.02 * k) == []
    assert p.stats.retries == 0 and p.stats.unanswered == 0 and p.pending
    (again,) = window(50, 102.2)  # 2 s and 2 windows since: re-sent, the same control
    assert again.seq == wake.seq and p.stats.retries == 1
    p.on_message(Ack(sensor_id="773869", ack_seq=wake.seq), now=53.0, wall=102.3)
    assert p.status == "online" and p.pending == [] and p.stats.unanswered == 0


def test_a_wake_given_up_is_queued_again() -> None:
    """After max_sends unanswered sends the wake is counted unanswered, but the queries still
    need the sensor: a new wake (new seq) goes out in a later window."""
    p = proxy(sleep_s=30.0, retry_after_s=1.0, max_sends=2, retry_windows=1)
    p.set_demand(SensorDemand(), now=0.0)
    (sleep,) = controls(p.on_message(samples(1.0, listen=20.0), now=1.0, wall=0.0))
    p.on_message(Ack(sensor_id="773869", ack_seq=sleep.seq), now=1.0, wall=0.0)
    p.set_demand(SensorDemand(("q",)), now=2.0)
    sent = []
    for k in range(6):
        listen = Listen(sensor_id="773869", duration_ms=20.0, time=2.0 + k)
        sent += controls(p.on_message(listen, now=2.0 + k, wall=10.0 * k))
    assert all(c.op == ControlOp.WAKE for c in sent)
    assert p.stats.unanswered >= 1 and len({c.seq for c in sent}) >= 2
    assert [pd.control.op for pd in p.pending] == [ControlOp.WAKE]
    assert any("no ack after 2 windows" in e for e in p.errors)
