"""The cost model's frame sizes (firmware_sim.wire) equal the gateway's own encoding of the
same messages, as the protocol image frames them (message + CRC + COBS + two delimiters)."""

from __future__ import annotations

import pytest
from firmware_sim import wire

from sensors.protocol import AggregateReport, Events, Hello, Listen, Samples, Status, encode_message

EPOCH = wire.EPOCH_S


def on_air(msg: object) -> int:
    return len(encode_message(msg)) + wire.FRAMING  # type: ignore[arg-type]


@pytest.mark.parametrize("sensor_id", ["calib", "loop-pair-upstream-0001", "x" * 32])
@pytest.mark.parametrize("seq", [5, 200, 40_000])
@pytest.mark.parametrize("listen", [None, 20])
def test_data_frames_match_the_encoder(sensor_id: str, seq: int, listen: int | None) -> None:
    mote = wire.Mote(sensor_id=sensor_id, seq_bytes=wire.uint_bytes(seq), listen_ms=20)
    whole, frac = EPOCH + 7, EPOCH + 7.25  # whole seconds go as integers
    raw = Samples(
        sensor_id=sensor_id,
        seq=seq,
        times=(whole, frac, frac),
        rows=((800,), (200,), (100,)),
        listen_ms=listen,
    )
    # mean sizes: 1/3 of the times whole, readings of 3, 2 and 1 bytes
    assert on_air(raw) == pytest.approx(wire.samples(mote, 3, 1 / 3, 2.0))
    ev = Events(
        sensor_id=sensor_id, seq=seq, name="upstream", times=((whole, frac),), listen_ms=listen
    )
    assert on_air(ev) == pytest.approx(wire.events(mote, "upstream", 0.5))
    count = AggregateReport(
        sensor_id=sensor_id,
        seq=seq,
        start=whole,
        end=whole + 1,
        values={"count": 3},
        listen_ms=listen,
    )
    assert on_air(count) == wire.count_aggregate(mote, 1.0, 3)
    part = AggregateReport(
        sensor_id=sensor_id,
        seq=seq,
        start=whole,
        end=frac,
        values={"sum": 40_000, "count": 50, "min": 130, "max": 900},
        listen_ms=listen,
    )
    assert on_air(part) == pytest.approx(wire.partial_aggregate(mote, 0.5, 50, 2.5, 3))
    bare = Listen(sensor_id=sensor_id, seq=seq, duration_ms=20)
    assert on_air(bare) == wire.listen(mote)


def test_hello_and_status_match_the_encoder() -> None:
    mote = wire.Mote(sensor_id="calib", seq_bytes=1)
    hello = Hello(
        sensor_id="calib",
        seq=0,
        schema=(("value", "float"),),
        programs=wire.PROGRAM_NAMES,
        program="filter",
        sample_period_ms=20,
    )
    assert on_air(hello) == wire.hello(mote, "filter", 20)
    status = Status(sensor_id="calib", seq=0, online=False, reason="power failing")
    assert on_air(status) == wire.status(mote)


def test_float_readings_when_scaled() -> None:
    mote = wire.Mote(sensor_id="s", seq_bytes=1, scale=10.0)
    msg = Samples(sensor_id="s", seq=1, times=(EPOCH + 0.5,), rows=((12.5,),))
    # msgspec writes float64; the firmware float32: 4 bytes fewer per reading
    assert on_air(msg) - 4 == wire.samples(mote, 1, 0.0, 3)


def test_mean_uint_bytes() -> None:
    assert wire.mean_uint_bytes(0, 128) == 1
    assert wire.mean_uint_bytes(0, 256) == 1.5
    assert wire.mean_uint_bytes(250, 10) == (6 * 2 + 4 * 3) / 10
