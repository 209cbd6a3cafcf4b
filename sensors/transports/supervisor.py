"""What the gateway-side transports share on top of :class:`fjords.supervision.Supervised`.

:class:`SupervisedTransport` is a supervised session plus the bounded inbound queue, the
preconditions of ``send`` (inside ``async with``, the message is for that sensor, the link is
up), and decode-and-validate of incoming packets, where every dropped packet is counted by
reason, the first of each reason is logged, and gaps in each sensor's message sequence numbers
are counted (messages lost on the way, e.g. QoS 0 MQTT while a broker restarts).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Collection
from types import TracebackType
from typing import ClassVar, Self

from fjords.supervision import Backoff, Supervised
from sensors.protocol import (
    MAX_MESSAGE_BYTES,
    Control,
    Hello,
    Message,
    ProtocolError,
    Status,
    decode_message,
    encode_message,
)
from sensors.sealing import GatewayAuth
from sensors.transports.base import (
    DEFAULT_QUEUE_BOUND,
    Inbound,
    InboundBuffer,
    Listener,
    TransportClosed,
    TransportStats,
)

__all__ = ["INBOUND_KINDS", "SeqTracker", "SupervisedTransport"]

log = logging.getLogger("sensors.transports")

#: Kinds a device may send to the gateway (controls only go the other way).
INBOUND_KINDS = frozenset({"hello", "samples", "events", "aggregate", "listen", "ack", "status"})


class SeqTracker:
    """Counts gaps in each sensor's sequence numbers (messages that never arrived).

    A mote numbers all its messages from one counter; the gateway sees its numbered messages
    on one link in order, except its hello: a mote that reconnects takes a new number for the
    hello it publishes first, then sends what it queued while away, numbered before that hello.
    So a hello does not move the sensor's place: its number is remembered as taken (`ahead`),
    and a later jump over it is no gap. A number past the next one expected counts the ones
    skipped (less any hello's); a repeated or older one is a duplicate (QoS 1 redelivery, a
    retained hello sent again at a resubscribe) and counts nothing. The mote restarted its
    counter when, after a hello numbered below its place, the next message follows that hello,
    or when a number is far below its place (`restart_below`). Status messages are not
    numbered (a last will is written in advance) and are ignored.
    """

    #: hellos remembered ahead of a sensor's place (reconnects while its backlog drains)
    MAX_AHEAD = 16

    def __init__(self, max_sensors: int = 100_000, restart_below: int = 1000) -> None:
        self.max_sensors = max_sensors
        self.restart_below = restart_below
        self.gaps = 0
        self.duplicates = 0
        self.untracked = 0
        self._places: dict[str, _Place] = {}

    def see(self, sensor_id: str, msg: Message) -> int:
        """Record one message; returns how many messages before it were missed."""
        if isinstance(msg, Status):
            return 0
        place = self._places.get(sensor_id)
        if place is None:
            if len(self._places) >= self.max_sensors:
                self.untracked += 1
                return 0
            place = self._places[sensor_id] = _Place()
        if isinstance(msg, Hello):
            self._hello(place, msg.seq)
            return 0
        return self._numbered(place, msg.seq)

    def _hello(self, p: _Place, seq: int) -> None:
        if p.last is None or seq > p.last:
            if seq not in p.ahead:
                p.ahead = sorted([*p.ahead, seq])[-self.MAX_AHEAD :]
            p.reboot = None
        else:  # sent again (retained), or the mote restarted: the next message tells
            self.duplicates += 1
            p.reboot = seq

    def _numbered(self, p: _Place, seq: int) -> int:
        last, reboot = p.last, p.reboot
        p.reboot = None
        if last is None:
            p.last, p.ahead = seq, [h for h in p.ahead if h > seq]
            return 0
        if seq > last:
            taken = sum(1 for h in p.ahead if h < seq)
            p.last, p.ahead = seq, [h for h in p.ahead if h > seq]
            missed = seq - last - 1 - taken
            self.gaps += missed
            return missed
        follows_hello = reboot is not None and seq == reboot + 1
        if follows_hello or seq + self.restart_below < last:
            p.last, p.ahead = seq, []  # the mote restarted its counter
        else:
            self.duplicates += 1
        return 0

    def forget(self, sensor_id: str) -> None:
        self._places.pop(sensor_id, None)


class _Place:
    """Where one sensor's numbering is: the last number seen in order (None: only hellos so
    far), hellos' numbers ahead of it, a hello numbered below it (a restart if followed)."""

    __slots__ = ("ahead", "last", "reboot")

    def __init__(self) -> None:
        self.last: int | None = None
        self.ahead: list[int] = []
        self.reboot: int | None = None


class SupervisedTransport(Supervised):
    """Gateway side of a transport: a supervised session plus inbound queue, send and decode."""

    logger: ClassVar[logging.Logger] = log
    stats: TransportStats

    def __init__(
        self,
        name: str,
        *,
        queue_bound: int = DEFAULT_QUEUE_BOUND,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        backoff: Backoff | None = None,
    ) -> None:
        super().__init__(name, backoff=backoff, stats=TransportStats())
        self.max_message_bytes = max_message_bytes
        self.seqs = SeqTracker()
        #: verifies what motes send and seals controls (None: unauthenticated, as before)
        self.auth: GatewayAuth | None = None
        self._queue_bound = queue_bound
        self._inbound = InboundBuffer(self.stats, queue_bound)
        self._bad_logged: set[str] = set()
        #: how long health() reports drops after the last one
        self.drop_window_s = 60.0
        self._drops_seen = 0
        self._drops_at: float | None = None

    async def __aenter__(self) -> Self:
        if self._inbound.queue.closed:  # entered again after a clean exit: a fresh queue
            listener = self._inbound.listener
            self._inbound = InboundBuffer(self.stats, self._queue_bound)
            self._inbound.listener = listener
        return await super().__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await super().__aexit__(exc_type, exc, tb)
        finally:
            self._inbound.queue.close()

    def messages(self) -> AsyncIterator[Inbound]:
        """Messages from every sensor on this transport, in arrival order, until closed."""
        return self._inbound.messages()

    def batches(self) -> AsyncIterator[list[Inbound]]:
        """The same messages, everything queued at once: a consumer handles them in one go."""
        return self._inbound.batches()

    def set_listener(self, listener: Listener | None) -> None:
        """Offer each message to `listener` as it arrives, before queueing it (see
        `InboundBuffer`): a consumer that can handle it synchronously saves a task wake-up."""
        self._inbound.listener = listener

    # -- sending -----------------------------------------------------------------------------
    async def send(self, sensor_id: str, msg: Control) -> None:
        """Deliver a control message; TransportUnavailable while the link is down."""
        if self._task is None:
            raise TransportClosed(f"send() outside `async with` {self.name}")
        if msg.sensor_id != sensor_id:
            raise ValueError(f"control for {msg.sensor_id!r} sent to {sensor_id!r}")
        await self._send(sensor_id, msg)
        self.stats.sent += 1

    async def _send(self, sensor_id: str, msg: Control) -> None:
        raise NotImplementedError

    def encode_control(self, msg: Control) -> bytes:
        """A control's bytes as they go out: sealed for the mote when keys are configured."""
        return self.auth.seal_control(msg) if self.auth is not None else encode_message(msg)

    # -- receiving ---------------------------------------------------------------------------
    def accept(
        self,
        payload: bytes | bytearray | memoryview,
        *,
        where: str,
        sensor_id: str | None = None,
        kinds: Collection[str] = INBOUND_KINDS,
        retained: bool = False,
    ) -> Message | None:
        """Decode and validate one packet and queue it for the proxies; None when it was bad.
        `retained`: the broker kept it (verified, but not checked for replay)."""
        try:
            msg = decode_message(payload, max_bytes=self.max_message_bytes)
        except ProtocolError as exc:
            self.bad("protocol", where, str(exc))
            return None
        return self.accept_message(
            msg, where=where, sensor_id=sensor_id, kinds=kinds, payload=payload, retained=retained
        )

    def accept_message(
        self,
        msg: Message,
        *,
        where: str,
        sensor_id: str | None = None,
        kinds: Collection[str] = INBOUND_KINDS,
        payload: bytes | bytearray | memoryview = b"",
        retained: bool = False,
    ) -> Message | None:
        """Validate an already decoded message (the sender, its kind, and with `auth` its
        tag and counter, over `payload`: the bytes it was decoded from) and queue it."""
        if sensor_id is not None and msg.sensor_id != sensor_id:
            self.bad("sender", where, f"message claims to be from {msg.sensor_id!r}")
            return None
        if msg.kind not in kinds:
            self.bad("kind", where, f"a {msg.kind!r} message is not expected here")
            return None
        auth = self.auth
        if auth is not None and not auth.admit(msg.sensor_id, msg.kind, payload, retained=retained):
            return None  # counted (and logged) by `auth`
        missed = self.seqs.see(msg.sensor_id, msg)
        if missed:
            self.stats.seq_gaps += missed
            if self.stats.seq_gaps == missed:
                log.warning(
                    "%s: %d message(s) from %r never arrived (sequence gap; counted from now on)",
                    self.name,
                    missed,
                    msg.sensor_id,
                )
        self._inbound.deliver(msg.sensor_id, msg)
        return msg

    def bad(self, reason: str, where: str, detail: str) -> None:
        """Count a dropped packet under `reason`; log the first of each reason."""
        self.stats.bad[reason] = self.stats.bad.get(reason, 0) + 1
        self._inbound.bad(where, detail)
        if reason not in self._bad_logged:
            self._bad_logged.add(reason)
            log.warning(
                "%s: dropped a bad packet from %s (%s: %s); further ones are only counted",
                self.name,
                where,
                reason,
                detail[:200],
            )

    def failed(self, where: str, exc: Exception) -> None:
        """Handling one packet raised (a bug): count and skip it, so that one packet can never
        restart the session (a retained one would do so at every reconnect)."""
        self.stats.bad["error"] = self.stats.bad.get("error", 0) + 1
        self.stats.dropped_bad += 1
        self.stats.last_error = f"{where}: {exc!r}"
        if "error" not in self._bad_logged:
            self._bad_logged.add("error")
            log.error(
                "%s: handling a packet from %s failed; skipped", self.name, where, exc_info=exc
            )

    def health(self) -> list[str]:
        """Down, or dropping messages it could not queue or that never arrived (within the
        last `drop_window_s` seconds): bad packets from peers do not count, they are not ours."""
        reasons = super().health()
        st = self.stats
        total = st.dropped_queue_full + st.dropped_client_queue + st.seq_gaps
        now = time.monotonic()
        if total > self._drops_seen:
            self._drops_seen, self._drops_at = total, now
        if self._drops_at is not None and now - self._drops_at < self.drop_window_s:
            reasons.append(
                f"{self.name}: dropping messages (queue full {st.dropped_queue_full}, client queue"
                f" full {st.dropped_client_queue}, sequence gaps {st.seq_gaps} so far)"
            )
        return reasons

    def overflow(self, where: str) -> None:
        """A packet lost before we could read it (a client library's queue was full)."""
        self.stats.dropped_client_queue += 1
        if self.stats.dropped_client_queue == 1:
            log.warning(
                "%s: %s is full, dropping incoming messages (counted in dropped_client_queue;"
                " logged once)",
                self.name,
                where,
            )
