"""The AVR protocol image in simavr: its frames are the gateway's protocol, byte for byte.

Every frame the firmware sends must decode with sensors.framing/protocol (none dropped), and
the controls the gateway encodes must be accepted and acknowledged by the firmware; pushdown,
rate changes, sleep and wake are checked on the firmware's own output.
"""

from __future__ import annotations

import itertools

import pytest
from firmware_sim.loop import FirmwareMote, Image, MoteConfig, to_counts

from sensors.framing import FrameDecoder, encode_frame, frame_payload
from sensors.protocol import (
    Ack,
    AggregateReport,
    Control,
    Hello,
    Listen,
    Message,
    Samples,
    Status,
)

pytestmark = [pytest.mark.needs_avr, pytest.mark.timeout(120)]

START_MS = 1_330_588_800_000
PERIOD_MS = 300_000


def config(**kw: object) -> MoteConfig:
    base = {
        "sensor_id": "773869",
        "period_ms": PERIOD_MS,
        "start_ms": START_MS,
        "field": "speed",
        "scale": 10.0,
        "listen_every_ms": PERIOD_MS,
        "attributes": {"station": "773869", "latitude": 34.15497, "segment": "S21"},
    }
    base.update(kw)
    return MoteConfig(**base)  # type: ignore[arg-type]


async def run(
    image: Image, values: list[float], controls: list[Control] = (), **kw: object
) -> tuple[list[Message], dict, bytes]:
    """Run one mote on `values` with `controls` in its receiver at boot (preloaded: they reach
    its first window on a loaded machine too)."""
    dec = FrameDecoder()
    wire = bytearray()
    out: list[Message] = []
    preload = b"".join(encode_frame(c) for c in controls)
    async with FirmwareMote(
        config(**kw),
        to_counts(values, 10.0),
        PERIOD_MS,
        image=image,
        window_wall_ms=20,
        preload=preload,
    ) as mote:
        while data := await mote.read():
            wire += data
            for item in dec.feed(data):
                assert isinstance(item, Message.__args__), item  # type: ignore[attr-defined]
                out.append(item)
        stats = await mote.wait()
    assert dec.stats.frames_dropped == 0
    return out, stats, bytes(wire)


async def test_hello_samples_and_status_decode_exactly(image: Image) -> None:
    values = [64.4, 61.0, 12.5, 70.0]
    msgs, stats, wire = await run(image, values)
    hello = msgs[0]
    assert isinstance(hello, Hello)
    assert hello.sensor_id == "773869" and hello.schema == (("speed", "float"),)
    assert hello.programs == ("aggregate", "count", "deadband", "filter", "raw", "vehicle")
    assert hello.program == "raw" and hello.sample_period_ms == PERIOD_MS
    assert hello.attributes == {"station": "773869", "latitude": 34.15497, "segment": "S21"}
    samples = [m for m in msgs if isinstance(m, Samples)]
    times = [t for m in samples for t in m.times]
    rows = [r[0] for m in samples for r in m.rows]
    assert times == [START_MS / 1000 + i * PERIOD_MS / 1000 for i in range(len(values))]
    assert rows == pytest.approx(values, abs=1e-5)
    assert isinstance(msgs[-1], Status) and msgs[-1].online is False
    seqs = [m.seq for m in msgs]
    assert seqs == list(range(len(msgs)))
    # Byte-exact: every frame re-encodes to the same bytes the firmware sent.
    frames = [f for f in wire.split(b"\x00") if f]
    assert len(frames) == len(msgs)
    assert stats["conversions"] == len(values) and stats["tx_bytes"] == len(wire)


async def test_controls_from_the_gateway_are_applied_and_acknowledged(image: Image) -> None:
    values = [60.0, 61.0, 20.0, 62.0, 10.0, 63.0, 15.0, 30.0]
    controls = [
        Control.load_program("773869", "filter", {"ranges": [[None, 20.0]]}, seq=41),
        Control.load_program("other", "raw", seq=42),  # for another mote: ignored
        Control.load_program("773869", "nosuch", seq=43),
        Control.hello_request("773869", seq=44),
    ]
    msgs, stats, _ = await run(image, values, controls)
    acks = [m for m in msgs if isinstance(m, Ack)]
    assert [(a.ack_seq, a.ok) for a in acks] == [(41, True), (43, False)]
    assert acks[1].error == "unknown program"
    hellos = [m for m in msgs if isinstance(m, Hello)]
    assert [h.program for h in hellos] == ["raw", "filter"]
    after = msgs.index(acks[0])
    passed = [r[0] for m in msgs[after:] if isinstance(m, Samples) for r in m.rows]
    # The filter pushdown, seen on the firmware's own output: only readings <= 20 after it.
    assert passed == pytest.approx([20.0, 10.0, 15.0])
    assert stats["rx_bytes"] == sum(len(encode_frame(c)) for c in controls)


async def test_set_period_sleep_and_wake(image: Image) -> None:
    values = [50.0 + i for i in range(24)]
    controls = [Control.set_period("773869", 2 * PERIOD_MS, seq=1)]
    msgs, _, _ = await run(image, values, controls)
    times = [t for m in msgs if isinstance(m, Samples) for t in m.times]
    assert times[2] - times[1] == 2 * PERIOD_MS / 1000  # sub-samples the trace from then on
    rows = [r[0] for m in msgs if isinstance(m, Samples) for r in m.rows]
    assert rows[1:4] == pytest.approx([51.0, 53.0, 55.0])

    # Asleep until woken, a receive window every six periods meanwhile: no conversion, only
    # bare listens, until the end of the trace.
    controls = [Control.sleep("773869", 6 * PERIOD_MS, seq=5)]
    msgs, stats, _ = await run(image, values, controls)
    (ack,) = [m for m in msgs if isinstance(m, Ack)]
    assert ack.ok and ack.ack_seq == 5
    after = msgs[msgs.index(ack) + 1 :]
    assert not [m for m in after if isinstance(m, Samples)]
    assert sum(isinstance(m, Listen) for m in after) >= 2
    assert stats["conversions"] < 6
    # Asleep, each listen carries the mote's clock (a heartbeat for the gateway's progress):
    # six periods apart, after the last reading it sent.
    asleep = [m.time for m in after if isinstance(m, Listen)]
    last = max(t for m in msgs if isinstance(m, Samples) for t in m.times)
    assert None not in asleep and asleep[0] > last
    gaps = [b - a for a, b in itertools.pairwise(asleep)]
    assert gaps == [6 * PERIOD_MS / 1000] * (len(asleep) - 1)

    # Woken (here: in the same first window, right after the sleep): sampling goes on.
    controls = [
        Control.sleep("773869", 6 * PERIOD_MS, seq=5),
        Control.wake("773869", seq=6),
    ]
    msgs, stats, _ = await run(image, values[:12], controls)
    assert [m.ack_seq for m in msgs if isinstance(m, Ack)] == [5, 6]
    assert stats["conversions"] >= 10


async def test_aggregate_and_deadband_params(image: Image) -> None:
    values = [float(v) for v in (10, 20, 30, 40, 50, 60, 70)]
    controls = [Control.load_program("773869", "aggregate", {"window_ms": 3 * PERIOD_MS}, seq=9)]
    msgs, _, _ = await run(image, values, controls)
    aggs = [m for m in msgs if isinstance(m, AggregateReport)]
    # Loaded in the window after the second reading: windows lie on multiples of 900 s of the
    # mote clock (as the gateway's do), so the first is the rest of the one in progress
    # (reading 3 alone), then readings 4 to 6.
    assert len(aggs) >= 2
    short, first = aggs[0], aggs[1]
    assert (short.start, short.end) == (
        (START_MS + 2 * PERIOD_MS) / 1000,
        (START_MS + 900_000) / 1000,
    )
    assert short.values == {"sum": 30, "count": 1, "min": 30, "max": 30}
    assert first.values["count"] == 3
    assert first.end - first.start == 3 * PERIOD_MS / 1000
    assert first.start == (START_MS + 3 * PERIOD_MS) / 1000
    assert first.start % 900 == 0
    assert first.values["sum"] == pytest.approx(40 + 50 + 60)
    assert (first.values["min"], first.values["max"]) == pytest.approx((40, 60))

    bad = [Control.load_program("773869", "deadband", {"bogus": 1}, seq=10)]
    msgs, _, _ = await run(image, values[:3], bad)
    (ack,) = [m for m in msgs if isinstance(m, Ack)]
    assert not ack.ok and "parameter" in ack.error


async def test_garbage_before_a_control_is_skipped(image: Image) -> None:
    junk = b"\x00\x05\x01\x02\x03\x04\x00" + frame_payload(b"\x93\x02\xa7control\x90")
    good = Control.wake("773869", seq=3)

    async def go() -> list[Message]:
        dec = FrameDecoder()
        out = []
        async with FirmwareMote(
            config(),
            to_counts([1.0, 2.0, 3.0], 10.0),
            PERIOD_MS,
            image=image,
            window_wall_ms=20,
            preload=junk + encode_frame(good),
        ) as mote:
            while data := await mote.read():
                out += dec.feed(data)
            await mote.wait()
        return out

    msgs = await go()
    acks = [m for m in msgs if isinstance(m, Ack)]
    assert [(a.ack_seq, a.ok) for a in acks] == [(3, True)]


async def test_fleet_through_the_real_serial_transport(image: Image) -> None:
    """Two firmware motes behind the pty base station; the gateway's SerialTransport unchanged:
    hellos and samples arrive, and a LOAD_PROGRAM filter sent by the gateway is acknowledged
    and then seen working in what that mote sends."""
    import asyncio

    from sensors.motes.firmware import FirmwareFleet
    from sensors.transports.serial import PtyBaseStation, SerialTransport

    t0 = START_MS // 1000
    trace = {
        "773869": [(t0 + 300 * i, 50.0 + 5 * (i % 6)) for i in range(40)],
        "767541": [(t0 + 300 * i, 65.0) for i in range(40)],
    }
    stations = {sid: {"latitude": 34.0, "segment": "S21"} for sid in trace}
    got: list[Message] = []
    async with PtyBaseStation(baudrate=None) as station, SerialTransport(station.path) as t:
        await t.wait_connected(10)
        fleet = FirmwareFleet(trace, stations, station, build_dir=image.elf.parent)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(fleet.run())
            async for inbound in t.messages():
                msg = inbound.message
                got.append(msg)
                if isinstance(msg, Hello) and msg.sensor_id == "773869":
                    ranges = {"ranges": [[None, 55.0]]}
                    await t.send("773869", Control.load_program("773869", "filter", ranges, seq=7))
                offline = [m for m in got if isinstance(m, Status) and not m.online]
                if len(offline) == 2:
                    break
    hellos = {m.sensor_id for m in got if isinstance(m, Hello)}
    assert hellos == {"773869", "767541"}
    acks = [m for m in got if isinstance(m, Ack)]
    assert [(a.sensor_id, a.ack_seq, a.ok) for a in acks] == [("773869", 7, True)]
    mine = [m for m in got if m.sensor_id == "773869"]
    after = [r[0] for m in mine[mine.index(acks[0]) :] if isinstance(m, Samples) for r in m.rows]
    assert after and max(after) <= 55.0
    other = [
        r[0] for m in got if isinstance(m, Samples) and m.sensor_id == "767541" for r in m.rows
    ]
    assert len(other) == 40 and set(other) == {65.0}
    assert fleet.stats.bad_frames == 0 and fleet.energy["773869"]["conversions"] == 40


async def test_energy_from_the_firmware_counts(image: Image) -> None:
    from firmware_sim.loop import measured_energy
    from firmware_sim.profiles import resolve_profile

    msgs, stats, wire = await run(image, [50.0] * 6)
    paper = resolve_profile("paper")
    account = measured_energy(stats, paper)
    assert stats["tx_frames"] == len(msgs)
    assert account.elapsed_s == pytest.approx(6 * PERIOD_MS / 1000, abs=0.1)  # + the shutdown
    assert account.joules["radio"] == pytest.approx(len(wire) * 8 * paper.tx_joules_per_bit)
    assert account.joules["adc"] == pytest.approx(6 * paper.adc_joules)
    assert account.joules["listen"] == pytest.approx(stats["listen_s"] * paper.rx_mw / 1000)
    assert stats["listen_s"] == pytest.approx(stats["windows"] * 0.020, rel=0.05)
    assert account.joules["cpu"] == pytest.approx(stats["awake_cycles"] * paper.joules_per_cycle)


async def test_boot_program_and_params_from_eeprom(image: Image) -> None:
    msgs, _, _ = await run(
        image, [10.0, 30.0, 15.0, 50.0], program="filter", params={"ranges": [[None, 20]]}
    )
    assert isinstance(msgs[0], Hello) and msgs[0].program == "filter"
    rows = [r[0] for m in msgs if isinstance(m, Samples) for r in m.rows]
    assert rows == pytest.approx([10.0, 15.0])
    msgs, _, _ = await run(image, [10.0, 30.0], program="deadband")  # no epsilon: refused
    assert isinstance(msgs[0], Hello) and msgs[0].program == "raw"


async def test_fractional_times_are_the_nearest_float64(image: Image) -> None:
    start = START_MS + 123
    dec = FrameDecoder()
    out: list[Message] = []
    async with FirmwareMote(
        config(period_ms=333, start_ms=start), [500] * 12, 333, image=image, window_wall_ms=0
    ) as mote:
        while data := await mote.read():
            out += dec.feed(data)
        await mote.wait()
    times = [t for m in out if isinstance(m, Samples) for t in m.times]
    assert times == [(start + k * 333) / 1000 for k in range(12)]


async def test_what_a_program_holds_is_sent_before_sleep_and_load_program_are_acked(
    image: Image,
) -> None:
    """As the Python motes do: a partial raw batch, aggregate window or count period goes out
    before the ack, so no reading is lost or sent behind the asleep mote's clock."""
    values = [50.0 + i for i in range(12)]
    t = [START_MS / 1000 + i * PERIOD_MS / 1000 for i in range(len(values))]

    def before_ack(msgs: list[Message]) -> tuple[list[Message], Ack]:
        (ack,) = [m for m in msgs if isinstance(m, Ack)]
        assert ack.ok, ack
        return msgs[: msgs.index(ack)], ack

    # raw, 8 readings a message: the first window comes before a batch is full.
    sleep = [Control.sleep("773869", 6 * PERIOD_MS, seq=5)]
    msgs, stats, _ = await run(image, values, sleep, program="raw", params={"batch": 8})
    before, ack = before_ack(msgs)
    sent = [m for m in before if isinstance(m, Samples)]
    assert sent and sent[-1].listen_ms is None  # the flush opens no window of its own
    times = [x for m in sent for x in m.times]
    rows = [r[0] for m in sent for r in m.rows]
    assert 0 < len(times) < 8 and times == t[: len(times)]
    assert rows == pytest.approx(values[: len(rows)])
    assert stats["conversions"] == len(times)  # every reading taken was sent
    after = msgs[msgs.index(ack) + 1 :]
    assert not [m for m in after if isinstance(m, Samples)]
    asleep = [m.time for m in after if isinstance(m, Listen)]
    assert asleep and asleep[0] > times[-1]

    # load_program: the old program's readings first, then the ack, then the new program's.
    load = [Control.load_program("773869", "filter", {"ranges": [[None, 55.0]]}, seq=6)]
    msgs, _, _ = await run(image, values, load, program="raw", params={"batch": 8})
    before, ack = before_ack(msgs)
    held = [x for m in before if isinstance(m, Samples) for x in m.times]
    assert 0 < len(held) < 8 and held == t[: len(held)]
    later = [r[0] for m in msgs[msgs.index(ack) :] if isinstance(m, Samples) for r in m.rows]
    assert later == pytest.approx([v for v in values[len(held) :] if v <= 55.0])

    # aggregate: the window in progress, from its first reading to the one after its last.
    window = {"window_ms": 4 * PERIOD_MS}
    msgs, _, _ = await run(image, values, sleep, program="aggregate", params=window)
    before, _ = before_ack(msgs)
    aggs = [m for m in before if isinstance(m, AggregateReport)]
    assert aggs and aggs[-1].listen_ms is None
    part = aggs[-1]
    n = part.values["count"]
    assert 0 < n < 4 and part.end - part.start == n * PERIOD_MS / 1000
    k = round((part.start - t[0]) / (PERIOD_MS / 1000))
    assert part.values["sum"] == pytest.approx(sum(values[k : k + n]))
    assert (part.values["min"], part.values["max"]) == pytest.approx((values[k], values[k + n - 1]))

    # count: the period in progress, with its own length.
    msgs, _, _ = await run(
        image, values, sleep, program="count", params={"period_ms": 4 * PERIOD_MS}
    )
    before, _ = before_ack(msgs)
    counts = [m for m in before if isinstance(m, AggregateReport)]
    assert counts and "count" in counts[-1].values
    assert 0 < counts[-1].end - counts[-1].start < 4 * PERIOD_MS / 1000
    assert counts[-1].start == t[0] + 4 * PERIOD_MS / 1000 * (len(counts) - 1)
