"""MQTT transport (aiomqtt) against a real broker, gateway side and mote side.

Topics, with a configurable prefix (default ``fjords``):

    {prefix}/sensors/{sensor_id}/hello     device -> gateway, retained, QoS 1
    {prefix}/sensors/{sensor_id}/data      device -> gateway, QoS 0 or 1 (samples, events, ...)
    {prefix}/sensors/{sensor_id}/status    device -> gateway, retained; the offline status is
                                           the device's last will
    {prefix}/sensors/{sensor_id}/control   gateway -> device, QoS 1

Each payload is one encoded message (:mod:`sensors.protocol`). Both sides connect as their
:class:`~sensors.transports.broker.BrokerSettings` say, keep reconnecting with its capped
exponential backoff and resubscribe after every reconnect; a mote republishes its hello and
online status each time (a restarted broker has forgotten retained messages).

The gateway keeps a persistent session (``clean_session=False``, a stable client id) and
subscribes to data at ``qos``: with QoS 1 (motes publishing at QoS 1 too) the broker keeps what
the motes publish while the gateway is away and delivers it when it is back (through a broker
restart as well, if the broker persists its sessions). With QoS 0 such messages are lost; the
loss shows as gaps in the motes' sequence numbers (``stats.seq_gaps``).

The gateway side reads through :mod:`sensors.transports.mqtt_reads` (bounded inbound queue,
chunked reads, backpressure).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Self

import aiomqtt

from fjords.supervision import cancel_and_wait, log_task_failure
from sensors.protocol import (
    MAX_MESSAGE_BYTES,
    Control,
    Hello,
    Message,
    Status,
    encode_message,
)
from sensors.sealing import MoteAuth
from sensors.transports.base import (
    DEFAULT_QUEUE_BOUND,
    ControlInbox,
    Corrupt,
    Outbox,
    TransportUnavailable,
    log,
)
from sensors.transports.broker import BrokerSettings, refused, topic_problem
from sensors.transports.mqtt_reads import DRAIN_BATCH, BufferedReads, ClientQueue, bounded_client
from sensors.transports.supervisor import SupervisedTransport

__all__ = ["MqttMoteLink", "MqttTransport", "Topics"]

# What may arrive on each device->gateway channel.
_CHANNEL_KINDS = {
    "hello": frozenset({"hello"}),
    "status": frozenset({"status"}),
    "data": frozenset({"samples", "events", "aggregate", "listen", "ack"}),
}


@dataclass(frozen=True, slots=True)
class Topics:
    prefix: str = "fjords"

    def __post_init__(self) -> None:
        """A prefix no topic can be built from is refused here, once, not at every reconnect
        (a session subscribing to `fj/#/sensors/+/data` would fail and restart forever)."""
        if (problem := topic_problem(self.prefix)) is not None:
            raise ValueError(f"MQTT topic prefix: {problem}")

    def topic(self, sensor_id: str, channel: str) -> str:
        if not sensor_id or any(c in sensor_id for c in "/+#"):
            raise ValueError(f"sensor id {sensor_id!r} cannot be an MQTT topic level")
        return f"{self.prefix}/sensors/{sensor_id}/{channel}"

    def subscriptions(self) -> list[str]:
        return [f"{self.prefix}/sensors/+/{c}" for c in _CHANNEL_KINDS]

    def parse(self, topic: str) -> tuple[str, str] | None:
        """(sensor_id, channel) of a device topic, None for anything else."""
        head = f"{self.prefix}/sensors/"
        if not topic.startswith(head):
            return None
        parts = topic[len(head) :].split("/")
        if len(parts) != 2 or not parts[0]:
            return None
        return parts[0], parts[1]


class MqttTransport(SupervisedTransport):
    """Gateway side: one MQTT session receiving from every sensor under `prefix`."""

    expected = (aiomqtt.MqttError, OSError, TimeoutError)

    def __init__(
        self,
        broker: BrokerSettings | None = None,
        *,
        prefix: str = "fjords",
        identifier: str | None = None,
        qos: int = 1,
        clean_session: bool = False,
        queue_bound: int = DEFAULT_QUEUE_BOUND,
        send_timeout: float = 5.0,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        hold: Callable[[], bool] | None = None,
    ) -> None:
        """`broker` None: one on this host's port 1883. `hold`: while it says true, the socket
        is not read (the gateway's queues are full: the data waits in the broker); see
        `BufferedReads`."""
        if qos not in (0, 1, 2):
            raise ValueError(f"MQTT qos must be 0, 1 or 2, not {qos!r}")
        self.broker = broker = broker if broker is not None else BrokerSettings()
        self.topics = Topics(prefix)
        # A persistent session is found again only under the same id: stable unless the session
        # is clean (then two gateways on one broker must not take each other's id).
        default_id = (
            f"fjords-gateway-{uuid.uuid4().hex[:8]}"
            if clean_session
            else f"{prefix}-gateway-sensors"
        )
        self.identifier = identifier or broker.identifier("sensors", default_id)
        super().__init__(
            f"mqtt {broker.address}",
            queue_bound=queue_bound,
            max_message_bytes=max_message_bytes,
            backoff=broker.backoff(),
        )
        self.qos = qos
        self.hold = hold
        self.clean_session = clean_session
        self._send_timeout = send_timeout
        self._client: aiomqtt.Client | None = None
        self._reads: BufferedReads | None = None

    def explain_failure(self, exc: BaseException) -> str:
        return self.broker.explain(exc)

    async def _send(self, sensor_id: str, msg: Control) -> None:
        """Publish at QoS 1; waits up to `send_timeout` for a connection, then gives up."""
        topic = self.topics.topic(sensor_id, "control")
        try:
            async with asyncio.timeout(self._send_timeout):  # not wait_for: it can lose a cancel
                await self._connected.wait()
            client = self._client
            if client is None:
                raise TransportUnavailable("broker connection lost")
            await client.publish(topic, self.encode_control(msg), qos=1, timeout=self._send_timeout)
        except (TimeoutError, aiomqtt.MqttError) as exc:
            raise TransportUnavailable(
                f"control to {sensor_id!r} not published: broker {self.broker.address} {exc!r}"
            ) from exc

    async def session(self) -> None:
        client, queue, self._reads = bounded_client(
            self.broker,
            self.identifier,
            clean_session=self.clean_session,
            queue_bound=self._queue_bound,
            on_overflow=lambda: self.overflow("aiomqtt's inbound queue"),
            hold=self._held,
        )
        async with client:
            for sub in self.topics.subscriptions():
                qos = self.qos if sub.endswith("/data") else max(self.qos, 1)
                await client.subscribe(sub, qos=qos)
            self._client = client
            try:
                self.mark_connected()
                log.info("mqtt gateway connected to %s as %s", self.broker.address, self.identifier)
                await self._receive(client, queue)
            finally:
                self._client = None
        raise aiomqtt.MqttError("message iteration ended")

    def _held(self) -> bool:
        return self.hold is not None and self.hold()

    async def _receive(self, client: aiomqtt.Client, queue: ClientQueue) -> None:
        async for first in client.messages:
            # Drain what else is queued in a tight loop (bounded, so the loop breathes).
            for m in (first, *queue.take(DRAIN_BATCH)):
                try:
                    self._on_message(m)
                except Exception as exc:  # noqa: BLE001 - a bad message is counted and logged, not the session's end
                    self.failed(m.topic.value, exc)

    def _on_message(self, m: aiomqtt.Message) -> None:
        topic, payload = m.topic.value, m.payload
        where = self.topics.parse(topic)
        if where is None:
            self.bad("topic", topic, "not a sensor topic")
            return
        sensor_id, channel = where
        if not isinstance(payload, bytes | bytearray):
            self.bad("payload", topic, f"payload is {type(payload).__name__}, not bytes")
            return
        if not payload:
            return  # a retained message being cleared
        allowed = _CHANNEL_KINDS.get(channel)
        if allowed is None:
            self.bad("topic", topic, f"unknown channel {channel!r}")
            return
        self.accept(
            payload, where=topic, sensor_id=sensor_id, kinds=allowed, retained=bool(m.retain)
        )


@dataclass(slots=True)
class MoteLinkStats:
    queued: int = 0
    published: int = 0
    dropped_queue_full: int = 0
    dropped_offline: int = 0
    connects: int = 0
    connected: bool = False
    last_error: str = ""
    #: the last attempt was refused by the broker or failed TLS: retrying will not help
    refused: bool = False


class MqttMoteLink:
    """Mote side: its own MQTT client, last will = offline status, control subscription.

    `send` queues (bounded, drop oldest) and a publisher task drains the queue while connected,
    in order; a message whose publish failed is put back at the head. `hello` is called on
    every (re)connect for the mote's current hello (else the last hello sent is republished).
    Hello and status messages go to their own retained topics, everything else to `data`.
    `on_published(msg, epoch)` is called after each publish, `epoch` counting connections
    (tests use it to tell in-flight losses apart).
    """

    def __init__(
        self,
        sensor_id: str,
        broker: BrokerSettings | None = None,
        *,
        hello: Callable[[], Hello] | None = None,
        prefix: str = "fjords",
        queue_bound: int = 1024,
        data_qos: int = 0,
        on_published: Callable[[Message, int], None] | None = None,
        key: bytes | None = None,
    ) -> None:
        """`broker` None: one on this host's port 1883. `key`: the mote's key (everything it
        sends is sealed, and only its gateway's authentic controls are taken)."""
        self.sensor_id = sensor_id
        self.broker = broker if broker is not None else BrokerSettings()
        self.topics = Topics(prefix)
        self.hello = hello
        self.auth = MoteAuth(sensor_id, key) if key is not None else None
        self.inbox = ControlInbox(sensor_id=sensor_id, auth=self.auth)
        self.stats = MoteLinkStats()
        self.online = True
        self.epoch = 0
        self._data_qos = data_qos
        self._out: Outbox[tuple[Message, bytes]] = Outbox(queue_bound)
        self._backoff = self.broker.backoff()
        self._on_published = on_published
        self._task: asyncio.Task[None] | None = None
        self._wanted_online = asyncio.Event()
        self._wanted_online.set()
        self._wanted_offline = asyncio.Event()
        self._connected = asyncio.Event()
        self._data_topic = self.topics.topic(sensor_id, "data")
        self._last_hello: bytes | None = None

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._supervise(), name=f"mote {self.sensor_id}")
        self._task.add_done_callback(log_task_failure)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def wait_connected(self, timeout: float | None = None) -> None:
        await asyncio.wait_for(self._connected.wait(), timeout)

    async def send(self, msg: Message, *, corrupt: Corrupt | None = None) -> None:
        if not self.online:
            self.stats.dropped_offline += 1
            return
        data = encode_message(msg)
        if isinstance(msg, Hello):
            self._last_hello = data  # what a reconnect republishes (sealed afresh)
        data = self._seal(data)
        if corrupt is not None:
            data = corrupt(data)
        self.stats.queued += 1
        if not self._out.put_nowait((msg, data)):
            self.stats.dropped_queue_full += 1

    def poll_controls(self) -> list[Control]:
        return self.inbox.poll()

    async def next_control(self) -> Control:
        return await self.inbox.next()

    @property
    def backlog(self) -> int:
        return len(self._out)

    async def drain(self) -> None:
        """Wait until everything queued so far has been handed to the broker connection."""
        await self._out.sent()

    async def flow(self) -> None:
        """Wait while the outbound queue is too full (as fast as the broker takes it; see
        `Outbox.room`)."""
        await self._out.room()
        await asyncio.sleep(0)  # and give the publisher its turn even when there is room

    def set_online(self, online: bool) -> None:
        """Go offline (publish offline status, disconnect, drop data) or come back."""
        self.online = online
        if online:
            self._wanted_offline.clear()
            self._wanted_online.set()
        else:
            self._wanted_online.clear()
            self._wanted_offline.set()

    def _seal(self, data: bytes) -> bytes:
        return self.auth.seal_bytes(data) if self.auth is not None else data

    def _will(self) -> aiomqtt.Will:
        payload = self._seal(
            encode_message(Status(sensor_id=self.sensor_id, online=False, reason="lost"))
        )
        return aiomqtt.Will(self.topics.topic(self.sensor_id, "status"), payload, 1, True)

    async def _supervise(self) -> None:
        status_topic = self.topics.topic(self.sensor_id, "status")
        while True:
            await self._wanted_online.wait()
            try:
                async with self.broker.client(
                    f"mote-{self.sensor_id}", will=self._will()
                ) as client:
                    self.epoch += 1
                    self.stats.connects += 1
                    await client.subscribe(self.topics.topic(self.sensor_id, "control"), qos=1)
                    hello = encode_message(self.hello()) if self.hello else self._last_hello
                    if hello is not None:
                        await client.publish(
                            self.topics.topic(self.sensor_id, "hello"),
                            self._seal(hello),
                            qos=1,
                            retain=True,
                        )
                    online = encode_message(Status(sensor_id=self.sensor_id, online=True))
                    await client.publish(status_topic, self._seal(online), qos=1, retain=True)
                    self.stats.connected = True
                    self.stats.refused = False
                    self._connected.set()
                    self._backoff.reset()
                    async with asyncio.TaskGroup() as tg:
                        reader = tg.create_task(self._read(client))
                        publisher = tg.create_task(self._publish(client))
                        await self._wanted_offline.wait()
                        # Asked to go offline: say so, then leave cleanly.
                        reader.cancel()
                        publisher.cancel()
                    offline = Status(sensor_id=self.sensor_id, online=False, reason="sleep")
                    await client.publish(
                        status_topic, self._seal(encode_message(offline)), qos=1, retain=True
                    )
            except* aiomqtt.MqttError as group:
                reason = self.broker.explain(group.exceptions[0])
                self.stats.refused = refused(group.exceptions[0])
                if reason != self.stats.last_error:  # once per kind, not every retry
                    log.warning("mote %s: %s; retrying", self.sensor_id, reason)
                self.stats.last_error = reason
            finally:
                self.stats.connected = False
                self._connected.clear()
            if self._wanted_online.is_set():
                await asyncio.sleep(self._backoff.next())

    async def _read(self, client: aiomqtt.Client) -> None:
        async for m in client.messages:
            payload = m.payload
            if not isinstance(payload, bytes | bytearray):
                continue
            if self.inbox.receive(payload) is None:
                self.stats.last_error = "control ignored: not an authentic control for this mote"

        raise aiomqtt.MqttError("message iteration ended")

    async def _publish(self, client: aiomqtt.Client) -> None:
        while True:
            msg, data = await self._out.take()
            if isinstance(msg, Hello | Status):  # their own retained topics, QoS 1
                topic, qos, retain = self.topics.topic(self.sensor_id, msg.kind), 1, True
            else:
                topic, qos, retain = self._data_topic, self._data_qos, False
            try:
                await client.publish(topic, data, qos=qos, retain=retain)
            except aiomqtt.MqttError:
                self._out.push_front((msg, data))  # not sent: keep its place
                raise
            finally:
                self._out.done()
            self.stats.published += 1
            if self._on_published is not None:
                self._on_published(msg, self.epoch)
