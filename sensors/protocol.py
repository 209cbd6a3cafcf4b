"""The mote wire protocol: typed messages in a small versioned msgpack envelope (sans-IO).

A message on the wire is the msgpack array ``[version, kind, body]`` where ``body`` is the
message's fields as an array, in declaration order (no field names: mote radio packets are
tiny). ``encode_message`` and ``decode_message`` are pure functions over bytes; framing for
byte streams lives in :mod:`sensors.framing`, and the transports move whole messages.

Decoding is strict: wrong version, unknown kind, missing or mistyped fields all raise
:class:`ProtocolError` naming the kind and field, so a reader can count and skip the packet.
Validation is msgspec's (typed, in C), which is both faster and stricter than hand checks.
Nothing a peer sends can make decoding raise anything else or build unbounded structures: a
message is at most ``max_bytes`` long, every field's type bounds its nesting depth (program
parameters included: at most a list of lists of scalars), and the one untyped step, skipping the
envelope's body, turns too deep a nesting into a ProtocolError.

Times are seconds on the *mote's* clock (floats); the gateway never rewrites them, because
clock skew is something the proxies must see to correct.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, ClassVar, Literal

import msgspec

__all__ = [
    "DATA_KINDS",
    "KINDS",
    "MAX_MESSAGE_BYTES",
    "PROTOCOL_VERSION",
    "Ack",
    "AggregateReport",
    "Control",
    "ControlOp",
    "Events",
    "Hello",
    "Listen",
    "Message",
    "Param",
    "ProtocolError",
    "Samples",
    "Scalar",
    "Status",
    "decode_message",
    "encode_message",
]

PROTOCOL_VERSION = 1

Seq = Annotated[int, msgspec.Meta(ge=0)]
Scalar = int | float | str | bool | None
FieldType = Literal["float", "int", "str", "bool"]
NonNegative = Annotated[float, msgspec.Meta(ge=0)]
#: A program parameter: a scalar, or a list of scalars or of lists of scalars (e.g. a filter's
#: ranges [[lo, hi], ...]); the program itself validates the shape when it is loaded (a bad one
#: gets an error ack). Bounded depth, so a control message cannot nest without end.
Param = Scalar | list[Scalar | list[Scalar]]
#: Longest message accepted by default (a batch of tens of thousands of samples fits).
MAX_MESSAGE_BYTES = 1 << 20


class ProtocolError(ValueError):
    """A packet that is not a valid message of this protocol version; the reader skips it."""


class _Base(msgspec.Struct, frozen=True, array_like=True, kw_only=True):
    kind: ClassVar[str]
    sensor_id: str
    seq: Seq = 0


class Hello(_Base, frozen=True, array_like=True, kw_only=True):
    """Sent on every (re)connect: who the mote is, what its readings look like, what it can run."""

    kind: ClassVar[str] = "hello"
    schema: tuple[tuple[str, FieldType], ...]
    programs: tuple[str, ...] = ()
    program: str = ""
    sample_period_ms: NonNegative = 0.0
    battery: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    attributes: dict[str, Scalar] = {}

    def __post_init__(self) -> None:
        if self.program and self.programs and self.program not in self.programs:
            raise ValueError(f"program {self.program!r} is not among programs {self.programs}")


class Samples(_Base, frozen=True, array_like=True, kw_only=True):
    """A batch of readings, one row per sample time; rows follow the schema in the hello."""

    kind: ClassVar[str] = "samples"
    times: tuple[float, ...]
    rows: tuple[tuple[Scalar, ...], ...]
    listen_ms: NonNegative | None = None

    def __post_init__(self) -> None:
        if len(self.times) != len(self.rows):
            raise ValueError(f"{len(self.times)} times but {len(self.rows)} rows")


class Events(_Base, frozen=True, array_like=True, kw_only=True):
    """Detected events, each a tuple of times: a loop sensor's vehicle is (covered, uncovered)."""

    kind: ClassVar[str] = "events"
    name: str
    times: tuple[tuple[float, ...], ...]
    listen_ms: NonNegative | None = None


class AggregateReport(_Base, frozen=True, array_like=True, kw_only=True):
    """A mote's partial aggregates over one window [start, end) (e.g. a count); on the wire
    the kind `aggregate`."""

    kind: ClassVar[str] = "aggregate"
    start: float
    end: float
    values: dict[str, float | int]
    listen_ms: NonNegative | None = None

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"window end {self.end} is before its start {self.start}")


class Listen(_Base, frozen=True, array_like=True, kw_only=True):
    """A bare receive window, for when there is no data packet to piggyback `listen_ms` on.

    `time` (optional, trailing: a listen without it still decodes) is the mote's clock at the
    window and a promise that nothing it sends later is dated before it: event-time progress
    (a heartbeat) from a mote that has no readings to send, e.g. one asleep. A mote sends it
    only when it holds no readings older than that (a sleeping mote flushed them first)."""

    kind: ClassVar[str] = "listen"
    duration_ms: NonNegative
    time: float | None = None


class ControlOp(StrEnum):
    SET_PERIOD = "set_period"
    LOAD_PROGRAM = "load_program"
    SLEEP = "sleep"
    WAKE = "wake"
    #: "introduce yourself": the gateway has data from a sensor but no hello (it booted first,
    #: or the gateway restarted); the mote answers with its Hello instead of an Ack.
    HELLO = "hello"


class Control(_Base, frozen=True, array_like=True, kw_only=True):
    """Gateway to mote. Build with the class methods, which fill exactly the fields each op needs."""

    kind: ClassVar[str] = "control"
    op: ControlOp
    period_ms: Annotated[float, msgspec.Meta(gt=0)] | None = None
    program: str | None = None
    params: dict[str, Param] = {}
    duration_ms: NonNegative | None = None

    def __post_init__(self) -> None:
        if self.op == ControlOp.SET_PERIOD and self.period_ms is None:
            raise ValueError("set_period needs period_ms")
        if self.op == ControlOp.LOAD_PROGRAM and not self.program:
            raise ValueError("load_program needs program")
        if self.op == ControlOp.SLEEP and self.duration_ms is None:
            raise ValueError("sleep needs duration_ms")

    @classmethod
    def set_period(cls, sensor_id: str, period_ms: float, *, seq: int = 0) -> Control:
        return cls(sensor_id=sensor_id, seq=seq, op=ControlOp.SET_PERIOD, period_ms=period_ms)

    @classmethod
    def load_program(
        cls, sensor_id: str, program: str, params: dict[str, Param] | None = None, *, seq: int = 0
    ) -> Control:
        return cls(
            sensor_id=sensor_id,
            seq=seq,
            op=ControlOp.LOAD_PROGRAM,
            program=program,
            params=dict(params or {}),
        )

    @classmethod
    def sleep(cls, sensor_id: str, duration_ms: float, *, seq: int = 0) -> Control:
        return cls(sensor_id=sensor_id, seq=seq, op=ControlOp.SLEEP, duration_ms=duration_ms)

    @classmethod
    def wake(cls, sensor_id: str, *, seq: int = 0) -> Control:
        return cls(sensor_id=sensor_id, seq=seq, op=ControlOp.WAKE)

    @classmethod
    def hello_request(cls, sensor_id: str, *, seq: int = 0) -> Control:
        return cls(sensor_id=sensor_id, seq=seq, op=ControlOp.HELLO)


class Ack(_Base, frozen=True, array_like=True, kw_only=True):
    """Mote to gateway: the control message `ack_seq` was applied (ok) or refused (error)."""

    kind: ClassVar[str] = "ack"
    ack_seq: Seq
    ok: bool = True
    error: str = ""


class Status(_Base, frozen=True, array_like=True, kw_only=True):
    """Online/offline; over MQTT the offline one is the mote's last will."""

    kind: ClassVar[str] = "status"
    online: bool
    battery: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    reason: str = ""


Message = Hello | Samples | Events | AggregateReport | Listen | Control | Ack | Status

KINDS: dict[str, type[Message]] = {
    cls.kind: cls for cls in (Hello, Samples, Events, AggregateReport, Listen, Control, Ack, Status)
}
#: Kinds that carry readings (and may piggyback `listen_ms`).
DATA_KINDS = frozenset({"samples", "events", "aggregate"})


class _Envelope(msgspec.Struct, array_like=True):
    version: int
    kind: str
    body: msgspec.Raw


_encoder = msgspec.msgpack.Encoder()
_envelope_decoder = msgspec.msgpack.Decoder(_Envelope)
_decoders = {kind: msgspec.msgpack.Decoder(cls) for kind, cls in KINDS.items()}
_PATH = re.compile(r"`\$\[(\d+)\]")


def encode_message(msg: Message) -> bytes:
    """The message's bytes: ``[version, kind, [fields...]]`` in msgpack."""
    kind = getattr(type(msg), "kind", None)
    if kind not in KINDS or not isinstance(msg, KINDS[kind]):
        raise TypeError(f"not a protocol message: {type(msg).__name__}")
    if isinstance(msg, Listen) and msg.time is None:
        # Three fields, as a reader that does not know `time` expects (msgspec would add a nil).
        body = (msg.sensor_id, msg.seq, msg.duration_ms)
        return _encoder.encode((PROTOCOL_VERSION, kind, body))
    return _encoder.encode((PROTOCOL_VERSION, kind, msg))


def decode_message(
    data: bytes | bytearray | memoryview, *, max_bytes: int = MAX_MESSAGE_BYTES
) -> Message:
    """Parse one message; raises ProtocolError (never anything else) on bad input."""
    if len(data) > max_bytes:
        raise ProtocolError(f"message of {len(data)} bytes exceeds the limit of {max_bytes}")
    try:
        env = _envelope_decoder.decode(data)
    except (msgspec.DecodeError, ValueError) as exc:  # ValueError: e.g. invalid UTF-8
        raise ProtocolError(f"not a message envelope [version, kind, body]: {exc}") from None
    except RecursionError:
        # msgspec skips the raw body recursively (checked with Py_EnterRecursiveCall, so this
        # is a clean exception, not a crash); no valid message nests more than a few levels.
        raise ProtocolError("message nested too deeply") from None
    if env.version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"unsupported protocol version {env.version} (this side speaks {PROTOCOL_VERSION})"
        )
    decoder = _decoders.get(env.kind)
    if decoder is None:
        raise ProtocolError(f"unknown message kind {env.kind!r} (known: {', '.join(KINDS)})")
    try:
        return decoder.decode(env.body)
    except (msgspec.DecodeError, ValueError) as exc:
        raise ProtocolError(
            f"bad {env.kind!r} message: {_name_fields(str(exc), env.kind)}"
        ) from None
    except RecursionError:  # unreachable with bounded field types; kept as a guarantee
        raise ProtocolError(f"bad {env.kind!r} message: nested too deeply") from None


def _name_fields(error: str, kind: str) -> str:
    """msgspec reports positions (`$[2]`); say which field that is."""
    fields = KINDS[kind].__struct_fields__

    def name(m: re.Match[str]) -> str:
        i = int(m.group(1))
        return f"`{fields[i]}" if i < len(fields) else m.group(0)

    return _PATH.sub(name, error, count=1)
