"""The one interface every gateway-side transport offers, and the pieces they share.

A transport is an async context manager: entering it starts its background work (reading a
serial line, holding an MQTT session and reconnecting); leaving it cancels that work and
closes the connection. In between, the proxies read ``messages()`` and call ``send()``:

    async with MqttTransport(BrokerSettings("127.0.0.1", 1883)) as t:
        async for sensor_id, msg in t.messages():
            ...
        await t.send("773869", Control.set_period("773869", 200))

Sensors push at their own pace and the gateway may lag, so inbound messages wait in a bounded
queue that drops the OLDEST message when full (the freshest reading is the most useful one) and
counts every drop. Bad packets never reach the proxies: they are counted and logged.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Generic, NamedTuple, Protocol, Self, TypeVar, runtime_checkable

from fjords.supervision import SessionStats
from sensors.protocol import Control, Message, ProtocolError, decode_message
from sensors.sealing import MoteAuth

__all__ = [
    "DEFAULT_QUEUE_BOUND",
    "DropOldestQueue",
    "Inbound",
    "Outbox",
    "Transport",
    "TransportClosed",
    "TransportStats",
    "TransportUnavailable",
]

DEFAULT_QUEUE_BOUND = 10_000
log = logging.getLogger("sensors.transports")


class Inbound(NamedTuple):
    sensor_id: str
    message: Message


class TransportUnavailable(ConnectionError):
    """send() could not reach the device or broker right now (it may come back)."""


class TransportClosed(RuntimeError):
    """The transport was used outside its `async with` block."""


@dataclass(slots=True)
class TransportStats(SessionStats):
    """Counters every transport keeps; `frames` holds the serial decoder's when there is one."""

    received: int = 0
    delivered: int = 0
    dropped_queue_full: int = 0
    dropped_bad: int = 0
    sent: int = 0
    frames: dict[str, int] = field(default_factory=dict)
    #: bad packets by reason ("protocol", "sender", "kind", "topic", frame errors...)
    bad: dict[str, int] = field(default_factory=dict)
    #: messages a client library dropped before we read them (aiomqtt's inbound queue full)
    dropped_client_queue: int = 0
    #: messages missing from sensors' sequence numbers (lost on the way)
    seq_gaps: int = 0


@runtime_checkable
class Transport(Protocol):
    """Gateway side of a link to one or many sensors."""

    stats: TransportStats

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    def messages(self) -> AsyncIterator[Inbound]:
        """Messages from every sensor on this transport, in arrival order, until closed."""
        ...

    async def send(self, sensor_id: str, msg: Control) -> None:
        """Deliver a control message; raises TransportUnavailable when the link is down."""
        ...


T = TypeVar("T")


class DropOldestQueue(Generic[T]):
    """A bounded FIFO for one consumer: `put_nowait` never blocks, evicting the oldest item."""

    def __init__(self, bound: int = DEFAULT_QUEUE_BOUND) -> None:
        if bound < 1:
            raise ValueError("a queue bound must be at least 1")
        self.bound = bound
        self.dropped = 0
        self._items: collections.deque[T] = collections.deque()
        self._ready = asyncio.Event()
        self._closed = False

    def __len__(self) -> int:
        return len(self._items)

    def put_nowait(self, item: T) -> bool:
        """Append; returns False when this evicted the oldest item."""
        evicted = len(self._items) >= self.bound
        if evicted:
            self._items.popleft()
            self.dropped += 1
        self._items.append(item)
        self._ready.set()
        return not evicted

    def push_front(self, item: T) -> None:
        """Put an item back at the head (it was taken but could not be handled)."""
        self._items.appendleft(item)
        if len(self._items) > self.bound:
            self._items.popleft()
            self.dropped += 1
        self._ready.set()

    def pop_nowait(self) -> T:
        """The oldest item; IndexError when empty."""
        return self._items.popleft()

    def drain(self) -> list[T]:
        """Take everything queued now, without waiting."""
        items = list(self._items)
        self._items.clear()
        return items

    def close(self) -> None:
        """Wake the consumer; it gets what is left, then StopAsyncIteration."""
        self._closed = True
        self._ready.set()

    @property
    def closed(self) -> bool:
        return self._closed

    async def get(self) -> T:
        while not self._items:
            if self._closed:
                raise TransportClosed("queue closed")
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft()

    def __aiter__(self) -> AsyncIterator[T]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[T]:
        while True:
            try:
                yield await self.get()
            except TransportClosed:
                return


class Outbox(DropOldestQueue[T]):
    """A device's outbound queue, drained by one sender that `take`s an item, hands it on,
    then says `done`; the sender's progress wakes the producer, nothing polls.

    `room()` returns at once while the queue is at most half full; past that it waits until
    the sender has brought it down to a quarter (high and low water marks, as asyncio's
    transports have: the producer is woken once per stretch, not for every item sent).
    `sent()` returns once nothing is queued or in hand."""

    def __init__(self, bound: int = DEFAULT_QUEUE_BOUND) -> None:
        super().__init__(bound)
        self.high_water = bound // 2
        self.low_water = bound // 4
        self._in_hand = False
        self._room = asyncio.Event()
        self._idle = asyncio.Event()

    async def take(self) -> T:
        """The oldest item, now in hand until `done()`; TransportClosed once closed."""
        while not self._items:
            if self._closed:
                raise TransportClosed("queue closed")
            self._ready.clear()
            await self._ready.wait()
        self._in_hand = True
        return self._items.popleft()

    def done(self) -> None:
        """What the sender took has been handed on (or put back with `push_front`)."""
        self._in_hand = False
        queued = len(self._items)
        if queued <= self.low_water:
            self._room.set()
            if not queued:
                self._idle.set()

    async def room(self) -> None:
        if len(self._items) <= self.high_water:
            return
        while len(self._items) > self.low_water:
            self._room.clear()
            await self._room.wait()

    async def sent(self) -> None:
        while self._items or self._in_hand:
            self._idle.clear()
            await self._idle.wait()


#: Takes a message as it arrives; True when it handled it (else it is queued for `messages()`).
Listener = Callable[[str, Message], bool]


class InboundBuffer:
    """What transports share: the drop-oldest inbound queue and its accounting.

    With a `listener`, a message that arrives while nothing is queued is offered to it at once,
    in the same event-loop turn (no wake-up of a reader task in between); what it declines, and
    everything that arrives behind queued messages, is queued, so the order is kept."""

    def __init__(self, stats: TransportStats, bound: int = DEFAULT_QUEUE_BOUND) -> None:
        self.stats = stats
        self.queue: DropOldestQueue[Inbound] = DropOldestQueue(bound)
        self.listener: Listener | None = None

    def deliver(self, sensor_id: str, msg: Message) -> None:
        self.stats.received += 1
        listener = self.listener
        if listener is not None and not len(self.queue) and listener(sensor_id, msg):
            self.stats.delivered += 1
            return
        if not self.queue.put_nowait(Inbound(sensor_id, msg)):
            self.stats.dropped_queue_full += 1
            if self.stats.dropped_queue_full == 1:
                log.warning(
                    "inbound queue full (%d messages): dropping the oldest (counted in"
                    " dropped_queue_full; logged once)",
                    self.queue.bound,
                )

    def bad(self, where: str, detail: str) -> None:
        self.stats.dropped_bad += 1
        self.stats.last_error = f"{where}: {detail}"
        log.debug("dropped bad packet from %s: %s", where, detail)

    async def messages(self) -> AsyncIterator[Inbound]:
        async for item in self.queue:
            self.stats.delivered += 1
            yield item

    async def batches(self) -> AsyncIterator[list[Inbound]]:
        """Everything queued at once (at least one item), until the queue is closed."""
        while True:
            try:
                first = await self.queue.get()
            except TransportClosed:
                return
            batch = [first, *self.queue.drain()]
            self.stats.delivered += len(batch)
            yield batch


Corrupt = Callable[[bytes], bytes]


@runtime_checkable
class MoteLink(Protocol):
    """Device side of a transport: what one simulated mote talks through.

    `send` never blocks on the network (a mote has no time to wait): it queues, or drops and
    counts. `corrupt`, when given, is applied to the bytes as they travel (radio noise), after
    any checksum, so fault injection exercises the real receive path.
    """

    sensor_id: str

    async def send(self, msg: Message, *, corrupt: Corrupt | None = None) -> None: ...

    def set_online(self, online: bool) -> None:
        """Radio off (False: nothing is delivered) or back on."""
        ...

    async def flow(self) -> None:
        """Return when the link can take more (replay as fast as the link goes, no overflow)."""
        ...

    def poll_controls(self) -> list[Control]:
        """Control messages that arrived since the last poll (the mote's receive window)."""
        ...

    async def next_control(self) -> Control:
        """Wait for the next control message."""
        ...


class ControlInbox:
    """A mote's bounded inbox of control messages (drop oldest: newer settings supersede).

    With `auth` (the mote's key), `receive` takes only authentic, fresh controls; the others
    are ignored (not applied, so not acked) and counted in `auth.rejected`."""

    def __init__(
        self, bound: int = 64, *, sensor_id: str = "", auth: MoteAuth | None = None
    ) -> None:
        self.queue: DropOldestQueue[Control] = DropOldestQueue(bound)
        self.sensor_id = sensor_id
        self.auth = auth
        #: controls ignored without auth (undecodable, or for another sensor)
        self.ignored = 0

    def receive(self, data: bytes | bytearray | memoryview) -> Control | None:
        """A control's bytes as they arrived: queued if it is (authentic and) for this mote."""
        if self.auth is not None:
            msg = self.auth.open_control(data)
        else:
            try:
                decoded = decode_message(data)
            except ProtocolError:
                decoded = None
            ours = isinstance(decoded, Control) and (
                not self.sensor_id or decoded.sensor_id == self.sensor_id
            )
            msg = decoded if ours and isinstance(decoded, Control) else None
            if msg is None:
                self.ignored += 1
        if msg is not None:
            self.put(msg)
        return msg

    @property
    def dropped(self) -> int:
        return self.queue.dropped

    def put(self, msg: Control) -> None:
        self.queue.put_nowait(msg)

    def poll(self) -> list[Control]:
        return self.queue.drain()

    async def next(self) -> Control:
        return await self.queue.get()
