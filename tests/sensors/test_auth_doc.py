"""docs/protocol.md's authentication vectors are what the code computes: each `auth-vector`
seals to its bytes (and its tag is the HMAC a device maker would compute by hand from the
text), each `auth-derive` is the derived key, and the keys file example loads. The AVR
firmware's vectors (with the `frame` it sent) are what that firmware sends:
tests/firmware_sim/test_protocol_doc.py re-runs it."""

from __future__ import annotations

import hashlib
import hmac
import re
from pathlib import Path

from sensors.auth import derive_key, load_keys, seal, unseal
from sensors.framing import FrameDecoder, frame_payload
from sensors.protocol import decode_message
from tests.support import ROOT

DOC = (ROOT / "docs" / "protocol.md").read_text()


def _blocks(kind: str) -> list[dict[str, str]]:
    out = []
    for body in re.findall(rf"```{kind}\n(.*?)```", DOC, re.S):
        fields = {}
        for line in body.strip().splitlines():
            name, _, value = line.strip().partition(" ")
            fields[name] = value.strip()
        out.append(fields)
    return out


def _hex(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


def test_every_sealed_vector_is_what_the_code_seals() -> None:
    vectors = _blocks("auth-vector")
    assert len(vectors) >= 3
    for v in vectors:
        key, counter, sealed = _hex(v["key"]), int(v["counter"], 0), _hex(v["sealed"])
        if "message" in v:  # the firmware's vectors give only what it sent
            message = _hex(v["message"])
            assert seal(message, key, counter) == sealed, v
            assert unseal(sealed, key) == (message, counter)
            assert decode_message(sealed) == decode_message(message)
        else:
            assert unseal(sealed, key)[1] == counter, v
        envelope4 = b"\x94" + sealed[1:-10]  # by hand, as the document says
        tag = hmac.new(key, envelope4, hashlib.sha256).digest()[:8]
        assert sealed[-10:] == b"\xc4\x08" + tag == b"\xc4\x08" + _hex(v["tag"])


def firmware_vectors() -> list[dict[str, str]]:
    """The `auth-vector` blocks of what the AVR firmware sent (they carry its `frame`)."""
    return [v for v in _blocks("auth-vector") if "frame" in v]


def test_firmware_vectors_frame_what_they_seal_with_boot_counters() -> None:
    vectors = firmware_vectors()
    assert {decode_message(_hex(v["sealed"])).kind for v in vectors} >= {"samples", "status"}
    for v in vectors:
        sealed, frame = _hex(v["sealed"]), _hex(v["frame"])
        assert frame_payload(sealed) == frame, v
        decoder = FrameDecoder()
        [payload] = decoder.feed_payloads(frame)
        assert payload == sealed
        counter = int(v["counter"], 0)
        assert sealed[-19:-10] == b"\xcf" + counter.to_bytes(8, "big")  # always a uint64
        assert counter >> 32 == 1  # a first boot


def test_derived_keys_and_the_keys_file_example(tmp_path: Path) -> None:
    derived = _blocks("auth-derive")
    assert len(derived) >= 2
    for d in derived:
        assert derive_key(_hex(d["master"]), d["sensor_id"]).hex() == d["key"]
    example = re.search(r"```\n(# fleet master key.*?)```", DOC, re.S)
    assert example is not None
    path = tmp_path / "motes.keys"
    path.write_text(example.group(1))
    ring = load_keys(path)
    assert ring.key_for("773869") == derive_key(ring.master or b"", "773869")
