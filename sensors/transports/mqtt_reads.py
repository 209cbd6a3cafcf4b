"""The read side of the gateway's subscribing MQTT clients (the mote and plain-device
transports): a bounded inbound queue, and socket reads in chunks with backpressure.

aiomqtt's inbound queue is bounded by us (the transport's ``queue_bound``); when it overflows
the oldest message is dropped and counted (``stats.dropped_client_queue``, logged once instead
of aiomqtt's warning per message), and the transports drain it in batches (``DRAIN_BATCH``), so
a burst is decoded in a tight loop.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

import aiomqtt

from sensors.transports.broker import BrokerSettings

__all__ = ["DRAIN_BATCH", "BufferedReads", "ClientQueue", "ack_now", "bounded_client"]

log = logging.getLogger("sensors.transports")

#: Most messages decoded in one go before the event loop gets a turn.
DRAIN_BATCH = 1024
#: Bytes taken from the broker's socket per read (one syscall for many packets).
READ_CHUNK = 65_536
#: Linux: acknowledge what was read at once. The broker (Mosquitto by default) does not set
#: TCP_NODELAY on its side, so each message it forwards waits for our acknowledgement of the
#: previous one, which the kernel delays by up to 40 ms unless asked (per read: it resets).
#: Measured in benchmarks/gateway_load.py: mote send to gateway read p50 13 ms without, 0.1 ms
#: with it.
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


class ClientQueue(asyncio.Queue[aiomqtt.Message]):
    """aiomqtt's inbound queue, bounded by us: when full, drop the OLDEST message and count it
    (aiomqtt itself would drop the newest and log a WARNING for every one)."""

    def __init__(self, maxsize: int, on_drop: Callable[[], None]) -> None:
        super().__init__(maxsize)
        self._on_drop = on_drop

    def put_nowait(self, item: aiomqtt.Message) -> None:
        if self.full():
            self.get_nowait()
            self._on_drop()
        super().put_nowait(item)

    def take(self, n: int) -> list[aiomqtt.Message]:
        """Up to `n` queued messages, without waiting."""
        return [self.get_nowait() for _ in range(min(n, self.qsize()))]


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


class BufferedReads:
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
    backlog from the broker into the gateway's bounded queues, where it is dropped. There is no
    event for "the gateway has room again", so a held socket is looked at every
    `HOLD_RECHECK_S`."""

    def __init__(self, client: aiomqtt.Client, hold: Callable[[], bool] | None = None) -> None:
        self._hold = hold
        self._held_since: float | None = None
        self.holds = 0  # times reading was held back (for tests and stats)
        self._aio = client
        # paho's private reading hooks, replaced on purpose: untyped from here on.
        paho: Any = client._client
        self._paho = paho
        self._loop: asyncio.AbstractEventLoop = client._loop
        self._recv = paho._sock_recv
        self._buf = b""
        self._pos = 0
        self._sock: Any = None
        self._fd = -1
        self._quickack = _QUICKACK is not None
        paho._sock_recv = self._sock_recv
        self._aiomqtt_open = paho.on_socket_open
        paho.on_socket_open = self._on_socket_open

    def _sock_recv(self, bufsize: int) -> bytes:
        sock = self._paho._sock
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
        return len(self._buf) - self._pos if self._sock is self._paho._sock else 0

    def _on_socket_open(self, paho: Any, userdata: Any, sock: Any) -> None:
        self._aiomqtt_open(paho, userdata, sock)  # its reader, then (in order) ours replaces it
        self._fd = sock.fileno()
        self._loop.call_soon_threadsafe(self._loop.add_reader, self._fd, self._readable)

    def _holding(self) -> bool:
        """Whether to leave the data in the broker for now (see the class docstring)."""
        if self._hold is None or not self._hold():
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
        if self._paho._sock is not sock:
            return
        if self._holding():
            self._loop.call_later(HOLD_RECHECK_S, self._resume, sock)
            return
        self._loop.add_reader(self._fd, self._readable)
        self._readable()

    def _readable(self) -> None:
        paho = self._paho
        if self._holding():
            self._loop.remove_reader(self._fd)  # no busy wake-ups while held
            self._loop.call_later(HOLD_RECHECK_S, self._resume, paho._sock)
            return
        try:
            for _ in range(READ_PACKETS):
                paho.loop_read()
                pending = getattr(paho._sock, "pending", None)
                if not self.buffered() and not (pending is not None and pending() > 0):
                    return
            self._loop.call_soon(self._readable)  # more buffered: next turn
        except Exception as exc:  # noqa: BLE001 - as aiomqtt's reader: the connection is broken
            disconnected = self._aio._disconnected
            if not disconnected.done():
                disconnected.set_exception(exc)


def bounded_client(
    broker: BrokerSettings,
    identifier: str,
    *,
    clean_session: bool,
    queue_bound: int,
    on_overflow: Callable[[], None],
    hold: Callable[[], bool] | None = None,
) -> tuple[aiomqtt.Client, ClientQueue, BufferedReads | None]:
    """A client for one session of a subscribing transport, whose inbound queue is ours
    (bounded, dropping the oldest message and calling `on_overflow`), and its buffered reads
    (None with a paho/aiomqtt that lacks the hooks: then their own reader runs)."""
    made: list[ClientQueue] = []

    class Queue(ClientQueue):  # what aiomqtt instantiates, with our callback
        def __init__(self, maxsize: int = 0) -> None:
            super().__init__(maxsize, on_overflow)
            made.append(self)

    client = broker.client(
        identifier,
        clean_session=clean_session,
        queue_type=Queue,
        max_queued_incoming_messages=queue_bound,
        logger=logging.getLogger("sensors.transports.aiomqtt"),
    )
    reads: BufferedReads | None = None
    try:
        reads = BufferedReads(client, hold)
    except AttributeError as exc:
        log.warning("MQTT reads one packet per event-loop turn (no buffered reads: %s)", exc)
    return client, made[-1], reads
