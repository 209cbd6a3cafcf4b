"""COBS + CRC16 framing: never raises, resynchronises, loses only damaged frames."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from sensors.framing import FrameDecoder, FrameError, crc16, encode_frame, frame_payload
from sensors.protocol import Samples, encode_message
from tests.sensors.strategies import messages


def msg(i: int) -> Samples:
    return Samples(sensor_id=f"m{i % 3}", seq=i, times=(i * 0.01,), rows=((float(i),),))


def only_messages(items: list) -> list:
    return [x for x in items if not isinstance(x, FrameError)]


def test_crc16_is_ccitt_false() -> None:
    assert crc16(b"123456789") == 0x29B1


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=600), st.integers(1, 64))
def test_decoder_never_raises(data: bytes, chunk: int) -> None:
    dec = FrameDecoder(max_frame=256)
    for i in range(0, len(data), chunk):
        for item in dec.feed(data[i : i + chunk]):
            assert isinstance(item, FrameError) or hasattr(item, "kind")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=600), messages, st.integers(1, 50))
def test_garbage_never_costs_the_next_good_frame(garbage: bytes, m, chunk: int) -> None:
    dec = FrameDecoder(max_frame=512)
    stream = garbage + encode_frame(m)
    got = []
    for i in range(0, len(stream), chunk):
        got += only_messages(dec.feed(stream[i : i + chunk]))
    assert got and got[-1] == m


@settings(max_examples=100, deadline=None)
@given(st.lists(messages, max_size=10), st.integers(1, 40))
def test_any_chunking_gives_the_same_messages(ms, chunk: int) -> None:
    stream = b"".join(encode_frame(m) for m in ms)
    dec = FrameDecoder()
    got = []
    for i in range(0, len(stream), chunk):
        got += dec.feed(stream[i : i + chunk])
    assert got == ms
    assert dec.stats.frames_ok == len(ms) and dec.stats.frames_dropped == 0


def test_each_kind_of_damage_is_counted() -> None:
    dec = FrameDecoder(max_frame=64)
    good = encode_frame(msg(1))
    bad_crc = bytearray(good)
    bad_crc[5] ^= 0x01 if bad_crc[5] != 0x01 else 0x02
    not_a_message = frame_payload(b"\xc1")
    stream = bytes(bad_crc) + b"\x00\x05\x00" + not_a_message + b"\x01" * 200 + good
    items = dec.feed(stream)
    reasons = [x.reason for x in items if isinstance(x, FrameError)]
    assert set(reasons) >= {"crc", "protocol", "oversize"}
    assert only_messages(items) == [msg(1)]
    assert dec.stats.frames_dropped == len(reasons)


def test_one_percent_garbled_bytes_lose_only_damaged_frames() -> None:
    rng = random.Random(7)
    frames = [encode_frame(msg(i)) for i in range(3000)]
    damaged = set()
    wire = bytearray()
    for i, f in enumerate(frames):
        b = bytearray(f)
        for j in range(len(b)):
            if rng.random() < 0.01:
                b[j] ^= rng.randrange(1, 256)
                damaged.add(i)
        wire += b
    dec = FrameDecoder()
    got = only_messages(dec.feed(bytes(wire)))
    seqs = [m.seq for m in got]
    assert set(seqs) == set(range(3000)) - damaged  # every undamaged frame, nothing invented
    assert seqs == sorted(seqs)
    assert dec.stats.frames_dropped > 0
    assert len(damaged) > 100


def test_frame_payload_has_no_zero_inside() -> None:
    f = frame_payload(encode_message(msg(0)) + b"\x00\x00")
    assert f[0] == 0 and f[-1] == 0 and 0 not in f[1:-1]


# -- hostile frames: a bad frame never costs the good frames of the same chunk -----------------


def test_a_deeply_nested_frame_between_good_ones_keeps_them() -> None:
    deep = b"\x93\x01\xa7samples" + b"\x91" * 2000 + b"\x01"
    dec = FrameDecoder(max_frame=8192)
    chunk = encode_frame(msg(1)) + frame_payload(deep) + encode_frame(msg(2))
    items = dec.feed(chunk)
    assert only_messages(items) == [msg(1), msg(2)]
    assert [x.reason for x in items if isinstance(x, FrameError)] == ["protocol"]
    assert dec.stats.bad_message == 1 and dec.stats.frames_ok == 2


@st.composite
def hostile_payloads(draw: st.DrawFn) -> bytes:
    """Framed (valid CRC) msgpack that is deep, wide or oversized, so it reaches the decoder."""
    header = draw(st.sampled_from([b"\x91", b"\x81\xa1k", b"\xdc\xff\xff"]))
    prefix = draw(st.sampled_from([b"", b"\x93\x01\xa7samples", b"\x93\x01\xa7control"]))
    return prefix + header * draw(st.integers(0, 3000)) + draw(st.binary(max_size=10))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(messages, hostile_payloads()), max_size=8), st.integers(1, 4096))
def test_hostile_frames_among_good_ones_lose_only_themselves(items, chunk: int) -> None:
    dec = FrameDecoder(max_frame=2048)
    stream = b"".join(frame_payload(x) if isinstance(x, bytes) else encode_frame(x) for x in items)
    got = []
    for i in range(0, len(stream), chunk):
        got += only_messages(dec.feed(stream[i : i + chunk]))
    good = [x for x in items if not isinstance(x, bytes) and len(encode_frame(x)) < 2048]
    assert [m for m in got if m in good] == good
