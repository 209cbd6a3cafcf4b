"""MQTT transport (aiomqtt) against a real broker, gateway side and mote side.

Topics, with a configurable prefix (default ``fjords``):

    {prefix}/sensors/{sensor_id}/hello     device -> gateway, retained, QoS 1
    {prefix}/sensors/{sensor_id}/data      device -> gateway, QoS 0 (samples, events, ...)
    {prefix}/sensors/{sensor_id}/status    device -> gateway, retained; the offline status is
                                           the device's last will
    {prefix}/sensors/{sensor_id}/control   gateway -> device, QoS 1

Each payload is one encoded message (:mod:`sensors.protocol`). Both sides keep reconnecting
with capped exponential backoff and resubscribe after every reconnect; a mote republishes its
hello and online status each time (a restarted broker has forgotten retained messages).
"""

from __future__ import annotations

import asyncio
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Self

import aiomqtt

from sensors.protocol import (
    Control,
    Hello,
    Message,
    ProtocolError,
    Status,
    decode_message,
    encode_message,
)
from sensors.transports.base import (
    DEFAULT_QUEUE_BOUND,
    ControlInbox,
    Corrupt,
    DropOldestQueue,
    Inbound,
    InboundBuffer,
    TransportClosed,
    TransportStats,
    TransportUnavailable,
    cancel_and_wait,
    log,
    log_task_failure,
)

__all__ = ["MqttMoteLink", "MqttTransport", "Topics", "parse_broker"]

# What may arrive on each device->gateway channel.
_CHANNEL_KINDS = {
    "hello": {"hello"},
    "status": {"status"},
    "data": {"samples", "events", "aggregate", "listen", "ack"},
}


def parse_broker(text: str, default_port: int = 1883) -> tuple[str, int]:
    """'host', 'host:port' or '[v6]:port' -> (host, port)."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else default_port
    host, sep, port = text.rpartition(":")
    if not sep or ":" in host:
        return text, default_port
    return host, int(port)


@dataclass(frozen=True, slots=True)
class Topics:
    prefix: str = "fjords"

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


class _Backoff:
    def __init__(self, initial: float, maximum: float) -> None:
        self.initial, self.maximum = initial, maximum
        self.delay = initial

    def reset(self) -> None:
        self.delay = self.initial

    async def wait(self) -> None:
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, self.maximum)


class MqttTransport:
    """Gateway side: one MQTT session receiving from every sensor under `prefix`."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 1883,
        *,
        prefix: str = "fjords",
        identifier: str | None = None,
        queue_bound: int = DEFAULT_QUEUE_BOUND,
        reconnect_initial: float = 0.1,
        reconnect_max: float = 5.0,
        send_timeout: float = 5.0,
        keepalive: int = 10,
        username: str | None = None,
        password: str | None = None,
        tls_context: ssl.SSLContext | None = None,
    ) -> None:
        self.host, self.port = host, port
        self._auth = {"username": username, "password": password, "tls_context": tls_context}
        self.topics = Topics(prefix)
        self.identifier = identifier or f"fjords-gateway-{uuid.uuid4().hex[:8]}"
        self.stats = TransportStats()
        self._inbound = InboundBuffer(self.stats, queue_bound)
        self._backoff = _Backoff(reconnect_initial, reconnect_max)
        self._send_timeout = send_timeout
        self._keepalive = keepalive
        self._client: aiomqtt.Client | None = None
        self._connected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._queue_bound = queue_bound

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._supervise(), name=f"mqtt {self.identifier}")
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
        self._inbound.queue.close()

    async def wait_connected(self, timeout: float | None = None) -> None:
        await asyncio.wait_for(self._connected.wait(), timeout)

    def messages(self) -> AsyncIterator[Inbound]:
        return self._inbound.messages()

    async def send(self, sensor_id: str, msg: Control) -> None:
        """Publish at QoS 1; waits up to `send_timeout` for a connection, then gives up."""
        if self._task is None:
            raise TransportClosed("send() outside `async with MqttTransport(...)`")
        if msg.sensor_id != sensor_id:
            raise ValueError(f"control for {msg.sensor_id!r} sent to {sensor_id!r}")
        topic = self.topics.topic(sensor_id, "control")
        try:
            await asyncio.wait_for(self._connected.wait(), self._send_timeout)
            client = self._client
            if client is None:
                raise TransportUnavailable("broker connection lost")
            await client.publish(topic, encode_message(msg), qos=1, timeout=self._send_timeout)
        except (TimeoutError, aiomqtt.MqttError) as exc:
            raise TransportUnavailable(
                f"control to {sensor_id!r} not published: broker {self.host}:{self.port} {exc!r}"
            ) from exc
        self.stats.sent += 1

    async def _supervise(self) -> None:
        first = True
        while True:
            try:
                async with aiomqtt.Client(
                    self.host,
                    self.port,
                    identifier=self.identifier,
                    keepalive=self._keepalive,
                    max_queued_incoming_messages=self._queue_bound,
                    **self._auth,
                ) as client:
                    for sub in self.topics.subscriptions():
                        await client.subscribe(sub, qos=1)
                    self._client = client
                    self.stats.connected = True
                    self.stats.connected_at = time.monotonic()
                    if not first:
                        self.stats.reconnects += 1
                    first = False
                    self._backoff.reset()
                    self._connected.set()
                    log.info("mqtt gateway connected to %s:%s", self.host, self.port)
                    async for m in client.messages:
                        self._on_message(m.topic.value, m.payload)
            except aiomqtt.MqttError as exc:
                self.stats.last_error = f"broker {self.host}:{self.port}: {exc}"
                log.warning("mqtt gateway: %s; reconnecting", exc)
            finally:
                self._client = None
                self.stats.connected = False
                self._connected.clear()
            await self._backoff.wait()

    def _on_message(self, topic: str, payload: object) -> None:
        where = self.topics.parse(topic)
        if where is None:
            self._inbound.bad(topic, "not a sensor topic")
            return
        sensor_id, channel = where
        if not isinstance(payload, bytes | bytearray):
            self._inbound.bad(topic, f"payload is {type(payload).__name__}, not bytes")
            return
        if not payload:
            return  # a retained message being cleared
        try:
            msg = decode_message(payload)
        except ProtocolError as exc:
            self._inbound.bad(topic, str(exc))
            return
        if msg.sensor_id != sensor_id:
            self._inbound.bad(topic, f"message claims to be from {msg.sensor_id!r}")
            return
        allowed = _CHANNEL_KINDS.get(channel)
        if allowed is None or msg.kind not in allowed:
            self._inbound.bad(topic, f"{msg.kind!r} message on the {channel!r} channel")
            return
        self._inbound.deliver(sensor_id, msg)


@dataclass(slots=True)
class MoteLinkStats:
    queued: int = 0
    published: int = 0
    dropped_queue_full: int = 0
    dropped_offline: int = 0
    connects: int = 0
    connected: bool = False
    last_error: str = ""


class MqttMoteLink:
    """Mote side: its own MQTT client, last will = offline status, control subscription.

    `send` queues (bounded, drop oldest) and a publisher task drains the queue while connected,
    in order; a message whose publish failed is put back at the head. `hello` is called on
    every (re)connect for the mote's current hello (else the last hello sent is republished).
    Hello and status messages go to their own retained topics, everything else to `data`. `on_published(msg, epoch)` is called after
    each publish, `epoch` counting connections (tests use it to tell in-flight losses apart).
    """

    def __init__(
        self,
        sensor_id: str,
        host: str = "127.0.0.1",
        port: int = 1883,
        *,
        hello: Callable[[], Hello] | None = None,
        prefix: str = "fjords",
        queue_bound: int = 1024,
        data_qos: int = 0,
        reconnect_initial: float = 0.1,
        reconnect_max: float = 5.0,
        keepalive: int = 10,
        on_published: Callable[[Message, int], None] | None = None,
    ) -> None:
        self.sensor_id = sensor_id
        self.host, self.port = host, port
        self.topics = Topics(prefix)
        self.hello = hello
        self.inbox = ControlInbox()
        self.stats = MoteLinkStats()
        self.online = True
        self.epoch = 0
        self._data_qos = data_qos
        self._out: DropOldestQueue[tuple[Message, bytes]] = DropOldestQueue(queue_bound)
        self._backoff = _Backoff(reconnect_initial, reconnect_max)
        self._keepalive = keepalive
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
            self._last_hello = data  # what a reconnect republishes
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
        while len(self._out) or self._publishing:
            await asyncio.sleep(0.005)

    _publishing = False

    async def flow(self) -> None:
        """Wait while the outbound queue is more than half full (as fast as the broker takes it)."""
        while len(self._out) > self._out.bound // 2:
            await asyncio.sleep(0.002)
        await asyncio.sleep(0)

    def set_online(self, online: bool) -> None:
        """Go offline (publish offline status, disconnect, drop data) or come back."""
        self.online = online
        if online:
            self._wanted_offline.clear()
            self._wanted_online.set()
        else:
            self._wanted_online.clear()
            self._wanted_offline.set()

    def _will(self) -> aiomqtt.Will:
        payload = encode_message(Status(sensor_id=self.sensor_id, online=False, reason="lost"))
        return aiomqtt.Will(self.topics.topic(self.sensor_id, "status"), payload, 1, True)

    async def _supervise(self) -> None:
        status_topic = self.topics.topic(self.sensor_id, "status")
        while True:
            await self._wanted_online.wait()
            try:
                async with aiomqtt.Client(
                    self.host,
                    self.port,
                    identifier=f"mote-{self.sensor_id}",
                    will=self._will(),
                    keepalive=self._keepalive,
                ) as client:
                    self.epoch += 1
                    self.stats.connects += 1
                    await client.subscribe(self.topics.topic(self.sensor_id, "control"), qos=1)
                    hello = encode_message(self.hello()) if self.hello else self._last_hello
                    if hello is not None:
                        await client.publish(
                            self.topics.topic(self.sensor_id, "hello"), hello, qos=1, retain=True
                        )
                    online = Status(sensor_id=self.sensor_id, online=True)
                    await client.publish(status_topic, encode_message(online), qos=1, retain=True)
                    self.stats.connected = True
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
                    await client.publish(status_topic, encode_message(offline), qos=1, retain=True)
            except* aiomqtt.MqttError as group:
                self.stats.last_error = str(group.exceptions[0])
            finally:
                self.stats.connected = False
                self._connected.clear()
                self._publishing = False
            if self._wanted_online.is_set():
                await self._backoff.wait()

    async def _read(self, client: aiomqtt.Client) -> None:
        async for m in client.messages:
            payload = m.payload
            if not isinstance(payload, bytes | bytearray):
                continue
            try:
                msg = decode_message(payload)
            except ProtocolError as exc:
                self.stats.last_error = f"control: {exc}"
                continue
            if isinstance(msg, Control) and msg.sensor_id == self.sensor_id:
                self.inbox.put(msg)
        raise aiomqtt.MqttError("message iteration ended")

    async def _publish(self, client: aiomqtt.Client) -> None:
        while True:
            msg, data = await self._out.get()
            self._publishing = True
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
                self._publishing = False
            self.stats.published += 1
            if self._on_published is not None:
                self._on_published(msg, self.epoch)
