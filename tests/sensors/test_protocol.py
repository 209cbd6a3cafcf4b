"""The wire protocol: round trips for every kind, and clear errors for everything else."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sensors.protocol import (
    KINDS,
    PROTOCOL_VERSION,
    Control,
    Listen,
    ProtocolError,
    Samples,
    decode_message,
    encode_message,
)
from tests.sensors.strategies import ALL, messages


def test_every_kind_has_a_strategy() -> None:
    assert set(ALL) == set(KINDS)


@pytest.mark.parametrize("kind", sorted(ALL))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_round_trip(kind: str, data: st.DataObject) -> None:
    msg = data.draw(ALL[kind])
    assert decode_message(encode_message(msg)) == msg


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_protocol_error(data: bytes) -> None:
    try:
        decode_message(data)
    except ProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(messages, st.data())
def test_truncated_or_flipped_messages_raise_only_protocol_error(msg, data) -> None:
    raw = bytearray(encode_message(msg))
    cut = data.draw(st.integers(0, len(raw)))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    for candidate in (bytes(raw[:cut]), bytes(raw)):
        try:
            decode_message(candidate)
        except ProtocolError:
            pass


def enc(obj: object) -> bytes:
    return msgspec.msgpack.encode(obj)


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b"\xc1", "not a message envelope"),
        (enc([PROTOCOL_VERSION + 1, "samples", []]), "unsupported protocol version"),
        (enc([PROTOCOL_VERSION, "teleport", []]), "unknown message kind 'teleport'"),
        (enc([PROTOCOL_VERSION, "samples", ["s", 1, [1.0, 2.0], [[1]]]]), "2 times but 1 rows"),
        (enc([PROTOCOL_VERSION, "samples", ["s", -1, [], []]]), "at `seq`"),
        (enc([PROTOCOL_VERSION, "samples", ["s", 1, ["x"], [[1]]]]), "at `times[0]`"),
        (enc([PROTOCOL_VERSION, "control", ["s", 1, "explode"]]), "at `op`"),
        (enc([PROTOCOL_VERSION, "control", ["s", 1, "set_period"]]), "set_period needs period_ms"),
        (enc([PROTOCOL_VERSION, "aggregate", ["s", 1, 5.0, 1.0, {}]]), "before its start"),
    ],
)
def test_bad_messages_name_the_problem(payload: bytes, expected: str) -> None:
    with pytest.raises(ProtocolError, match=None) as info:
        decode_message(payload)
    assert expected in str(info.value)


def test_envelope_is_small_and_versioned() -> None:
    msg = Samples(sensor_id="a", seq=1, times=(0.5,), rows=((1.0,),))
    raw = encode_message(msg)
    assert msgspec.msgpack.decode(raw)[:2] == [PROTOCOL_VERSION, "samples"]
    assert len(raw) < 40


def test_control_constructors_validate() -> None:
    with pytest.raises(ValueError):
        Control(sensor_id="a", op="sleep")  # type: ignore[arg-type]
    assert Control.load_program("a", "count", {"period_ms": 500}).params == {"period_ms": 500}


def test_encode_rejects_non_messages() -> None:
    with pytest.raises(TypeError):
        encode_message({"kind": "samples"})  # type: ignore[arg-type]


# -- hostile nesting and sizes: only ProtocolError, whatever the depth or size -----------------


def nested(depth: int, leaf: bytes = b"\x01", header: bytes = b"\x91") -> bytes:
    """msgpack for `depth` one-element arrays (or maps, with header b"\\x81" and a key) around a leaf."""
    return header * depth + leaf


def envelope(kind: str, body: bytes) -> bytes:
    """`[version, kind, body]` with `body` given as raw msgpack."""
    return b"\x93" + enc([PROTOCOL_VERSION, kind])[1:] + body


@pytest.mark.parametrize("depth", [100, 999, 2_000, 100_000])
@pytest.mark.parametrize("kind", ["samples", "hello", "control", "teleport"])
def test_deep_nesting_is_a_protocol_error(depth: int, kind: str) -> None:
    deep = nested(depth)
    for payload in (
        deep,  # the envelope itself
        envelope(kind, deep),  # the body
        envelope(kind, b"\x94\xa1s\x00" + deep + b"\x90"),  # a field inside the body
        # a program parameter (the one field whose values are lists)
        envelope("control", b"\x96\xa1s\x00\xacload_program\xc0\xa1p\x81\xa1a" + deep),
    ):
        with pytest.raises(ProtocolError):
            decode_message(payload)


def test_parameters_nest_two_levels_at_most() -> None:
    ok = Control.load_program("s", "filter", {"ranges": [[None, 299], [820, None]]})
    assert decode_message(encode_message(ok)) == ok
    three = enc([PROTOCOL_VERSION, "control", ["s", 0, "load_program", None, "f", {"r": [[[1]]]}]])
    with pytest.raises(ProtocolError, match="params"):
        decode_message(three)


def test_oversized_messages_are_refused_before_decoding() -> None:
    big = Samples(sensor_id="a", seq=1, times=(0.5,) * 5000, rows=((1.0,),) * 5000)
    raw = encode_message(big)
    assert decode_message(raw) == big
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        decode_message(raw, max_bytes=len(raw) - 1)


def _hostile_msgpack() -> st.SearchStrategy[bytes]:
    """Valid and broken msgpack with deep nesting (arrays and maps) and large containers."""
    headers = st.sampled_from([b"\x91", b"\x81\xa1k", b"\xdc\xff\xff", b"\xdd\xff\xff\xff\xff"])
    return st.builds(
        lambda prefix, hs, n, tail: prefix + b"".join(hs) * n + tail,
        st.sampled_from(
            [b"", b"\x93\x01\xa7samples", b"\x93\x01\xa7control", b"\x93\x01\xa5hello"]
        ),
        st.lists(headers, min_size=1, max_size=3),
        st.integers(0, 3_000),
        st.binary(max_size=20),
    )


@settings(max_examples=300, deadline=None)
@given(_hostile_msgpack())
def test_hostile_msgpack_raises_only_protocol_error(data: bytes) -> None:
    try:
        decode_message(data)
    except ProtocolError:
        pass


@settings(max_examples=100, deadline=None)
@given(messages, st.integers(0, 2_000), st.sampled_from([b"\x91", b"\x81\xa1k"]))
def test_a_valid_message_with_a_deep_tail_raises_only_protocol_error(msg, depth, header) -> None:
    raw = encode_message(msg)
    for payload in (raw[:-1] + header * depth + raw[-1:], raw + header * depth):
        try:
            decode_message(payload)
        except ProtocolError:
            pass


def test_a_listen_carries_the_motes_clock_and_a_listen_without_it_still_decodes() -> None:
    timed = Listen(sensor_id="s1", seq=7, duration_ms=20.0, time=1_330_588_800.0)
    raw = encode_message(timed)
    assert msgspec.msgpack.decode(raw) == [1, "listen", ["s1", 7, 20.0, 1_330_588_800.0]]
    assert decode_message(raw) == timed
    # A listen without the trailing `time` (a mote that does not send its clock) decodes...
    old = msgspec.msgpack.encode([1, "listen", ["s1", 7, 20.0]])
    assert decode_message(old) == Listen(sensor_id="s1", seq=7, duration_ms=20.0)
    assert decode_message(old).time is None
    # ... and one without a time is encoded as those three fields exactly (no trailing nil).
    assert encode_message(Listen(sensor_id="s1", seq=7, duration_ms=20.0)) == old

    # A reader that knows three fields skips the trailing one.
    class OldListen(msgspec.Struct, array_like=True):
        sensor_id: str
        seq: int
        duration_ms: float

    body = msgspec.msgpack.decode(raw)[2]
    assert msgspec.convert(body, OldListen) == OldListen("s1", 7, 20.0)
    with pytest.raises(ProtocolError, match="time"):
        decode_message(msgspec.msgpack.encode([1, "listen", ["s1", 7, 20.0, "noon"]]))
