"""Authentication in the AVR protocol image, in simavr: sealed messages, authenticated controls.

The firmware's frames are unsealed with `sensors.auth` (the gateway's code), controls are
sealed with it; a forged, unsigned or replayed control must be ignored (neither applied nor
acknowledged) and counted by the firmware (`auth_rejected`, read by the runner), and counters
must never repeat across reboots (boot count and highest control counter in EEPROM).
"""

from __future__ import annotations

from typing import Any

import pytest
from cobs import cobs
from firmware_sim.loop import FirmwareMote, Image, MoteConfig, eeprom_counters

from sensors.auth import seal, unseal
from sensors.framing import frame_payload
from sensors.protocol import Ack, Control, Hello, Message, Samples, Status, decode_message
from sensors.protocol import encode_message as encode

pytestmark = [pytest.mark.needs_avr, pytest.mark.timeout(120)]

KEY = bytes(range(16))
SENSOR = "773869"
START_MS = 1_330_588_800_000
PERIOD_MS = 300_000


def config(key: bytes | None = KEY) -> MoteConfig:
    return MoteConfig(
        SENSOR,
        period_ms=PERIOD_MS,
        start_ms=START_MS,
        field="speed",
        scale=10.0,
        listen_every_ms=PERIOD_MS,
        attributes={"station": SENSOR},
        key=key,
    )


def payloads(wire: bytes) -> list[bytes]:
    """The messages of the firmware's frames, as it wrote them (CRC checked, then cut)."""
    from sensors.framing import crc16

    out = []
    for body in wire.split(b"\x00"):
        if body:
            raw = cobs.decode(body)
            assert crc16(raw[:-2]) == int.from_bytes(raw[-2:], "big")
            out.append(raw[:-2])
    return out


async def run(
    image: Image,
    frames: list[bytes] = (),  # type: ignore[assignment]
    *,
    values: tuple[float, ...] = (60.0, 61.0, 20.0, 62.0, 10.0),
    key: bytes | None = KEY,
    eeprom: bytes | None = None,
) -> tuple[list[bytes], dict[str, Any], bytes]:
    """Run the mote with `frames` in its receiver at boot: (its messages, stats, EEPROM)."""
    wire = bytearray()
    counts = [round(v * 10) for v in values]
    async with FirmwareMote(
        config(key),
        counts,
        PERIOD_MS,
        image=image,
        window_wall_ms=20,
        eeprom=eeprom,
        preload=b"".join(frames),
    ) as mote:
        while data := await mote.read():
            wire += data
        stats = await mote.wait()
    return payloads(bytes(wire)), stats, mote.eeprom


def opened(messages: list[bytes], key: bytes = KEY) -> list[tuple[Message, int]]:
    out = []
    for m in messages:
        inner, counter = unseal(m, key)
        out.append((decode_message(inner), counter))
    return out


def sealed_control(control: Control, counter: int, key: bytes = KEY) -> bytes:
    return frame_payload(seal(encode(control), key, counter))


async def test_every_message_is_sealed_and_unseals_with_the_key(image: Image) -> None:
    messages, stats, eeprom = await run(image)
    msgs = opened(messages)
    kinds = [type(m).__name__ for m, _ in msgs]
    assert kinds[0] == "Hello" and kinds[-1] == "Status" and "Samples" in kinds
    counters = [c for _, c in msgs]
    # Boot 1 (a freshly flashed EEPROM holds 0), then one counter per message.
    assert counters == [(1 << 32) | n for n in range(len(msgs))]
    rows = [r[0] for m, _ in msgs if isinstance(m, Samples) for r in m.rows]
    assert rows == pytest.approx([60.0, 61.0, 20.0, 62.0, 10.0], abs=1e-5)
    assert all(m[0] == 0x95 and m[-10:-8] == b"\xc4\x08" for m in messages)
    assert eeprom_counters(eeprom) == (1, None)
    assert stats["rejected"] == {"unsigned": 0, "bad_mac": 0, "replay": 0}
    with pytest.raises(ValueError, match="tag"):
        unseal(messages[0], bytes(16))  # another key: not this mote's


async def test_a_genuine_sealed_control_is_applied_and_acked(image: Image) -> None:
    control = Control.load_program(SENSOR, "filter", {"ranges": [[None, 20.0]]}, seq=41)
    messages, stats, eeprom = await run(image, [sealed_control(control, 10)])
    msgs = [m for m, _ in opened(messages)]
    acks = [m for m in msgs if isinstance(m, Ack)]
    assert [(a.ack_seq, a.ok) for a in acks] == [(41, True)]
    after = msgs.index(acks[0])
    passed = [r[0] for m in msgs[after:] if isinstance(m, Samples) for r in m.rows]
    assert passed == pytest.approx([20.0, 10.0])
    assert eeprom_counters(eeprom) == (1, 10)
    assert stats["rejected"] == {"unsigned": 0, "bad_mac": 0, "replay": 0}


async def test_forged_unsigned_and_replayed_controls_are_ignored_and_counted(
    image: Image,
) -> None:
    genuine = sealed_control(Control.set_period(SENSOR, 2 * PERIOD_MS, seq=41), 1 << 50)
    forged = bytearray(seal(encode(Control.hello_request(SENSOR, seq=42)), KEY, (1 << 50) + 1))
    forged[-1] ^= 0x01
    frames = [
        genuine,
        genuine,  # a replay of it, byte for byte
        sealed_control(Control.wake(SENSOR, seq=43), 5),  # genuine tag, old counter
        frame_payload(bytes(forged)),
        sealed_control(Control.sleep(SENSOR, 1000, seq=44), (1 << 50) + 2, key=bytes(16)),
        frame_payload(encode(Control.load_program(SENSOR, "filter", {"ranges": [[0, 1]]}, seq=45))),
        sealed_control(Control.wake("other", seq=46), 1, key=bytes(16)),  # not for this mote
    ]
    messages, stats, eeprom = await run(image, frames, values=(60.0, 61.0, 62.0, 63.0))
    msgs = [m for m, _ in opened(messages)]
    assert [(m.ack_seq, m.ok) for m in msgs if isinstance(m, Ack)] == [(41, True)]
    assert [type(m) for m in msgs].count(Hello) == 1  # the forged hello request: no answer
    times = [t for m in msgs if isinstance(m, Samples) for t in m.times]
    assert times[2] - times[1] == 2 * PERIOD_MS / 1000  # set_period applied, nothing else
    assert stats["rejected"] == {"unsigned": 1, "bad_mac": 2, "replay": 2}
    assert eeprom_counters(eeprom) == (1, 1 << 50)


async def test_counters_never_repeat_across_reboots(image: Image) -> None:
    control = sealed_control(Control.wake(SENSOR, seq=7), 1000)
    first, _, eeprom = await run(image, [control], values=(60.0, 61.0))
    second, stats, eeprom = await run(image, [control], values=(60.0, 61.0), eeprom=eeprom)
    third, _, eeprom = await run(image, values=(60.0,), eeprom=eeprom)
    boots = [[c for _, c in opened(run_)] for run_ in (first, second, third)]
    assert [{c >> 32 for c in b} for b in boots] == [{1}, {2}, {3}]
    flat = [c for b in boots for c in b]
    assert flat == sorted(set(flat))  # strictly increasing over the three boots
    # The control accepted in the first boot is a replay in the second (counter in EEPROM).
    assert not [m for m, _ in opened(second) if isinstance(m, Ack)]
    assert stats["rejected"]["replay"] == 1
    assert eeprom_counters(eeprom) == (3, 1000)


async def test_an_unprovisioned_mote_is_unauthenticated_as_before(image: Image) -> None:
    frames = [
        frame_payload(encode(Control.set_period(SENSOR, 2 * PERIOD_MS, seq=1))),
        # A sealed control reads as the plain one (the seal's elements come after the body).
        sealed_control(Control.hello_request(SENSOR, seq=2), 1),
    ]
    messages, stats, eeprom = await run(image, frames, key=None)
    assert all(m[0] == 0x93 for m in messages)
    msgs = [decode_message(m) for m in messages]
    assert [m.ack_seq for m in msgs if isinstance(m, Ack)] == [1]
    assert [type(m) for m in msgs].count(Hello) == 2
    assert isinstance(msgs[-1], Status)
    assert stats["rejected"] == {"unsigned": 0, "bad_mac": 0, "replay": 0}
    assert eeprom_counters(eeprom) == (0, None)  # nothing written


def test_a_key_must_be_16_bytes_and_not_blank() -> None:
    from firmware_sim.loop import LoopError

    with pytest.raises(LoopError, match="16 bytes"):
        MoteConfig("S1", key=b"short").eeprom()
    with pytest.raises(LoopError, match="16 bytes"):
        MoteConfig("S1", key=b"\xff" * 16).eeprom()


def test_a_fleet_puts_each_motes_key_in_its_eeprom() -> None:
    from sensors.auth import Keyring, derive_key
    from sensors.motes.firmware import FirmwareFleet

    trace = {"A": [(0.0, 1.0), (300.0, 2.0)], "B": [(0.0, 3.0), (300.0, 4.0)]}
    stations = {"A": {"segment": "S1"}, "B": {"segment": "S2"}}
    ring = Keyring(keys={"A": KEY}, master=bytes(16))
    fleet = FirmwareFleet(trace, stations, station=None, keys=ring)  # type: ignore[arg-type]
    assert fleet.configs["A"][0].key == KEY
    assert fleet.configs["B"][0].key == derive_key(bytes(16), "B")
    plain = FirmwareFleet(trace, stations, station=None)  # type: ignore[arg-type]
    assert plain.configs["A"][0].key is None
