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
