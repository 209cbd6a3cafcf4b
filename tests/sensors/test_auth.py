"""The sealing primitives: round trips, forgeries, replays, keys files."""

from __future__ import annotations

from pathlib import Path

import pytest

from sensors.auth import AuthError, ReplayWindow, derive_key, load_keys, seal, unseal
from sensors.protocol import Listen, decode_message, encode_message

KEY = bytes(range(16))
MESSAGE = encode_message(Listen(sensor_id="S1", seq=3, duration_ms=20.0))


@pytest.mark.parametrize("counter", [0, 5, 127, 128, 300, 70_000, 1 << 33, (1 << 64) - 1])
def test_seal_round_trips_every_counter_width(counter: int) -> None:
    sealed = seal(MESSAGE, KEY, counter)
    assert unseal(sealed, KEY) == (MESSAGE, counter)
    assert decode_message(sealed) == decode_message(MESSAGE)  # an old reader ignores the tail


def test_a_non_canonical_counter_encoding_still_unseals() -> None:
    import hashlib
    import hmac

    envelope4 = b"\x94" + MESSAGE[1:] + b"\xce\x00\x00\x00\x05"  # uint32 for 5
    tag = hmac.new(KEY, envelope4, hashlib.sha256).digest()[:8]
    sealed = b"\x95" + envelope4[1:] + b"\xc4\x08" + tag
    assert unseal(sealed, KEY) == (MESSAGE, 5)


def test_test_vector() -> None:
    assert seal(MESSAGE, KEY, 1).hex() == (
        "9501a66c697374656e93a2533103cb403400000000000001c40871819b4c27b38483"
    )
    assert derive_key(KEY, "S1").hex() == "9b95e1665c7b54dc76303d76d751925d"


@pytest.mark.parametrize("flip", [1, 5, 20, -1, -9])
def test_any_changed_byte_is_bad_mac(flip: int) -> None:
    sealed = bytearray(seal(MESSAGE, KEY, 9))
    sealed[flip] ^= 0x01
    with pytest.raises(AuthError) as err:
        unseal(bytes(sealed), KEY)
    assert err.value.reason in {"bad_mac", "unsigned"}


def test_wrong_key_and_unsigned() -> None:
    with pytest.raises(AuthError, match="tag") as err:
        unseal(seal(MESSAGE, KEY, 1), bytes(16))
    assert err.value.reason == "bad_mac"
    with pytest.raises(AuthError) as err:
        unseal(MESSAGE, KEY)
    assert err.value.reason == "unsigned"


def test_replay_window_accepts_each_counter_once_and_tolerates_reordering() -> None:
    window = ReplayWindow()
    for c in (10, 12, 11):
        window.check(c)
        window.accept(c)
    for c in (10, 11, 12):
        with pytest.raises(AuthError):
            window.check(c)
    window.check(13)
    window.check(9)
    window.accept(200)
    with pytest.raises(AuthError):
        window.check(200 - 64)
    window.check(200 - 63)


def test_keys_file(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(f"# fleet\n* {KEY.hex()}\nS9 {'ab' * 16}  # a spare\n")
    ring = load_keys(path)
    assert ring.key_for("S9") == bytes.fromhex("ab" * 16)
    assert ring.key_for("S1") == derive_key(KEY, "S1")
    path.write_text("S1 abcd\n")
    with pytest.raises(ValueError, match=r"keys:1: key must be 16 bytes"):
        load_keys(path)
    with pytest.raises(ValueError, match="not a regular file"):
        load_keys(tmp_path)


@pytest.mark.parametrize("key", [KEY, bytes(1), bytes(range(64)), b""])
def test_keyed_mac_is_hmac_sha256(key: bytes) -> None:
    import hashlib
    import hmac

    from sensors.auth import KeyedMac

    mac = KeyedMac(key)
    for data in (b"", MESSAGE, bytes(range(256)) * 3):
        assert mac.digest(data) == hmac.new(key, data, hashlib.sha256).digest()
    assert seal(MESSAGE, mac, 7) == seal(MESSAGE, key, 7)
    assert unseal(seal(MESSAGE, KEY, 9), KeyedMac(KEY)) == (MESSAGE, 9)
