"""MQTT transport (aiomqtt) against a real broker, gateway side and mote side.

Topics, with a configurable prefix (default ``fjords``):

    {prefix}/sensors/{sensor_id}/hello     device -> gateway, retained, QoS 1
    {prefix}/sensors/{sensor_id}/data      device -> gateway, QoS 0 or 1 (samples, events, ...)
    {prefix}/sensors/{sensor_id}/status    device -> gateway, retained; the offline status is
                                           the device's last will
    {prefix}/sensors/{sensor_id}/control   gateway -> device, QoS 1

Each payload is one encoded message (:mod:`sensors.protocol`). Both sides keep reconnecting
with capped exponential backoff and resubscribe after every reconnect; a mote republishes its
hello and online status each time (a restarted broker has forgotten retained messages).

The gateway keeps a persistent session (``clean_session=False``, a stable client id) and
subscribes to data at ``qos``: with QoS 1 (motes publishing at QoS 1 too) the broker keeps what
the motes publish while the gateway is away and delivers it when it is back (through a broker
restart as well, if the broker persists its sessions). With QoS 0 such messages are lost; the
loss shows as gaps in the motes' sequence numbers (``stats.seq_gaps``).

aiomqtt's inbound queue is bounded by us (``queue_bound``); when it overflows the oldest message
is dropped and counted in ``stats.dropped_client_queue`` (logged once, instead of aiomqtt's
warning per message), and the queue is drained in batches, so a burst is decoded in a tight loop.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, NamedTuple, Self, cast
from urllib.parse import urlsplit

import aiomqtt

from fjords.supervision import Backoff, cancel_and_wait, log_task_failure
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
    TransportUnavailable,
    log,
)
from sensors.transports.supervisor import SupervisedTransport

__all__ = ["BrokerAddress", "MqttMoteLink", "MqttTransport", "Topics", "broker_address"]

# What may arrive on each device->gateway channel.
_CHANNEL_KINDS = {
    "hello": frozenset({"hello"}),
    "status": frozenset({"status"}),
    "data": frozenset({"samples", "events", "aggregate", "listen", "ack"}),
}
#: Most messages decoded in one go before the event loop gets a turn.
DRAIN_BATCH = 1024


class BrokerAddress(NamedTuple):
    host: str
    port: int
    tls: bool


def broker_address(text: str) -> BrokerAddress:
    """`mqtt://host:port`, `mqtts://host` (TLS), `host`, `host:port`, `[v6]:port` or a bare v6."""
    if "://" not in text:
        if text.count(":") > 1 and not text.startswith("["):
            return BrokerAddress(text, 1883, False)  # a bare IPv6 address
        text = f"mqtt://{text}"
    u = urlsplit(text)
    if u.scheme not in ("mqtt", "mqtts", "tcp", "ssl"):
        raise ValueError(f"unsupported MQTT URL scheme {u.scheme!r} (use mqtt:// or mqtts://)")
    tls = u.scheme in ("mqtts", "ssl")
    try:
        port = u.port
    except ValueError:
        raise ValueError(f"bad port in MQTT broker address {text!r}") from None
    return BrokerAddress(u.hostname or "127.0.0.1", port or (8883 if tls else 1883), tls)


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


class _ClientQueue(asyncio.Queue):  # type: ignore[type-arg]
    """aiomqtt's inbound queue, bounded by us: when full, drop the OLDEST message and count it
    (aiomqtt itself would drop the newest and log a WARNING for every one)."""

    def __init__(self, maxsize: int, on_drop: Callable[[], None]) -> None:
        super().__init__(maxsize)
        self._on_drop = on_drop

    def put_nowait(self, item: Any) -> None:
        if self.full():
            self.get_nowait()
            self._on_drop()
        super().put_nowait(item)

    def take(self, n: int) -> list[Any]:
        """Up to `n` queued messages, without waiting."""
        return [self.get_nowait() for _ in range(min(n, self.qsize()))]


class MqttTransport(SupervisedTransport):
    """Gateway side: one MQTT session receiving from every sensor under `prefix`."""

    expected = (aiomqtt.MqttError, OSError, TimeoutError)

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 1883,
        *,
        prefix: str = "fjords",
        identifier: str | None = None,
        qos: int = 1,
        clean_session: bool = False,
        queue_bound: int = DEFAULT_QUEUE_BOUND,
        reconnect_initial: float = 0.1,
        reconnect_max: float = 5.0,
        send_timeout: float = 5.0,
        keepalive: int = 10,
        username: str | None = None,
        password: str | None = None,
        tls_context: ssl.SSLContext | None = None,
        max_message_bytes: int | None = None,
    ) -> None:
        if qos not in (0, 1, 2):
            raise ValueError(f"MQTT qos must be 0, 1 or 2, not {qos!r}")
        self.host, self.port = host, port
        self.topics = Topics(prefix)
        # A persistent session is found again only under the same id: stable unless the session
        # is clean (then two gateways on one broker must not take each other's id).
        default_id = (
            f"fjords-gateway-{uuid.uuid4().hex[:8]}"
            if clean_session
            else f"{prefix}-gateway-sensors"
        )
        self.identifier = identifier or default_id
        extra = {} if max_message_bytes is None else {"max_message_bytes": max_message_bytes}
        super().__init__(
            f"mqtt {host}:{port}",
            queue_bound=queue_bound,
            backoff=Backoff(reconnect_initial, reconnect_max),
            **extra,
        )
        self.qos = qos
        #: When set and true, the socket is not read for now (the gateway's queues are full:
        #: the data waits in the broker); see `_BufferedReads`.
        self.hold: Callable[[], bool] | None = None
        self.clean_session = clean_session
        self._auth = {"username": username, "password": password, "tls_context": tls_context}
        self._send_timeout = send_timeout
        self._keepalive = keepalive
        self._client: aiomqtt.Client | None = None

    async def _send(self, sensor_id: str, msg: Control) -> None:
        """Publish at QoS 1; waits up to `send_timeout` for a connection, then gives up."""
        topic = self.topics.topic(sensor_id, "control")
        try:
            async with asyncio.timeout(self._send_timeout):  # not wait_for: it can lose a cancel
                await self._connected.wait()
            client = self._client
            if client is None:
                raise TransportUnavailable("broker connection lost")
            await client.publish(topic, encode_message(msg), qos=1, timeout=self._send_timeout)
        except (TimeoutError, aiomqtt.MqttError) as exc:
            raise TransportUnavailable(
                f"control to {sensor_id!r} not published: broker {self.host}:{self.port} {exc!r}"
            ) from exc

    async def session(self) -> None:
        client, queue = bounded_client(self)
        async with client:
            for sub in self.topics.subscriptions():
                qos = self.qos if sub.endswith("/data") else max(self.qos, 1)
                await client.subscribe(sub, qos=qos)
            self._client = client
            try:
                self.mark_connected()
                log.info(
                    "mqtt gateway connected to %s:%s as %s", self.host, self.port, self.identifier
                )
                await self._receive(client, queue)
            finally:
                self._client = None
        raise aiomqtt.MqttError("message iteration ended")

    async def _receive(self, client: aiomqtt.Client, queue: _ClientQueue) -> None:
        async for first in client.messages:
            # Drain what else is queued in a tight loop (bounded, so the loop breathes).
            for m in (first, *queue.take(DRAIN_BATCH)):
                try:
                    self._on_message(m)
                except Exception as exc:
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
        self.accept(payload, where=topic, sensor_id=sensor_id, kinds=allowed)


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
        self._backoff = Backoff(reconnect_initial, reconnect_max)
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
                    socket_options=NO_DELAY,
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
                await asyncio.sleep(self._backoff.next())

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


#: Bytes taken from the broker's socket per read (one syscall for many packets).
READ_CHUNK = 65_536
#: Every client's socket sends at once: Nagle's algorithm would hold a small packet (a sample
#: packet, a control, a result row) until the previous one is acknowledged, and the receiver
#: delays its acknowledgement by up to 40 ms.
NO_DELAY = ((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),)
#: Linux: acknowledge what was read at once. The broker (Mosquitto by default) does not set
#: TCP_NODELAY on its side, so each message it forwards waits for our acknowledgement of the
#: previous one, which the kernel delays by up to 40 ms unless asked (per read: it resets).
#: Measured in benchmarks/gateway_load.py: mote send to gateway read p50 13 ms -> 0.1 ms.
_QUICKACK = getattr(socket, "TCP_QUICKACK", None)
#: Most packets read per event-loop turn: a backlog is read in slices of this many, with the
#: Fjord's turns in between (so its first samples are routed while the rest is read).
READ_PACKETS = 128
#: While the link's `hold()` says the gateway is full, its socket is read again after this
#: long (the data waits in the broker, by TCP's flow control)...
HOLD_RECHECK_S = 0.005
#: ...but never for longer than this without reading a slice (paho must see the broker's
#: keep-alive answers, and a stalled consumer must not stop intake for good).
MAX_HOLD_S = 2.0


def ack_now(sock: Any) -> bool:
    """Ask the kernel to acknowledge what was read without its delay (`_QUICKACK`); False
    where it cannot (not Linux, not a TCP socket: a websocket wrapper)."""
    if _QUICKACK is None:
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
    except (OSError, AttributeError):
        return False
    return True


class _BufferedReads:
    """Reads the broker's socket in chunks for paho, and handles every packet that arrived in
    one event-loop wake-up.

    paho reads a packet with one `recv` per header byte and one for its body, and aiomqtt's
    reader handles ONE packet per wake-up of the selector: under load each MQTT message then
    costs several syscalls and a whole event-loop turn, and the Fjord sees a few samples per
    turn. Here paho's `_sock_recv` is served from a buffer filled by one `recv(READ_CHUNK)`,
    and the reader keeps calling `loop_read` while the buffer holds bytes (at most
    `READ_PACKETS` packets, then it goes on at the next turn: bytes already taken from the
    socket wake no selector). paho's own errors are kept: the original `_sock_recv` does the
    reads. (paho 2.x internals: `_sock_recv`, `_sock`; aiomqtt 2.x registers its reader in
    `on_socket_open`, and ours replaces it on the same file descriptor.)

    Backpressure: while `hold()` (the link's, e.g. the gateway's `intake_full`) is true, the
    socket is not read (for at most `MAX_HOLD_S` at a time): fast reads would otherwise move a
    backlog from the broker into the gateway's bounded queues, where it is dropped."""

    def __init__(self, client: aiomqtt.Client, link: Any = None) -> None:
        self._link = link
        self._held_since: float | None = None
        self.holds = 0  # times reading was held back (for tests and stats)
        self._aio = client
        self._paho = paho = client._client  # noqa: SLF001
        self._recv = paho._sock_recv  # noqa: SLF001
        self._buf = b""
        self._pos = 0
        self._sock: Any = None
        self._quickack = _QUICKACK is not None
        paho._sock_recv = self._sock_recv  # noqa: SLF001
        self._aiomqtt_open = paho.on_socket_open
        paho.on_socket_open = self._on_socket_open

    def _sock_recv(self, bufsize: int) -> bytes:
        sock = self._paho._sock  # noqa: SLF001
        if sock is not self._sock:  # a new connection: nothing buffered belongs to it
            self._sock, self._buf, self._pos = sock, b"", 0
        buf, pos = self._buf, self._pos
        if pos >= len(buf):
            buf = self._recv(max(bufsize, READ_CHUNK))  # raises BlockingIOError when empty
            if not buf:
                return buf  # the broker closed the connection
            self._buf, pos = buf, 0
            if self._quickack:
                self._quickack = ack_now(sock)
        end = pos + bufsize
        self._pos = end
        return buf[pos:end] if pos or end < len(buf) else buf

    def buffered(self) -> int:
        return len(self._buf) - self._pos if self._sock is self._paho._sock else 0  # noqa: SLF001

    def _on_socket_open(self, paho: Any, userdata: Any, sock: Any) -> None:
        self._aiomqtt_open(paho, userdata, sock)  # its reader, then (in order) ours replaces it
        loop = self._aio._loop  # noqa: SLF001
        self._fd = sock.fileno()
        loop.call_soon_threadsafe(loop.add_reader, self._fd, self._readable)

    def _holding(self) -> bool:
        """Whether to leave the data in the broker for now (see the class docstring)."""
        hold = getattr(self._link, "hold", None)
        if hold is None or not hold():
            self._held_since = None
            return False
        now = time.monotonic()
        if self._held_since is None:
            self._held_since = now
            self.holds += 1
        elif now - self._held_since >= MAX_HOLD_S:
            self._held_since = now  # read one slice, then hold again
            return False
        return True

    def _resume(self, sock: Any) -> None:
        if self._paho._sock is not sock:  # noqa: SLF001 - closed meanwhile: nothing to resume
            return
        if self._holding():
            self._aio._loop.call_later(HOLD_RECHECK_S, self._resume, sock)  # noqa: SLF001
            return
        self._aio._loop.add_reader(self._fd, self._readable)  # noqa: SLF001
        self._readable()

    def _readable(self) -> None:
        paho, aio = self._paho, self._aio
        if self._holding():
            aio._loop.remove_reader(self._fd)  # noqa: SLF001 - no busy wake-ups while held
            aio._loop.call_later(HOLD_RECHECK_S, self._resume, paho._sock)  # noqa: SLF001
            return
        try:
            for _ in range(READ_PACKETS):
                paho.loop_read()
                pending = getattr(paho._sock, "pending", None)  # noqa: SLF001 - TLS's buffer
                if not self.buffered() and not (pending is not None and pending() > 0):
                    return
            aio._loop.call_soon(self._readable)  # noqa: SLF001 - more buffered: next turn
        except Exception as exc:  # noqa: BLE001 - as aiomqtt's reader: the connection is broken
            if not aio._disconnected.done():  # noqa: SLF001
                aio._disconnected.set_exception(exc)  # noqa: SLF001


def bounded_client(link: Any) -> tuple[aiomqtt.Client, _ClientQueue]:
    """An aiomqtt client for a supervised MQTT link (`host`, `port`, `identifier`,
    `clean_session`, `_keepalive`, `_queue_bound`, `_auth`, `overflow`) whose inbound queue is
    ours: bounded, dropping the oldest message and counting it through `link.overflow`."""
    queues: list[_ClientQueue] = []

    def make_queue(maxsize: int = 0) -> _ClientQueue:
        queues.append(_ClientQueue(maxsize, lambda: link.overflow("aiomqtt's inbound queue")))
        return queues[-1]

    client = aiomqtt.Client(
        link.host,
        link.port,
        identifier=link.identifier,
        clean_session=link.clean_session,
        keepalive=link._keepalive,
        queue_type=cast(Any, make_queue),
        max_queued_incoming_messages=link._queue_bound,
        logger=logging.getLogger("sensors.transports.aiomqtt"),
        socket_options=NO_DELAY,
        **link._auth,
    )
    try:
        link._reads = _BufferedReads(client, link)
    except AttributeError as exc:  # a paho/aiomqtt without the hooks: their own reader
        logging.getLogger("sensors.transports").warning(
            "MQTT reads one packet per event-loop turn (no buffered reads: %s)", exc
        )
    return client, queues[-1]
