"""Authenticated mote messages (sans-IO), in the spirit of TinySec's authentication-only mode.

A sealed message is the envelope with two trailing elements, ``[1, kind, body, counter, tag]``:

- ``counter``: the sender's message counter (msgpack unsigned int), strictly increasing over
  everything it seals with this key, across reboots. A receiver accepts each value once.
- ``tag``: msgpack ``bin 8`` (``c4 08`` + 8 bytes), the first 8 bytes of
  ``HMAC-SHA256(key, envelope4)``, where ``envelope4`` is the sealed message's bytes without
  the tag and with the array header ``0x95`` replaced by ``0x94``: exactly the msgpack
  encoding of ``[1, kind, body, counter]`` as the sender wrote it.

A reader that does not know authentication ignores the trailing elements (they come after the
last known field), so sealing never breaks an old gateway. Keys are 16 bytes, one per mote;
a fleet can derive them from one master key (:func:`derive_key`).

Everything here is pure: no clocks, no files except :func:`load_keys`, no sockets.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import msgspec

__all__ = [
    "KEY_BYTES",
    "REPLAY_WINDOW",
    "TAG_BYTES",
    "AuthError",
    "KeyedMac",
    "Keyring",
    "ReplayWindow",
    "derive_key",
    "load_keys",
    "seal",
    "unseal",
    "verify",
]

KEY_BYTES = 16
TAG_BYTES = 8
#: Counters this far below the highest accepted one are still accepted once: MQTT delivers
#: a mote's hello, data and status topics in separate streams, which may interleave.
REPLAY_WINDOW = 64
_TAG_HEADER = b"\xc4" + bytes([TAG_BYTES])
_MAX_COUNTER = (1 << 64) - 1
_DERIVE_LABEL = b"fjords-mote-key:"


class AuthError(ValueError):
    """A message that fails authentication; `reason` is the counter it is dropped under:
    ``unsigned`` (no tag), ``bad_mac``, ``replay``, ``unknown_key``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def derive_key(master: bytes, sensor_id: str) -> bytes:
    """A mote's key from the fleet's master key: HMAC-SHA256(master, label + id), 16 bytes."""
    return hmac.new(master, _DERIVE_LABEL + sensor_id.encode(), hashlib.sha256).digest()[:KEY_BYTES]


def _uint(n: int) -> bytes:
    """msgpack's shortest encoding of an unsigned int."""
    if n < 0x80:
        return bytes([n])
    for header, width in ((0xCC, 1), (0xCD, 2), (0xCE, 4), (0xCF, 8)):
        if n < 1 << (8 * width):
            return bytes([header]) + n.to_bytes(width, "big")
    raise ValueError(f"counter {n} does not fit in 64 bits")


_BLOCK = 64  # SHA-256's block size
_IPAD = bytes(b ^ 0x36 for b in range(256))
_OPAD = bytes(b ^ 0x5C for b in range(256))


class KeyedMac:
    """HMAC-SHA256 under one key with its padded key blocks hashed once: a tag then costs two
    copies of hash states, not a new HMAC (about half the time for a short message; the
    gateway pays it per message). Same result as :func:`hmac.new` (RFC 2104)."""

    __slots__ = ("_inner", "_outer", "key")

    def __init__(self, key: bytes) -> None:
        if len(key) > _BLOCK:
            raise ValueError("HMAC keys longer than a block are hashed first: not supported")
        self.key = key
        block = key.ljust(_BLOCK, b"\0")
        self._inner = hashlib.sha256(block.translate(_IPAD))
        self._outer = hashlib.sha256(block.translate(_OPAD))

    def digest(self, *parts: bytes | memoryview) -> bytes:
        """The HMAC of the concatenation of `parts` (without making it)."""
        inner = self._inner.copy()
        for part in parts:
            inner.update(part)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()


def _tag(key: bytes | KeyedMac, envelope4: bytes) -> bytes:
    if isinstance(key, KeyedMac):
        return key.digest(envelope4)[:TAG_BYTES]
    return hmac.new(key, envelope4, hashlib.sha256).digest()[:TAG_BYTES]


def seal(message: bytes, key: bytes | KeyedMac, counter: int) -> bytes:
    """A 3-element envelope (``encode_message``'s bytes) sealed with `counter` and its tag."""
    if not message or message[0] != 0x93:
        raise ValueError("not a 3-element message envelope")
    if not 0 <= counter <= _MAX_COUNTER:
        raise ValueError(f"counter {counter} out of range")
    envelope4 = b"\x94" + message[1:] + _uint(counter)
    return b"\x95" + envelope4[1:] + _TAG_HEADER + _tag(key, envelope4)


_sealed_decoder = msgspec.msgpack.Decoder(
    tuple[msgspec.Raw, msgspec.Raw, msgspec.Raw, Annotated[int, msgspec.Meta(ge=0)], msgspec.Raw]
)
_raw_counter_decoder = msgspec.msgpack.Decoder(
    tuple[msgspec.Raw, msgspec.Raw, msgspec.Raw, msgspec.Raw, msgspec.Raw]
)


def verify(data: bytes, key: bytes | KeyedMac) -> int:
    """The counter of a sealed message whose tag matches `key`; raises AuthError.

    The tag is checked before anything is parsed, so a forgery costs one HMAC; a message whose
    tag matches was written by a holder of `key`. Nothing is copied: this is the gateway's
    per-message path (the message itself is decoded from the same bytes, whose trailing
    counter and tag a decoder ignores)."""
    if not data or data[0] != 0x95:
        raise AuthError("unsigned", "message carries no counter and tag")
    if len(data) < 12 or data[-TAG_BYTES - 2 : -TAG_BYTES] != _TAG_HEADER:
        raise AuthError("bad_mac", "no 8-byte tag at the end of the message")
    signed = memoryview(data)[1 : -TAG_BYTES - 2]
    if isinstance(key, KeyedMac):
        tag = key.digest(b"\x94", signed)[:TAG_BYTES]
    else:
        tag = hmac.new(key, b"\x94" + signed, hashlib.sha256).digest()[:TAG_BYTES]
    if not hmac.compare_digest(tag, data[-TAG_BYTES:]):
        raise AuthError("bad_mac", "tag does not match the sensor's key")
    try:
        return _sealed_decoder.decode(data)[3]
    except (msgspec.DecodeError, RecursionError) as exc:
        # Only the key's holder can get here: a bug on its side, counted like a forgery.
        raise AuthError("bad_mac", f"authentic but malformed: {exc}") from None


def unseal(data: bytes, key: bytes | KeyedMac) -> tuple[bytes, int]:
    """The 3-element envelope inside a sealed message, and its counter; raises AuthError."""
    counter = verify(data, key)
    counter_bytes = len(_raw_counter_decoder.decode(data)[3])
    return b"\x93" + data[1 : -TAG_BYTES - 2 - counter_bytes], counter


@dataclass(slots=True)
class ReplayWindow:
    """Which counters one sender has used: the highest, and a bitmap of the 64 below it."""

    highest: int = -1
    _seen: int = 0  # bit i: highest - i was accepted

    def check(self, counter: int) -> None:
        """Raise AuthError("replay") unless `counter` is new; does not record it."""
        if counter > self.highest:
            return
        offset = self.highest - counter
        if offset >= REPLAY_WINDOW or self._seen >> offset & 1:
            raise AuthError("replay", f"counter {counter} already used (highest {self.highest})")

    def accept(self, counter: int) -> None:
        """Record `counter` (after check and after the tag was verified)."""
        if counter > self.highest:
            shift = counter - self.highest
            self._seen = (self._seen << shift | 1) & ((1 << REPLAY_WINDOW) - 1)
            self.highest = counter
        else:
            self._seen |= 1 << (self.highest - counter)


@dataclass(slots=True)
class Keyring:
    """Keys by sensor id, and a master key from which the others are derived."""

    keys: Mapping[str, bytes] = field(default_factory=dict)
    master: bytes | None = None

    def key_for(self, sensor_id: str) -> bytes | None:
        key = self.keys.get(sensor_id)
        if key is None and self.master is not None:
            key = derive_key(self.master, sensor_id)
        return key

    def __bool__(self) -> bool:
        return bool(self.keys) or self.master is not None


def load_keys(path: Path, *, max_bytes: int = 1 << 20) -> Keyring:
    """A keys file: one ``<sensor_id> <32 hex digits>`` per line, ``*`` for the master key,
    ``#`` comments. Raises ValueError naming the line."""
    if not path.is_file():
        raise ValueError(f"{path}: not a regular file")
    if path.stat().st_size > max_bytes:
        raise ValueError(f"{path}: larger than {max_bytes} bytes")
    keys: dict[str, bytes] = {}
    master: bytes | None = None
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"{path}:{n}: expected '<sensor_id> <hex key>'")
        name, hexkey = parts
        try:
            key = bytes.fromhex(hexkey)
        except ValueError:
            raise ValueError(f"{path}:{n}: key is not hex") from None
        if len(key) != KEY_BYTES:
            raise ValueError(f"{path}:{n}: key must be {KEY_BYTES} bytes ({2 * KEY_BYTES} hex)")
        if name == "*":
            master = key
        elif name in keys:
            raise ValueError(f"{path}:{n}: second key for {name!r}")
        else:
            keys[name] = key
    return Keyring(keys=keys, master=master)
