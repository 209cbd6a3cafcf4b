"""docs/protocol.md cannot drift: every hex frame in it decodes, the gateway's ones are what
the gateway encodes, and the firmware's ones are what the AVR image sends today, sealed ones
("Sent by the AVR firmware") included."""

from __future__ import annotations

import re

import pytest
from firmware_sim.loop import Image

from sensors.framing import FrameDecoder, encode_frame
from sensors.protocol import Control, Message
from tests.firmware_sim.test_loop import run
from tests.sensors.test_auth_doc import firmware_vectors
from tests.support import ROOT

DOC = ROOT / "docs" / "protocol.md"
BLOCK = re.compile(r"```frame (firmware|gateway)\n(.*?)```", re.S)
#: The scenario the firmware examples come from (see "Examples" in the document).
VALUES = [64.4, 61.0, 12.5, 70.0, 30.0, 40.0]
CONTROLS = [
    Control.load_program("773869", "aggregate", {"window_ms": 600000}, seq=41),
    Control.load_program("773869", "nosuch", seq=42),
]
ATTRIBUTES = {"station": "773869", "segment": "S21"}
#: A second scenario: put to sleep in its first window (the asleep listen example).
ASLEEP = [Control.sleep("773869", 600000, seq=43)]


def examples() -> list[tuple[str, bytes]]:
    return [(who, bytes.fromhex(text)) for who, text in BLOCK.findall(DOC.read_text())]


def decode_one(frame: bytes) -> Message:
    dec = FrameDecoder()
    items = dec.feed(frame)
    assert len(items) == 1 and isinstance(items[0], Message.__args__), (frame.hex(" "), items)  # type: ignore[attr-defined]
    return items[0]


def test_every_example_decodes_and_gateway_frames_are_what_it_encodes() -> None:
    found = examples()
    assert len([w for w, _ in found if w == "firmware"]) >= 8
    assert len([w for w, _ in found if w == "gateway"]) >= 6
    kinds = set()
    for who, frame in found:
        msg = decode_one(frame)
        kinds.add(type(msg).__name__)
        if who == "gateway":
            assert isinstance(msg, Control)
            assert encode_frame(msg) == frame
    assert {"Hello", "Samples", "Ack", "Listen", "AggregateReport", "Status", "Control"} <= kinds


@pytest.mark.needs_avr
@pytest.mark.timeout(60)
async def test_firmware_examples_are_what_the_firmware_sends(image: Image) -> None:
    _, _, wire = await run(image, VALUES, CONTROLS, attributes=ATTRIBUTES)
    _, _, asleep = await run(image, VALUES, ASLEEP, attributes=ATTRIBUTES)
    sent = {b"\x00" + f + b"\x00" for f in (wire + asleep).split(b"\x00") if f}
    for who, frame in examples():
        if who == "firmware":
            assert frame in sent, (
                f"docs/protocol.md shows {frame.hex(' ')}, which the firmware no longer sends; "
                "it now sends:\n" + "\n".join(sorted(f.hex(" ") for f in sent))
            )


#: The scenario of the sealed firmware examples ("Sent by the AVR firmware").
SEALED = {"sensor_id": "S1", "start_ms": 1_700_000_000_000, "key": bytes(range(16))}


@pytest.mark.needs_avr
@pytest.mark.timeout(60)
async def test_sealed_firmware_examples_are_what_the_firmware_sends(image: Image) -> None:
    vectors = firmware_vectors()
    assert len(vectors) >= 2
    _, stats, wire = await run(image, [64.5], **SEALED)  # type: ignore[arg-type]
    sent = {b"\x00" + f + b"\x00" for f in wire.split(b"\x00") if f}
    for v in vectors:
        assert bytes.fromhex(v["key"]) == SEALED["key"]
        frame = bytes.fromhex(v["frame"].replace(" ", ""))
        assert frame in sent, (
            f"docs/protocol.md shows {frame.hex(' ')}, which the firmware no longer sends; "
            "it now sends:\n" + "\n".join(sorted(f.hex(" ") for f in sent))
        )
    assert stats["rejected"] == {"unsigned": 0, "bad_mac": 0, "replay": 0}
