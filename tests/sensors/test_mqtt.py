"""The MQTT transport against a real Mosquitto broker started by the fixture."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from contextlib import AsyncExitStack

import pytest

from sensors.motes import TraceReplayFleet
from sensors.protocol import Ack, Control, Hello, Message, Samples, Status
from sensors.transports.base import Inbound
from sensors.transports.broker import BrokerSettings, broker_address
from sensors.transports.mqtt import MqttMoteLink, MqttTransport, Topics
from tests.support import Broker, async_eventually

pytestmark = [pytest.mark.needs_mosquitto, pytest.mark.timeout(90)]


def fast(broker: Broker) -> BrokerSettings:
    """The fixture's broker, tried again quickly (the tests restart it)."""
    return BrokerSettings(broker.host, broker.port, reconnect_initial=0.05, reconnect_max=0.5)


async def take_until(t: MqttTransport, done, timeout: float = 30) -> list[Inbound]:
    out: list[Inbound] = []

    async def run() -> None:
        async for item in t.messages():
            out.append(item)
            if done(out):
                return

    await asyncio.wait_for(run(), timeout)
    return out


def test_topics_and_broker_parsing() -> None:
    topics = Topics("x")
    assert topics.topic("s1", "data") == "x/sensors/s1/data"
    assert topics.parse("x/sensors/s1/hello") == ("s1", "hello")
    assert topics.parse("y/sensors/s1/hello") is None
    with pytest.raises(ValueError):
        topics.topic("a/b", "data")
    assert broker_address("127.0.0.1:1884") == ("127.0.0.1", 1884, False)
    assert broker_address("broker") == ("broker", 1883, False)
    assert broker_address("[::1]:9") == ("::1", 9, False)
    assert broker_address("::1") == ("::1", 1883, False)
    assert broker_address("mqtts://broker") == ("broker", 8883, True)
    with pytest.raises(ValueError):
        broker_address("http://broker")
    with pytest.raises(ValueError):
        broker_address("broker:abc")


async def test_fleet_delivers_everything_in_order_and_controls_reach_their_mote(
    broker: Broker,
) -> None:
    stations = {
        f"st{i}": {"latitude": 34.0 + i, "longitude": -118.0, "segment": f"S{i}"} for i in range(12)
    }
    trace = {s: [(1000.0 + 300 * k, 50.0 + k % 9) for k in range(80)] for s in stations}
    async with AsyncExitStack() as stack:
        gw = await stack.enter_async_context(MqttTransport(fast(broker)))
        await gw.wait_connected(10)
        links: dict[str, MqttMoteLink] = {}

        def link_for(sensor_id: str) -> MqttMoteLink:
            links[sensor_id] = MqttMoteLink(sensor_id, fast(broker))
            return links[sensor_id]

        fleet = TraceReplayFleet(trace, stations, link_for)
        for sid, link in links.items():
            link.hello = fleet.motes[sid].hello
            await stack.enter_async_context(link)
        for link in links.values():
            await link.wait_connected(10)
        await fleet.run()
        expected = sum(m.stats.messages for m in fleet.motes.values())
        got = await take_until(
            gw, lambda out: sum(m.kind not in ("hello", "status") for _, m in out) >= expected
        )

        per: dict[str, list[Message]] = defaultdict(list)
        for sid, m in got:
            per[sid].append(m)
        assert set(per) == set(stations)
        for sid, msgs in per.items():
            hellos = [m for m in msgs if isinstance(m, Hello)]
            assert hellos and hellos[0].attributes["segment"] == stations[sid]["segment"]
            data = [m for m in msgs if m.kind not in ("hello", "status")]
            seqs = [m.seq for m in data]
            assert seqs == sorted(seqs), f"{sid} out of order"
            values = [r[0] for m in data if isinstance(m, Samples) for r in m.rows]
            assert values == [v for _, v in trace[sid]]  # every reading, in order

        # control to one mote reaches exactly that mote, at QoS 1
        await gw.send("st3", Control.set_period("st3", 250.0, seq=41))
        await gw.send("st5", Control.load_program("st5", "deadband", {"epsilon": 2}, seq=42))
        c3 = await asyncio.wait_for(links["st3"].next_control(), 10)
        c5 = await asyncio.wait_for(links["st5"].next_control(), 10)
        assert (c3.seq, c5.seq, c5.program) == (41, 42, "deadband")
        await asyncio.sleep(0.2)
        assert all(link.poll_controls() == [] for link in links.values())

        # the mote applies it and its ack comes back on the data channel
        ack = fleet.motes["st5"].apply(c5)
        await links["st5"].send(ack)
        acks = await take_until(gw, lambda out: any(isinstance(m, Ack) for _, m in out))
        assert [(sid, m.ack_seq, m.ok) for sid, m in acks if isinstance(m, Ack)] == [
            ("st5", 42, True)
        ]
    assert gw.stats.dropped_bad == 0 and gw.stats.dropped_queue_full == 0


async def test_broker_restart_loses_only_in_flight_qos0_data(broker: Broker) -> None:
    # (seq, connection epoch, when) as handed to the broker
    published: list[tuple[int, int, float]] = []
    hello = lambda: Hello(sensor_id="m", schema=(("v", "float"),))  # noqa: E731
    async with (
        MqttTransport(fast(broker)) as gw,
        MqttMoteLink(
            "m",
            fast(broker),
            hello=hello,
            on_published=lambda msg, epoch: published.append((msg.seq, epoch, time.monotonic())),
        ) as mote,
    ):
        await gw.wait_connected(10)
        await mote.wait_connected(10)
        received: list[int] = []
        hellos = 0
        seq = 0

        async def produce(until: int) -> None:
            nonlocal seq
            while seq < until:
                await mote.send(
                    Samples(sensor_id="m", seq=seq, times=(float(seq),), rows=((1.0,),))
                )
                seq += 1
                await asyncio.sleep(0.002)

        async def consume(until: int) -> None:
            nonlocal hellos
            async for _, m in gw.messages():
                if isinstance(m, Hello):
                    hellos += 1
                elif isinstance(m, Samples):
                    received.append(m.seq)
                    if m.seq >= until:
                        return

        await asyncio.gather(produce(300), consume(299))
        broker.restart()
        await asyncio.wait_for(asyncio.gather(produce(900), consume(899)), 60)

    assert received == sorted(set(received)), "duplicates or reordering"
    assert gw.stats.reconnects >= 1 and max(e for _, e, _ in published) >= 2
    lost = set(range(900)) - set(received)
    # In flight = handed to the connection the broker took down, or published before the
    # gateway had resubscribed to the fresh broker (QoS 0 is not queued for anyone).
    in_flight = {s for s, e, t in published if e == 1 or t < gw.stats.connected_at}
    assert lost <= in_flight, sorted(lost - in_flight)
    assert len(lost) < 300
    assert hellos >= 2  # the mote introduced itself again to the fresh broker


async def test_offline_status_and_back(broker: Broker) -> None:
    hello = lambda: Hello(sensor_id="m", schema=(("v", "float"),))  # noqa: E731
    async with (
        MqttTransport(fast(broker)) as gw,
        MqttMoteLink("m", fast(broker), hello=hello) as mote,
    ):
        await mote.wait_connected(10)
        await take_until(gw, lambda out: any(isinstance(m, Status) and m.online for _, m in out))
        mote.set_online(False)
        got = await take_until(
            gw, lambda out: any(isinstance(m, Status) and not m.online for _, m in out)
        )
        assert [m.reason for _, m in got if isinstance(m, Status)] == ["sleep"]
        await mote.send(Samples(sensor_id="m", seq=1, times=(1.0,), rows=((1.0,),)))
        assert mote.stats.dropped_offline == 1
        mote.set_online(True)
        got = await take_until(
            gw, lambda out: any(isinstance(m, Status) and m.online for _, m in out)
        )
        assert any(isinstance(m, Hello) for _, m in got)


async def test_bad_payloads_are_counted_not_fatal(broker: Broker) -> None:
    import aiomqtt

    async with MqttTransport(fast(broker)) as gw:
        await gw.wait_connected(10)
        async with aiomqtt.Client(broker.host, broker.port) as c:
            await c.publish("fjords/sensors/x/data", b"\x93garbage", qos=1)
            await c.publish("fjords/sensors/x/data", b"", qos=1)
            hello_on_data = Hello(sensor_id="x", schema=())
            from sensors.protocol import encode_message

            await c.publish("fjords/sensors/x/data", encode_message(hello_on_data), qos=1)
            await c.publish(
                "fjords/sensors/y/data",
                encode_message(Samples(sensor_id="x", seq=0, times=(), rows=())),
                qos=1,
            )
            await c.publish(
                "fjords/sensors/x/data",
                encode_message(Samples(sensor_id="x", seq=7, times=(), rows=())),
                qos=1,
            )
        got = await take_until(gw, lambda out: len(out) == 1)
        assert got[0].message.seq == 7
        assert gw.stats.dropped_bad == 3


# -- broker restarts and overload ---------------------------------------------------------------


async def _stream_through_restart(
    broker: Broker, restart, *, qos: int, n: int = 900
) -> tuple[list[int], MqttTransport]:
    """One mote publishing `n` samples at `qos`; the broker restarts after the first third, and
    the gateway comes back later than the mote (so the mote flushes its backlog first)."""
    hello = lambda: Hello(sensor_id="m", schema=(("v", "float"),))  # noqa: E731
    slow = BrokerSettings(broker.host, broker.port, reconnect_initial=0.8, reconnect_max=1.0)
    async with (
        MqttTransport(slow, qos=qos, identifier="gw-under-test") as gw,
        MqttMoteLink("m", fast(broker), hello=hello, data_qos=qos) as mote,
    ):
        await gw.wait_connected(10)
        await mote.wait_connected(10)
        received: list[int] = []
        seq = 0

        async def produce(until: int) -> None:
            nonlocal seq
            while seq < until:
                await mote.send(
                    Samples(sensor_id="m", seq=seq, times=(float(seq),), rows=((1.0,),))
                )
                seq += 1
                await asyncio.sleep(0.002)

        async def consume(until: int) -> None:
            async for _, m in gw.messages():
                if isinstance(m, Samples):
                    received.append(m.seq)
                    if m.seq >= until:
                        return

        await asyncio.gather(produce(n // 3), consume(n // 3 - 1))
        restart()
        await asyncio.wait_for(asyncio.gather(produce(n), consume(n - 1)), 60)
        assert gw.stats.reconnects >= 1
    return received, gw


async def test_broker_restart_with_qos1_loses_nothing(persistent_broker: Broker) -> None:
    received, gw = await _stream_through_restart(
        persistent_broker, persistent_broker.restart_cleanly, qos=1
    )
    assert set(received) == set(range(900))  # QoS 1 may deliver twice, never lose
    assert gw.stats.seq_gaps == 0


async def test_broker_restart_with_qos0_counts_what_it_lost(broker: Broker) -> None:
    received, gw = await _stream_through_restart(broker, broker.restart, qos=0)
    lost = set(range(900)) - set(received)
    assert lost, "the gateway came back late: QoS 0 data published before must be lost"
    assert gw.stats.seq_gaps == len(lost)


class _Paused(MqttTransport):
    """Does not read its client's queue until `go` is set (a gateway too busy to keep up)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.go = asyncio.Event()

    async def _receive(self, client, queue) -> None:
        await self.go.wait()
        await super()._receive(client, queue)


async def test_inbound_overflow_is_counted_and_logged_once(
    broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    import aiomqtt

    from sensors.protocol import encode_message

    async with _Paused(fast(broker), queue_bound=50) as gw:
        await gw.wait_connected(10)
        async with aiomqtt.Client(broker.host, broker.port) as c:
            for i in range(500):
                payload = Samples(sensor_id="x", seq=i, times=(float(i),), rows=((1.0,),))
                await c.publish("fjords/sensors/x/data", encode_message(payload), qos=1)
        await async_eventually(
            lambda: gw.stats.dropped_client_queue, lambda n: n >= 450, timeout=60, interval=0.01
        )
        gw.go.set()
        got = await take_until(gw, lambda out: len(out) == 50)
    # The oldest were dropped: the 50 freshest remain, in order.
    assert [m.seq for _, m in got] == list(range(450, 500))
    assert gw.stats.dropped_client_queue == 450
    messages = [r.getMessage() for r in caplog.records]
    assert not any("Message queue is full" in m for m in messages)  # aiomqtt's per-message line
    assert sum("dropping incoming messages" in m for m in messages) == 1


async def test_a_burst_is_read_in_a_few_event_loop_turns_not_one_per_packet(
    broker: Broker,
) -> None:
    """Messages that wait in the gateway's socket are all read at the next wake-up (chunked
    reads, every buffered packet handled): not one packet per event-loop turn, which would leave
    the Fjord a few samples per turn under load. Counted in loop turns, not time."""
    import paho.mqtt.client as paho

    from sensors.protocol import encode_message

    n = 300
    turns = [0]

    async def count_turns() -> None:
        while True:
            turns[0] += 1
            await asyncio.sleep(0)

    async with MqttTransport(fast(broker), qos=0) as gw:
        await gw.wait_connected(10)
        seen: list[int] = []
        on_message = gw._on_message

        def counted(m) -> None:
            seen.append(turns[0])
            on_message(m)

        gw._on_message = counted
        counter = asyncio.create_task(count_turns())
        try:
            await asyncio.sleep(0.2)  # subscriptions settled
            # Publish a burst while the gateway's loop is blocked: it waits in the socket.
            pub = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="burst")
            pub.connect(broker.host, broker.port)
            pub.loop_start()
            times = tuple(1000.0 + i for i in range(8))
            msg = Samples(sensor_id="b1", times=times, rows=tuple((50.0,) for _ in times))
            infos = [pub.publish("fjords/sensors/b1/data", encode_message(msg)) for _ in range(n)]
            for info in infos:
                info.wait_for_publish(10)
            time.sleep(1.0)  # the broker forwards the burst into the gateway's socket
            pub.loop_stop()
            pub.disconnect()
            got = await take_until(gw, lambda out: sum(m.kind == "samples" for _, m in out) >= n)
        finally:
            counter.cancel()
            await asyncio.gather(counter, return_exceptions=True)
    assert sum(m.kind == "samples" for _, m in got) == n
    assert len(set(seen)) <= 10, f"{n} packets read over {len(set(seen))} event-loop turns"


async def test_hold_leaves_messages_in_the_broker_until_released(broker: Broker) -> None:
    """While `hold()` is true (the gateway's queues are full) the transport reads nothing: the
    burst waits in the broker, not in the gateway's bounded queues; released, all of it comes."""
    import paho.mqtt.client as paho

    from sensors.protocol import encode_message

    n = 200
    held = [False]
    async with MqttTransport(fast(broker), qos=0, hold=lambda: held[0]) as gw:
        await gw.wait_connected(10)
        await asyncio.sleep(0.2)  # subscriptions settled
        held[0] = True
        pub = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="held-burst")
        pub.connect(broker.host, broker.port)
        pub.loop_start()
        times = tuple(1000.0 + i for i in range(8))
        msg = Samples(sensor_id="b1", times=times, rows=tuple((50.0,) for _ in times))
        await asyncio.to_thread(
            lambda: [
                pub.publish("fjords/sensors/b1/data", encode_message(msg)).wait_for_publish(10)
                for _ in range(n)
            ]
        )
        pub.loop_stop()
        pub.disconnect()
        await asyncio.sleep(0.5)
        assert gw.stats.received == 0  # nothing read while held
        assert gw._reads.holds >= 1
        held[0] = False
        got = await take_until(gw, lambda out: sum(m.kind == "samples" for _, m in out) >= n)
    assert sum(m.kind == "samples" for _, m in got) == n


async def test_links_send_at_once_and_the_gateway_acknowledges_what_it_reads(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nagle's algorithm holds each small MQTT packet until the previous one is acknowledged,
    and the receiver delays acknowledgements by up to 40 ms: without both measures samples
    reach the gateway ~13 ms late at p50 (benchmarks/gateway_load.py). Every client socket has
    TCP_NODELAY; the gateway asks for an immediate acknowledgement after each read (the
    broker's side keeps Nagle)."""
    import socket

    import aiomqtt

    from sensors.transports import mqtt_reads

    clients: list[aiomqtt.Client] = []

    class Recorded(aiomqtt.Client):
        def __init__(self, *a, **kw) -> None:
            super().__init__(*a, **kw)
            clients.append(self)

    acks: list[object] = []
    real_ack = mqtt_reads.ack_now
    monkeypatch.setattr(aiomqtt, "Client", Recorded)
    monkeypatch.setattr(mqtt_reads, "ack_now", lambda sock: acks.append(sock) or real_ack(sock))
    async with MqttTransport(fast(broker), qos=0) as gw:
        await gw.wait_connected(10)
        async with MqttMoteLink("m1", fast(broker)) as link:
            link.hello = lambda: Hello(sensor_id="m1", schema=(("speed", "float"),))
            await link.wait_connected(10)
            await link.send(Samples(sensor_id="m1", times=(1.0,), rows=((50.0,),)))
            got = await take_until(gw, lambda out: any(m.kind == "samples" for _, m in out))
            assert any(m.kind == "samples" for _, m in got)
            socks = [c._client.socket() for c in clients]
            assert len(socks) == 2 and all(s is not None for s in socks)
            for s in socks:
                assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    if mqtt_reads._QUICKACK is not None:  # Linux
        assert acks, "the gateway never asked for an immediate acknowledgement"
