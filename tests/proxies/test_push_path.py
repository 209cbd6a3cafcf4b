"""A sample is pushed into the Fjord in the event-loop turn it arrives in: no reader task, no
outbox pump, no scheduler slice between the transport and the Fjord's stream queue."""

from __future__ import annotations

import asyncio

import pytest

from fjords.engine import Engine
from proxies.manager import ProxyManager
from sensors.protocol import encode_message
from sensors.transports.base import InboundBuffer, TransportStats
from sensors.transports.inprocess import InProcessHub
from tests.proxies.helpers import TRAFFIC, make_fjord
from tests.proxies.test_catalog_bounds import T0, hello, samples


def run_without_yielding(coro) -> None:
    """Run a coroutine that must finish without ever giving the event loop a turn."""
    with pytest.raises(StopIteration):
        coro.send(None)


async def test_a_sample_reaches_the_fjord_before_the_loop_yields() -> None:
    fjord = make_fjord(traffic=TRAFFIC)
    engine = Engine(fjord)
    rows: list[tuple] = []
    engine.add_query("SELECT time, station, speed FROM traffic").sink.add_batch_callback(
        rows.extend
    )
    queue = fjord.streams["traffic"].queue
    async with InProcessHub() as hub, ProxyManager(fjord, [hub]) as manager:
        await hub.link("s1").send(hello("s1"))
        await manager.settle()
        fjord.run_until_idle()
        before = queue.puts
        run_without_yielding(hub.link("s1").send(samples("s1", T0, T0 + 1)))
        # No await since the mote sent: the tuples are already in the stream's queue.
        assert queue.puts - before >= 2
        assert manager.stats.pushed_tuples >= 2
        fjord.run_until_idle()
        assert [r[:3] for r in rows] == [(T0, "s1", 50.0), (T0 + 1, "s1", 50.0)]
        # The same through the transport's receive path (what MQTT and serial call).
        hub._receive("s1", encode_message(samples("s1", T0 + 2)))
        fjord.run_until_idle()
        assert rows[-1][:3] == (T0 + 2, "s1", 50.0)


async def test_messages_behind_a_queued_one_keep_their_order() -> None:
    """What the listener declines is queued, and so is everything that arrives behind it until
    the reader has taken it: the listener never overtakes a queued message."""
    buf = InboundBuffer(TransportStats())
    seen: list[str] = []

    def listener(sensor_id: str, msg: object) -> bool:
        seen.append(sensor_id)
        return not sensor_id.startswith("slow")

    buf.listener = listener
    buf.deliver("a", samples("a", T0))
    buf.deliver("slow1", samples("slow1", T0))  # declined: queued
    buf.deliver("b", samples("b", T0))  # behind a queued message: queued, not offered
    assert seen == ["a", "slow1"]
    assert [i.sensor_id for i in buf.queue.drain()] == ["slow1", "b"]
    buf.deliver("c", samples("c", T0))  # the queue is empty again: offered
    assert seen == ["a", "slow1", "c"]
    assert (buf.stats.received, buf.stats.delivered) == (4, 2)  # the two queued: not yet read


async def test_data_before_hello_still_goes_through_the_reader_in_order() -> None:
    """A sensor without a hello is not the listener's: its data is held, and released after
    its hello, before anything it sends later."""
    fjord = make_fjord(traffic=TRAFFIC)
    engine = Engine(fjord)
    rows: list[tuple] = []
    engine.add_query("SELECT time, station FROM traffic").sink.add_batch_callback(rows.extend)
    async with InProcessHub() as hub, ProxyManager(fjord, [hub]) as manager:
        link = hub.link("s2")
        await link.send(samples("s2", T0))
        await link.send(hello("s2"))
        await link.send(samples("s2", T0 + 1))
        await manager.settle()
        await asyncio.sleep(0)
        fjord.run_until_idle()
    assert [r[0] for r in rows] == [T0, T0 + 1]


async def test_shutdown_ends_even_when_a_send_swallows_the_cancel() -> None:
    """Python 3.11's asyncio.wait_for (aiomqtt's publish uses it) can lose a cancel that races
    with the publish completing; the control sender must still end, or the daemon hangs on
    SIGTERM."""
    fjord = make_fjord(traffic=TRAFFIC)
    sending = asyncio.Event()

    async def swallowing_send(proxy: object, action: object) -> None:
        sending.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # the race: the cancel is lost

    async with InProcessHub() as hub:
        manager = ProxyManager(fjord, [hub])
        manager.outbox._send = swallowing_send  # type: ignore[method-assign]
        await manager.__aenter__()
        manager.outbox.send([(None, None)])  # type: ignore[list-item]
        await sending.wait()
        async with asyncio.timeout(10):
            await manager.__aexit__(None, None, None)


async def test_data_held_for_a_hello_at_start_up_is_not_late() -> None:
    """At start-up (the gateway restarted under a publishing fleet) a sensor's data can come
    before its hello while another sensor, whose hello came first, pushes newer readings: the
    stream waits for the held sensor's hello (then gets its data in order), instead of moving
    its watermark on and dropping the held data as late."""
    fjord = make_fjord(traffic=TRAFFIC)
    engine = Engine(fjord)
    rows: list[tuple] = []
    engine.add_query("SELECT time, station FROM traffic").sink.add_batch_callback(rows.extend)
    async with InProcessHub() as hub, ProxyManager(fjord, [hub]) as manager:
        await hub.link("held").send(samples("held", T0, T0 + 300))  # its backlog, no hello yet
        await manager.settle()
        await hub.link("first").send(hello("first"))
        for i in range(1, 6):  # newer readings of a sensor that did say hello
            await hub.link("first").send(samples("first", T0 + 3600 * i))
            await manager.settle()
            fjord.run_until_idle()
        await hub.link("held").send(hello("held"))
        await manager.settle()
        fjord.run_until_idle()
        router = fjord.streams["traffic"].router
        assert router.late == 0
        assert sorted(r[0] for r in rows if r[1] == "held") == [T0, T0 + 300]
        assert not manager.intake.holding  # its hold ended with its hello
        assert not any(type(k).__name__ == "_PendingHello" for k in router.progress.sensors)


async def test_an_unknown_sensor_after_start_up_holds_nothing_back() -> None:
    """Past start-up (the progress policy's idle timeout from the manager's start), data from
    a sensor without a hello holds no stream: a device sending data under ever new ids must
    not stall every window."""
    fjord = make_fjord(traffic=TRAFFIC)
    async with InProcessHub() as hub, ProxyManager(fjord, [hub]) as manager:
        manager.intake.started -= manager.progress_policy.idle_timeout_s  # start-up is over
        await hub.link("stranger").send(samples("stranger", T0))
        await manager.settle()
        assert manager.stats.before_hello == 1
        assert not manager.intake.holding


async def test_a_sensor_evicted_from_discovery_stops_holding() -> None:
    """Discovery holds at most `max_sensors` unknown sensors; one evicted for a newer one (its
    held data dropped, counted) no longer holds the streams either: the holds are bounded."""
    from proxies.discovery import Discovery

    fjord = make_fjord(traffic=TRAFFIC)
    discovery = Discovery(max_sensors=2)
    async with InProcessHub() as hub, ProxyManager(fjord, [hub], discovery=discovery) as manager:
        for sid in ("a", "b", "c"):
            await hub.link(sid).send(samples(sid, T0))
            await manager.settle()
        assert manager.intake.holding == {"b", "c"}
        assert manager.discovery.stats.dropped_too_many_unknown == 1
        fjord.run_until_idle()
        held = {k.sensor_id for k in fjord.streams["traffic"].router.progress.sensors}
        assert held == {"b", "c"}
