"""Serial framing (sans-IO): COBS-encoded frames carrying a message and its CRC16.

On the wire a frame is ``00 | COBS(payload | crc16_be(payload)) | 00``. COBS removes every
zero byte from the frame body, so ``00`` only ever means "frame boundary" and a decoder that
joins mid-stream, or loses bytes, resynchronises at the next zero. The delimiter is written on
*both* sides: if noise hits one frame's trailing zero, the next frame's leading zero still
isolates it, so only frames whose own bytes were damaged are lost. Empty frames (two zeros
in a row) are ignored.

CRC16 is CRC-16/CCITT-FALSE (poly 0x1021, init 0xFFFF) from the stdlib's ``binascii.crc_hqx``;
COBS is the ``cobs`` package (C extension).
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass, field

from cobs import cobs

from sensors.protocol import Message, ProtocolError, decode_message, encode_message

__all__ = [
    "DEFAULT_MAX_FRAME",
    "FrameDecoder",
    "FrameError",
    "crc16",
    "encode_frame",
    "frame_payload",
]

DELIMITER = b"\x00"
#: Longest COBS body accepted; beyond it the decoder drops bytes until the next delimiter.
DEFAULT_MAX_FRAME = 4096


def crc16(data: bytes) -> int:
    """CRC-16/CCITT-FALSE of `data`."""
    return binascii.crc_hqx(data, 0xFFFF)


def frame_payload(payload: bytes) -> bytes:
    """Wrap already-encoded message bytes in a frame."""
    body = payload + crc16(payload).to_bytes(2, "big")
    return DELIMITER + cobs.encode(body) + DELIMITER


def encode_frame(msg: Message) -> bytes:
    """The serial bytes for one message."""
    return frame_payload(encode_message(msg))


@dataclass(frozen=True, slots=True)
class FrameError:
    """A frame that was dropped, and why; returned (never raised) so a reader keeps going."""

    reason: str  # "cobs", "crc", "short", "oversize", "protocol"
    detail: str
    size: int


@dataclass(slots=True)
class FrameStats:
    frames_ok: int = 0
    #: Frames dropped for any reason (sum of the reason counters below).
    frames_dropped: int = 0
    bad_cobs: int = 0
    bad_crc: int = 0
    too_short: int = 0
    oversize: int = 0
    bad_message: int = 0
    bytes_in: int = 0

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__slots__}


@dataclass
class FrameDecoder:
    """Feed it bytes as they arrive; get back messages and errors in stream order.

    Holds at most `max_frame` bytes of an unfinished frame: a longer run without a delimiter is
    dropped (counted as `oversize`) and the decoder skips to the next zero. A bad frame is a
    FrameError in the output, never an exception, so the good frames around it are kept.
    """

    max_frame: int = DEFAULT_MAX_FRAME
    stats: FrameStats = field(default_factory=FrameStats)
    _buf: bytearray = field(default_factory=bytearray, repr=False)
    _skipping: bool = field(default=False, repr=False)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Message | FrameError]:
        """The messages (and errors) completed by `data`."""
        return [self.message(p) if isinstance(p, bytes) else p for p in self.feed_payloads(data)]

    def feed_payloads(self, data: bytes | bytearray | memoryview) -> list[bytes | FrameError]:
        """The same, undecoded: each good frame's payload (a message's bytes, which a reader
        that verifies tags needs as they were sent; `message` decodes one)."""
        self.stats.bytes_in += len(data)
        out: list[bytes | FrameError] = []
        pieces = bytes(data).split(DELIMITER)
        # Every piece but the last is terminated by a delimiter.
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            if self._skipping:
                if last:
                    continue  # still inside the oversize run
                self._skipping = False
                continue  # this piece ends the run we are discarding
            if len(self._buf) + len(piece) > self.max_frame:
                size = len(self._buf) + len(piece)
                self._buf.clear()
                out.append(
                    self._drop("oversize", f"no delimiter within {self.max_frame} bytes", size)
                )
                self.stats.oversize += 1
                self._skipping = last
                continue
            if last:
                self._buf += piece
                break
            if self._buf:
                self._buf += piece
                body = bytes(self._buf)
                self._buf.clear()
            else:
                body = piece
            if body:
                out.append(self._frame(body))
        return out

    def _frame(self, body: bytes) -> bytes | FrameError:
        try:
            raw = cobs.decode(body)
        except cobs.DecodeError as exc:
            self.stats.bad_cobs += 1
            return self._drop("cobs", str(exc), len(body))
        if len(raw) < 3:
            self.stats.too_short += 1
            return self._drop("short", f"{len(raw)} bytes cannot hold a message and CRC", len(body))
        payload, crc = raw[:-2], int.from_bytes(raw[-2:], "big")
        if crc16(payload) != crc:
            self.stats.bad_crc += 1
            return self._drop("crc", f"CRC {crc:#06x} != computed {crc16(payload):#06x}", len(body))
        return payload

    def message(self, payload: bytes) -> Message | FrameError:
        """Decode one payload from `feed_payloads` (counted as a good or bad frame)."""
        try:
            msg = decode_message(payload, max_bytes=self.max_frame)
        except ProtocolError as exc:
            self.stats.bad_message += 1
            return self._drop("protocol", str(exc), len(payload))
        self.stats.frames_ok += 1
        return msg

    def _drop(self, reason: str, detail: str, size: int) -> FrameError:
        self.stats.frames_dropped += 1
        return FrameError(reason, detail, size)

    @property
    def pending(self) -> int:
        """Bytes held of a frame not yet terminated."""
        return len(self._buf)
