"""Serial transport: a base-station mote on a serial line (or a pseudo-terminal standing in).

Gateway side, :class:`SerialTransport` opens the device with pyserial through
pyserial-asyncio-fast and feeds what it reads to the sans-IO :class:`~sensors.framing.FrameDecoder`.
When the device disappears (unplugged, pty closed) it keeps retrying the same path with
capped exponential backoff (the supervision of :mod:`sensors.transports.supervisor`), so a
device that comes back, even under a new /dev/pts/N behind a stable symlink, is picked up again.
A damaged frame is counted and skipped; the good frames around it, in the same read, are kept.

Device side, :class:`PtyBaseStation` is a simulated base station: it owns a pseudo-terminal,
multiplexes many motes onto it (every frame names its sensor), paces output at the line's baud
rate, and routes control frames from the gateway to the right mote: decoded and checked for a
Python mote (`link`), as the gateway's bytes for a device that checks them itself
(`device_link`: firmware in the loop, whose seal check covers exactly those bytes).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import tty
from pathlib import Path
from types import TracebackType
from typing import Self

import serial
import serial_asyncio_fast

from fjords.supervision import Backoff, cancel_and_wait, log_task_failure
from sensors.framing import DEFAULT_MAX_FRAME, FrameDecoder, FrameError, frame_payload
from sensors.protocol import Control, Message, encode_message
from sensors.sealing import MoteAuth
from sensors.transports.base import (
    DEFAULT_QUEUE_BOUND,
    ControlInbox,
    Corrupt,
    DropOldestQueue,
    Outbox,
    TransportUnavailable,
    log,
)
from sensors.transports.supervisor import SupervisedTransport

__all__ = ["PtyBaseStation", "PtyDeviceLink", "PtyLink", "SerialTransport", "line_rate"]


def line_rate(baudrate: int) -> float:
    """Bytes per second on an 8N1 line (ten bits on the wire per byte)."""
    return baudrate / 10


class _FrameProtocol(asyncio.Protocol):
    def __init__(self, owner: SerialTransport) -> None:
        self.owner = owner
        self.lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        try:
            self.owner._on_bytes(data)
        except Exception as exc:  # noqa: BLE001 - a bug in decoding must not vanish in the event loop
            if not self.lost.done():
                self.lost.set_exception(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)


class SerialTransport(SupervisedTransport):
    """Gateway side of a serial line; see the module docstring."""

    expected = (OSError, serial.SerialException, ValueError, ConnectionError)

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        baudrate: int = 115_200,
        queue_bound: int = DEFAULT_QUEUE_BOUND,
        max_frame: int = DEFAULT_MAX_FRAME,
        backoff: Backoff | None = None,
    ) -> None:
        self.url = os.fspath(url)
        # A device that is plugged back in is picked up within two seconds.
        super().__init__(
            f"serial {self.url}",
            queue_bound=queue_bound,
            max_message_bytes=max_frame,
            backoff=backoff if backoff is not None else Backoff(0.05, 2.0),
        )
        self.baudrate = baudrate
        self.decoder = FrameDecoder(max_frame=max_frame)
        self._asyncio_transport: asyncio.Transport | None = None

    async def _send(self, sensor_id: str, msg: Control) -> None:
        tr = self._asyncio_transport
        if tr is None or tr.is_closing():
            raise TransportUnavailable(f"serial device {self.url} is not connected")
        tr.write(frame_payload(self.encode_control(msg)))

    def _on_bytes(self, data: bytes) -> None:
        decoder = self.decoder
        for payload in decoder.feed_payloads(data):
            item = payload if isinstance(payload, FrameError) else decoder.message(payload)
            if isinstance(item, FrameError):
                self.bad(f"frame_{item.reason}", self.url, item.detail)
                continue
            assert isinstance(payload, bytes)
            try:
                self.accept_message(item, where=self.url, payload=payload)
            except Exception as exc:  # noqa: BLE001 - a bad message is counted and logged, not the link's end
                self.failed(self.url, exc)
        self.stats.frames = self.decoder.stats.as_dict()

    async def session(self) -> None:
        loop = asyncio.get_running_loop()
        tr, proto = await serial_asyncio_fast.create_serial_connection(
            loop, lambda: _FrameProtocol(self), self.url, baudrate=self.baudrate
        )
        assert isinstance(proto, _FrameProtocol)
        self._asyncio_transport = tr
        try:
            self.mark_connected()
            log.info("serial %s connected", self.url)
            exc = await proto.lost
        finally:
            self._asyncio_transport = None
            if not tr.is_closing():
                tr.abort()
            # A frame cut off by the disconnect must not glue onto the first one after it.
            self.decoder.feed(b"\x00")
        raise ConnectionError(f"{self.url} lost: {exc}")


class PtyBaseStation:
    """A simulated base station behind a pseudo-terminal; motes attach with `link()`.

    `path` is what the gateway opens: the pty's slave name, or `link_path` (a symlink to it,
    like a udev /dev/serial/by-id name) when given. Output is paced at `baudrate` (None: as
    fast as the pty takes it) and waits in a bounded drop-oldest queue of frames.
    """

    def __init__(
        self,
        *,
        baudrate: int | None = 115_200,
        link_path: str | os.PathLike[str] | None = None,
        queue_bound: int = 4096,
    ) -> None:
        self.baudrate = baudrate
        self.link_path = Path(link_path) if link_path is not None else None
        self.decoder = FrameDecoder()
        self.bytes_written = 0
        self.frames_written = 0
        self.bad_frames = 0
        self._out: Outbox[bytes] = Outbox(queue_bound)
        self._links: dict[str, PtyLink | PtyDeviceLink] = {}
        self._master = -1
        self._slave = -1
        self.slave_name = ""
        self._task: asyncio.Task[None] | None = None

    @property
    def path(self) -> str:
        return str(self.link_path) if self.link_path is not None else self.slave_name

    @property
    def dropped(self) -> int:
        return self._out.dropped

    def link(self, sensor_id: str, key: bytes | None = None) -> PtyLink:
        """The mote's side; `key` (the first time): it seals what it sends and takes only
        authentic controls."""
        link = self._links.get(sensor_id)
        if link is None:
            link = self._links[sensor_id] = PtyLink(self, sensor_id, key)
        if not isinstance(link, PtyLink):
            raise ValueError(f"{sensor_id} is already attached as a device link")
        return link

    def device_link(self, sensor_id: str) -> PtyDeviceLink:
        """A device that speaks for itself (firmware in the loop): its frames go out as it
        wrote them (`write_frame`), and each control for `sensor_id` reaches it as the bytes
        the gateway sent, seal included: the device verifies it, nothing here re-encodes."""
        link = self._links.get(sensor_id)
        if link is None:
            link = self._links[sensor_id] = PtyDeviceLink(sensor_id)
        if not isinstance(link, PtyDeviceLink):
            raise ValueError(f"{sensor_id} is already attached as a simulated mote")
        return link

    async def __aenter__(self) -> Self:
        self._master, self._slave = os.openpty()
        # Raw from the start: a cooked pty would echo our frames back and rewrite CR/LF.
        tty.setraw(self._slave)
        os.set_blocking(self._master, False)
        self.slave_name = os.ttyname(self._slave)
        if self.link_path is not None:
            tmp = self.link_path.with_name(self.link_path.name + ".tmp")
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            tmp.symlink_to(self.slave_name)
            tmp.replace(self.link_path)
        loop = asyncio.get_running_loop()
        loop.add_reader(self._master, self._on_readable)
        self._task = asyncio.create_task(self._write_loop(), name=f"pty {self.slave_name}")
        self._task.add_done_callback(log_task_failure)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """The device disappears: the gateway's reads fail until a new station appears."""
        await self.close()

    async def close(self) -> None:
        """Idempotent `__aexit__`: unplug the device now."""
        if self._master < 0:
            return
        task, self._task = self._task, None
        await cancel_and_wait(task)
        loop = asyncio.get_running_loop()
        loop.remove_reader(self._master)
        for fd in (self._master, self._slave):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._master = self._slave = -1

    async def drain(self) -> None:
        """Wait until every queued frame has been written to the pty."""
        await self._out.sent()

    async def room(self) -> None:
        """Wait while the output queue is too full to take more (see `Outbox.room`)."""
        await self._out.room()
        await asyncio.sleep(0)  # and give the writer its turn even when there is room

    def _queue(self, frame: bytes) -> None:
        self._out.put_nowait(frame)

    def write_frame(self, frame: bytes) -> None:
        """Queue one already-framed message as it is (a device's own bytes, e.g. firmware in
        the loop); controls for its sensor reach it through `link(sensor_id)`."""
        self._queue(frame)

    def _on_readable(self) -> None:
        try:
            data = os.read(self._master, 65536)
        except BlockingIOError:
            return
        except OSError:  # EIO: nobody has the slave open; nothing to read
            return
        for payload in self.decoder.feed_payloads(data):
            item = payload if isinstance(payload, FrameError) else self.decoder.message(payload)
            link = self._links.get(item.sensor_id) if isinstance(item, Control) else None
            if link is None:
                self.bad_frames += 1
                continue
            assert isinstance(payload, bytes)
            if isinstance(link, PtyDeviceLink):
                link.receive(payload)
            else:
                link.inbox.receive(payload)

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        rate = line_rate(self.baudrate) if self.baudrate else None
        max_chunk = max(256, int(rate * 0.01)) if rate else 65536
        start = time.perf_counter()
        budget_bytes = 0
        while True:
            frame = await self._out.take()
            # Coalesce what is queued into one write, as a UART FIFO would.
            chunk = bytearray(frame)
            frames = 1
            while len(self._out) and len(chunk) < max_chunk:
                chunk += self._out.pop_nowait()
                frames += 1
            try:
                await self._write(loop, bytes(chunk))
            finally:
                self._out.done()
            self.frames_written += frames
            if rate is not None:  # the line's own pace, as a UART at `baudrate` would send
                budget_bytes += len(chunk)
                ahead = budget_bytes / rate - (time.perf_counter() - start)
                if ahead > 0:
                    await asyncio.sleep(ahead)
                elif ahead < -0.5:  # idle line: do not bank more than half a second of credit
                    start = time.perf_counter()
                    budget_bytes = 0

    async def _write(self, loop: asyncio.AbstractEventLoop, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self._master, view)
            except BlockingIOError:  # the pty's buffer is full: wait until it can take more
                fut = loop.create_future()
                loop.add_writer(self._master, fut.set_result, None)
                try:
                    await fut
                finally:
                    loop.remove_writer(self._master)
                continue
            view = view[n:]
            self.bytes_written += n


class PtyLink:
    """Device side of one mote behind a :class:`PtyBaseStation`."""

    def __init__(self, station: PtyBaseStation, sensor_id: str, key: bytes | None = None) -> None:
        self.station = station
        self.sensor_id = sensor_id
        self.auth = MoteAuth(sensor_id, key) if key is not None else None
        self.inbox = ControlInbox(sensor_id=sensor_id, auth=self.auth)
        self.online = True
        self.sent = 0

    async def send(self, msg: Message, *, corrupt: Corrupt | None = None) -> None:
        if not self.online:
            return
        data = encode_message(msg)
        frame = frame_payload(self.auth.seal_bytes(data) if self.auth is not None else data)
        if corrupt is not None:
            frame = corrupt(frame)
        self.sent += 1
        self.station._queue(frame)

    def set_online(self, online: bool) -> None:
        self.online = online

    async def flow(self) -> None:
        """Wait while the station's output queue is too full (as fast as the line goes)."""
        await self.station.room()

    def poll_controls(self) -> list[Control]:
        return self.inbox.poll()

    async def next_control(self) -> Control:
        return await self.inbox.next()


class PtyDeviceLink:
    """Controls for one device behind a :class:`PtyBaseStation`, as the bytes that arrived
    (a bounded drop-oldest queue, like a mote's inbox); see `PtyBaseStation.device_link`."""

    def __init__(self, sensor_id: str, bound: int = 64) -> None:
        self.sensor_id = sensor_id
        self.queue: DropOldestQueue[bytes] = DropOldestQueue(bound)
        self.received = 0

    def receive(self, data: bytes | bytearray | memoryview) -> None:
        self.received += 1
        if not self.queue.put_nowait(bytes(data)) and self.queue.dropped == 1:
            log.warning(
                "device %s: controls arrive faster than it takes them; dropping the oldest"
                " (counted in its link's `dropped`)",
                self.sensor_id,
            )

    @property
    def dropped(self) -> int:
        return self.queue.dropped

    async def next_control(self) -> bytes:
        """The next control's message bytes (its frame's payload, CRC and COBS removed)."""
        return await self.queue.get()
