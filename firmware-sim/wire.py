"""Sizes on the air of the protocol image's frames (avr/image.c), by msgpack's own rules.

The cost model (`firmware_sim.model`, ``wire="protocol"``) charges the radio for these bytes,
so they follow image.c field for field: the envelope ``[1, kind, [sensor_id, seq, ...]]``,
times as whole seconds (a msgpack integer) or float64, readings as integer A-to-D counts
(scale 1) or float32, then CRC-16 (2 bytes), COBS (1 byte below 254) and the two zero
delimiters the firmware writes around each frame. tests/firmware_sim/test_wire.py checks
every size against the gateway's own encoder (sensors/protocol.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "FLOAT64",
    "SEAL_BYTES",
    "Mote",
    "frame_bytes",
    "hmac_blocks",
    "mean_uint_bytes",
    "str_bytes",
    "uint_bytes",
]

FLOAT64 = 9
FLOAT32 = 5
#: CRC-16 + COBS code byte + the leading and trailing zero of image.c's `send_frame`.
FRAMING = 2 + 1 + 2
PROGRAM_NAMES = ("aggregate", "count", "deadband", "filter", "raw", "vehicle")
#: What sealing adds to a message (sensors/auth.py): the counter as a uint64 (0xcf + 8 bytes)
#: and the tag as bin 8 (0xc4 0x08 + 8 bytes).
SEAL_BYTES = 9 + 10
#: A mote clock on epoch time (what a flashed mote is given): whole seconds take a uint32.
EPOCH_S = 1_700_000_000


def uint_bytes(v: float) -> int:
    """msgpack size of a non-negative integer."""
    if v < 128:
        return 1
    if v < 256:
        return 2
    if v < 65536:
        return 3
    return 5 if v < 2**32 else 9


def str_bytes(s: str | int) -> int:
    """msgpack size of a string (or of a string of that many bytes)."""
    n = len(s.encode()) if isinstance(s, str) else s
    return n + (1 if n < 32 else 2)


def mean_uint_bytes(first: int, count: int) -> float:
    """Mean size of the integers first .. first+count-1 (e.g. sequence numbers)."""
    if count <= 0:
        return float(uint_bytes(first))
    total, lo, hi = 0, first, first + count
    for bound, size in ((128, 1), (256, 2), (65536, 3), (2**32, 5)):
        if lo < bound:
            n = min(hi, bound) - lo
            total += n * size
            lo += n
        if lo >= hi:
            break
    return total / count


@dataclass(frozen=True, slots=True)
class Mote:
    """What a frame's size depends on besides the data: who the mote is and its counters."""

    sensor_id: str = "mote"
    field: str = "value"
    #: Mean encoded size of the sequence number (a uint16 that wraps: 3 bytes nearly always).
    seq_bytes: float = 3.0
    #: The mote clock in seconds: whole-second times are msgpack integers of this size.
    clock_s: float = EPOCH_S
    #: A-to-D counts per reading unit: 1 sends integer counts, anything else float32.
    scale: float = 1.0
    listen_ms: int = 20

    def envelope(self, kind: str) -> float:
        """[1, kind, [sensor_id, seq, ...]] up to the first field after seq."""
        return 1 + 1 + str_bytes(kind) + 1 + str_bytes(self.sensor_id) + self.seq_bytes

    def time(self, whole: float) -> float:
        """Mean size of a time, a fraction `whole` of which are whole seconds."""
        return whole * uint_bytes(self.clock_s) + (1 - whole) * FLOAT64

    def reading(self, counts_bytes: float) -> float:
        """A reading: its integer size in counts (scale 1), else a float32."""
        return counts_bytes if self.scale == 1.0 else FLOAT32

    @property
    def listen_field(self) -> int:
        """The trailing listen_ms of a data message: nil or the window length."""
        return max(1, uint_bytes(self.listen_ms))


def frame_bytes(message_bytes: float) -> float:
    """A message of this many bytes as the firmware puts it on the air."""
    cobs = 1 + math.floor((message_bytes + 2) / 254)
    return message_bytes + 2 + cobs + 2


def hmac_blocks(message_bytes: float) -> int:
    """SHA-256 compressions of the firmware's HMAC over an unsealed message of this many bytes
    (avr/auth.c: the key's blocks precomputed): the message with the counter, padded, then
    the outer hash's one block."""
    covered = math.ceil(message_bytes) + 9  # [1, kind, body, counter]
    return (covered + 9 + 63) // 64 + 1


def samples(mote: Mote, n: float, whole: float, value_bytes: float) -> float:
    """`samples` with n readings (raw batches, filter and deadband readings)."""
    body = 1 + n * mote.time(whole) + 1 + n * (1 + mote.reading(value_bytes))
    return frame_bytes(mote.envelope("samples") + body + mote.listen_field)


def events(mote: Mote, role: str, whole: float) -> float:
    """One vehicle's `events`: [[t_on, t_off]] under the sensor's role."""
    body = str_bytes(role) + 1 + 1 + 2 * mote.time(whole)
    return frame_bytes(mote.envelope("events") + body + mote.listen_field)


def count_aggregate(mote: Mote, whole: float, vehicles: float) -> float:
    """`aggregate` of the count program: start, end, {"count": n}."""
    body = 2 * mote.time(whole) + 1 + str_bytes("count") + uint_bytes(vehicles)
    return frame_bytes(mote.envelope("aggregate") + body + mote.listen_field)


def partial_aggregate(
    mote: Mote, whole: float, n: int, value_bytes: float, sum_bytes: float
) -> float:
    """`aggregate` of the aggregate program: start, end, {sum, count, min, max}."""
    body = 2 * mote.time(whole) + 1
    body += str_bytes("sum") + mote.reading(sum_bytes) + str_bytes("count") + uint_bytes(n)
    body += 2 * (str_bytes("min") + mote.reading(value_bytes))
    return frame_bytes(mote.envelope("aggregate") + body + mote.listen_field)


def listen(mote: Mote) -> float:
    """A bare `listen` (a window with no data message to ride on)."""
    return frame_bytes(mote.envelope("listen") + uint_bytes(mote.listen_ms))


def hello(mote: Mote, program: str, period_ms: int, attributes_bytes: int = 1) -> float:
    """The boot `hello` (attributes: a msgpack map of that many bytes, {} by default)."""
    body = 1 + 1 + str_bytes(mote.field) + str_bytes("float")
    body += 1 + sum(str_bytes(p) for p in PROGRAM_NAMES) + str_bytes(program)
    body += uint_bytes(period_ms) + 1 + attributes_bytes
    return frame_bytes(mote.envelope("hello") + body)


def status(mote: Mote, reason: str = "power failing") -> float:
    """The last `status` (offline, no battery figure, a reason)."""
    return frame_bytes(mote.envelope("status") + 1 + 1 + str_bytes(reason))
