"""The supervised-transport base: a task that fails is logged, counted and restarted with
backoff, and the transport reports itself down with the reason meanwhile."""

from __future__ import annotations

import asyncio
import logging

import pytest

from fjords.supervision import Backoff
from sensors.protocol import Control, Hello, Samples, Status, encode_message
from sensors.transports.base import TransportClosed, TransportUnavailable
from sensors.transports.inprocess import InProcessHub
from sensors.transports.supervisor import SeqTracker, SupervisedTransport
from tests.support import async_eventually

pytestmark = pytest.mark.timeout(30)


def sample(sid: str, seq: int) -> Samples:
    return Samples(sensor_id=sid, seq=seq, times=(float(seq),), rows=((1.0,),))


class Flaky(SupervisedTransport):
    """Connects, delivers one message, then fails with a bug until `heal` is set."""

    def __init__(self) -> None:
        super().__init__("flaky", backoff=Backoff(0.01, 0.05))
        self.heal = asyncio.Event()
        self.failing = asyncio.Event()
        self.sessions = 0

    async def session(self) -> None:
        self.sessions += 1
        self.mark_connected()
        self.accept(encode_message(sample("m", self.sessions)), where="test")
        if not self.heal.is_set():
            self.failing.set()
            raise KeyError("a bug in the transport")
        await asyncio.Event().wait()

    async def _send(self, sensor_id: str, msg: Control) -> None:
        if not self.stats.connected:
            raise TransportUnavailable("down")


async def test_a_failing_task_is_restarted_and_reported_down_meanwhile(
    caplog: pytest.LogCaptureFixture,
) -> None:
    t = Flaky()
    with pytest.raises(TransportClosed):
        await t.send("m", Control.wake("m"))
    async with t:
        await asyncio.wait_for(t.failing.wait(), 5)
        await async_eventually(
            lambda: t.stats.restarts, lambda n: n >= 3, timeout=60, interval=0.005
        )
        # It failed at once each time: the delay grew to its cap (not reset by each connect).
        assert t.backoff.next() == 0.05
        # Down between attempts, with the reason; the failure was logged with its traceback.
        await async_eventually(lambda: not t.stats.connected, timeout=60, interval=0.001)
        assert t.health() and "KeyError" in t.health()[0] and "flaky" in t.health()[0]
        assert any(r.levelno == logging.ERROR and r.exc_info for r in caplog.records)
        with pytest.raises(TransportUnavailable):
            await t.send("m", Control.wake("m"))
        t.heal.set()
        await t.wait_connected(5)
        await async_eventually(
            lambda: (t.sessions, t.stats.restarts),
            lambda s: s[0] > s[1],
            timeout=60,
            interval=0.005,
        )
        assert t.health() == [] and t.stats.connected
        restarts = t.stats.restarts
        await asyncio.sleep(0.1)
        assert t.stats.restarts == restarts  # healed: no more restarts
        got = [m.seq for _, m in t._inbound.queue.drain()]
        assert got == list(range(1, t.sessions + 1))  # every session's message was kept
    assert not t.stats.connected and t.health() == ["flaky: closed"]


async def test_decode_and_validate_counts_each_reason_and_logs_it_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "sensors.transports")
    deep = b"\x93\x01\xa7samples" + b"\x91" * 5000 + b"\x01"
    async with InProcessHub() as hub:
        assert hub.health() == []
        for _ in range(3):
            hub._receive("m", deep)
        hub._receive("m", encode_message(sample("x", 1)))  # claims another sender
        hub._receive("m", encode_message(Control.wake("m")))  # controls only go to motes
        hub._receive("m", encode_message(sample("m", 1)))
        got = hub._inbound.queue.drain()
    assert [m.seq for _, m in got] == [1]
    assert hub.stats.bad == {"protocol": 3, "sender": 1, "kind": 1}
    assert hub.stats.dropped_bad == 5
    warnings = [r.getMessage() for r in caplog.records if "bad packet" in r.getMessage()]
    assert len(warnings) == 3  # one per reason, not one per packet


def test_sequence_gaps_duplicates_and_restarts() -> None:
    t = SeqTracker(max_sensors=2)
    hello = Hello(sensor_id="a", seq=0, schema=())
    assert t.see("a", hello) == 0
    for seq in (1, 2, 5, 6):  # 3 and 4 never came
        t.see("a", sample("a", seq))
    t.see("a", hello)  # a retained hello delivered again after a reconnect
    t.see("a", Status(sensor_id="a", online=True))  # status messages are not numbered
    t.see("a", sample("a", 6))  # a QoS 1 redelivery
    assert (t.gaps, t.duplicates) == (2, 2)
    for seq in range(5000, 5003):
        t.see("b", sample("b", seq))
    t.see("b", sample("b", 0))  # the mote restarted its counter
    t.see("b", sample("b", 1))
    assert t.gaps == 2
    t.see("c", sample("c", 1))
    assert t.untracked == 1  # bounded memory


def _gaps(messages: list[Hello | Samples | Status]) -> tuple[int, int]:
    """(gaps, duplicates) after one sensor's messages, in arrival order."""
    t = SeqTracker()
    for m in messages:
        t.see(m.sensor_id, m)
    return t.gaps, t.duplicates


def hello(seq: int) -> Hello:
    return Hello(sensor_id="m", seq=seq, schema=())


def samples(*seqs: int) -> list[Samples]:
    return [sample("m", s) for s in seqs]


def test_a_reconnect_hello_ahead_of_the_backlog_is_no_gap() -> None:
    """The mote numbers its reconnect hello (117) after what it queued while the broker was
    away (101-116), and publishes it first: nothing was missed."""
    run = [hello(0), *samples(*range(1, 101)), hello(117), *samples(*range(101, 117), 118, 119)]
    assert _gaps(run) == (0, 0)
    # two reconnects before the backlog is through
    run = [*samples(1, 2), hello(10), hello(15), *samples(*range(3, 10), *range(11, 15), 16)]
    assert _gaps(run) == (0, 0)
    # the gateway's first message from the mote is such a hello
    assert _gaps([hello(50), *samples(*range(40, 50), 51)]) == (0, 0)


def test_real_losses_around_a_hello_still_count() -> None:
    # QoS 0: 101-116 lost while the broker was away, then the hello and new data
    assert _gaps([*samples(99, 100), hello(117), *samples(118)]) == (16, 0)
    # the mote's full queue dropped its oldest (101-109) while away
    assert _gaps([*samples(100), hello(117), *samples(*range(110, 117), 118)]) == (9, 0)


def test_a_retained_hello_delivered_again_moves_nothing() -> None:
    """A gateway that resubscribes gets every mote's retained hello again, numbered long ago:
    not a restart of the mote's counter (which would count its whole history as missed)."""
    run = [hello(0), *samples(*range(1, 5001)), hello(0), *samples(5001, 5002)]
    assert _gaps(run) == (0, 1)


def test_a_mote_that_restarts_its_counter_is_followed() -> None:
    # rebooted: a hello numbered 0, then 1, 2 (well within restart_below of its old place)
    run = [hello(0), *samples(*range(1, 300)), hello(0), *samples(1, 2, 3, 5)]
    assert _gaps(run) == (1, 1)  # 4 is missing from the new run; the hello is seen again
    # no hello seen (lost): a number far below its place still means a restart
    assert _gaps([*samples(5000, 5001), *samples(0, 1)]) == (0, 0)


async def test_health_reports_drops_while_they_increase() -> None:
    async with InProcessHub(queue_bound=1) as hub:
        hub._receive("m", encode_message(sample("m", 1)))
        assert hub.health() == []
        hub._receive("m", encode_message(sample("m", 2)))  # evicts the first: a drop
        assert any("dropping messages" in r for r in hub.health())
        hub.drop_window_s = 0.0  # long after the last drop
        assert hub.health() == []


async def test_a_packet_that_trips_a_bug_is_skipped_not_fatal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with InProcessHub() as hub:
        real = hub.accept_message

        def buggy(msg, **kw):
            if msg.seq == 1:
                raise ZeroDivisionError("bug")
            return real(msg, **kw)

        monkeypatch.setattr(hub, "accept_message", buggy)
        for seq in (1, 2):
            hub._receive("m", encode_message(sample("m", seq)))
        assert [m.seq for _, m in hub._inbound.queue.drain()] == [2]
        assert hub.stats.bad == {"error": 1} and hub.health() == []
