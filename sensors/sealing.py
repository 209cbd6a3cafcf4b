"""Who may speak for a mote, and who may command it: the state around :mod:`sensors.auth`.

:class:`GatewayAuth` is the gateway's side, shared by every transport it runs: it opens what
motes send (keys by sensor id; one replay window per sensor and topic class, because MQTT
delivers a mote's hello, data and status topics as separate streams and a last will is
sealed at connect time), counts rejections by reason, and seals controls with a counter that
never goes back. :class:`MoteAuth` is one mote's side: it seals what the mote sends and
accepts a control only if its tag verifies and its counter is new.

Both are sans-IO (a clock is injected). Counters start at wall-clock microseconds and add one
per message, so they keep increasing across reboots without stored state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sensors.auth import (
    REPLAY_WINDOW,
    AuthError,
    KeyedMac,
    Keyring,
    ReplayWindow,
    seal,
    unseal,
    verify,
)
from sensors.protocol import Control, Message, ProtocolError, decode_message, encode_message

__all__ = ["REASONS", "GatewayAuth", "MoteAuth", "topic_class"]

log = logging.getLogger("sensors.auth")

#: Why a message is refused (`unsigned` is only a refusal when MACs are required).
REASONS = ("unsigned", "bad_mac", "replay", "unknown_key")
#: Messages of these kinds have their own MQTT topic (and replay window); others are data.
_CLASS = {"hello": "hello", "status": "status"}
#: Distinct (sensor, reason) pairs of known sensors whose first rejection is logged; other ids,
#: and past that many, one line per reason per `_LOG_EVERY_S` (a flood of forged ids must not
#: flood the log).
_MAX_LOGGED = 1024
_LOG_EVERY_S = 60.0
#: A restored window: everything up to its highest counter counts as used.
_ALL_SEEN = (1 << REPLAY_WINDOW) - 1


def topic_class(kind: str) -> str:
    """The replay-window class of a message kind: ``hello``, ``status`` or ``data``."""
    return _CLASS.get(kind, "data")


def _micros(clock: Callable[[], int]) -> int:
    return clock() // 1000


class GatewayAuth:
    """The gateway's verifier and control sealer. `require_mac` False: an unsigned message
    (or one from a sensor without a key) is accepted and counted as `unsigned`; a sealed one
    is still verified. `on_reject(sensor_id, reason)` is told of each refusal of a sensor that
    has a key (the gateway counts it on the sensor's proxy, if it has one)."""

    def __init__(
        self,
        keys: Keyring,
        *,
        require_mac: bool = True,
        clock: Callable[[], int] = time.time_ns,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keys = keys
        self.require_mac = require_mac
        self.rejected: dict[str, int] = dict.fromkeys(REASONS, 0)
        self.unsigned_accepted = 0
        self.accepted = 0
        self.on_reject: Callable[[str, str], None] | None = None
        self._clock = clock
        self._monotonic = monotonic
        # Only sensors that sent an authentic message get state here: bounded by the fleet.
        self._verified_keys: dict[str, KeyedMac] = {}
        self._windows: dict[tuple[str, str], ReplayWindow] = {}
        self._control_counter = 0
        self._logged: set[tuple[str, str]] = set()
        self._last_logged: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def _key(self, sensor_id: str) -> KeyedMac | bytes | None:
        key = self._verified_keys.get(sensor_id)
        return key if key is not None else self.keys.key_for(sensor_id)

    def admit(
        self,
        sensor_id: str,
        kind: str,
        data: bytes | bytearray | memoryview,
        *,
        retained: bool = False,
    ) -> bool:
        """Whether the message `data` (already decoded: from `sensor_id`, of `kind`) may go on
        to the proxies. A broker-retained message is verified but not replay-checked, and its
        counter is not recorded (it is old by nature)."""
        key: KeyedMac | bytes | None = self._verified_keys.get(sensor_id)
        if key is None:
            key = self.keys.key_for(sensor_id)
            if key is None:
                if self.require_mac:
                    return self._reject(sensor_id, "unknown_key", "no key for this sensor", False)
                self.unsigned_accepted += 1
                return True
        payload = data if isinstance(data, bytes) else bytes(data)
        if not self.require_mac and payload[:1] != b"\x95":
            self.unsigned_accepted += 1
            if self.on_reject is not None:
                self.on_reject(sensor_id, "unsigned")
            return True
        try:
            counter = verify(payload, key)
            if not isinstance(key, KeyedMac):  # its first authentic message
                self._verified_keys[sensor_id] = KeyedMac(key)
            if retained:
                self.accepted += 1
                return True
            where = (sensor_id, _CLASS.get(kind, "data"))
            window = self._windows.get(where)
            if window is None:
                window = self._windows[where] = ReplayWindow()
            window.check(counter)
        except AuthError as exc:
            return self._reject(sensor_id, exc.reason, str(exc), True)
        window.accept(counter)
        self.accepted += 1
        return True

    def _reject(self, sensor_id: str, reason: str, detail: str, keyed: bool) -> bool:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        if keyed and self.on_reject is not None:
            self.on_reject(sensor_id, reason)
        pair = (sensor_id, reason)
        if pair in self._logged:
            return False
        if len(self._logged) < _MAX_LOGGED and self._known(sensor_id):
            self._logged.add(pair)
        else:  # an id never heard from genuinely (a flood of made-up ids): one line a minute
            now = self._monotonic()
            last = self._last_logged.get(reason)
            if last is not None and now - last < _LOG_EVERY_S:
                self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
                return False
            self._last_logged[reason] = now
        more = self._suppressed.pop(reason, 0)
        log.warning(
            "refused a message from sensor %r (%s: %s)%s; further ones are counted"
            " (fjords_auth_rejected_total)",
            sensor_id[:64],
            reason,
            detail,
            f", {more} similar ones not logged" if more else "",
        )
        return False

    def _known(self, sensor_id: str) -> bool:
        """Whether the sensor has a key of its own or has sent an authentic message."""
        return (
            sensor_id in self._verified_keys
            or sensor_id in self.keys.keys
            or any((sensor_id, cls) in self._windows for cls in ("hello", "data", "status"))
        )

    def seal_control(self, msg: Control) -> bytes:
        """A control's bytes, sealed with the sensor's key (plain when it has none)."""
        data = encode_message(msg)
        key = self._key(msg.sensor_id)
        if key is None:
            return data
        self._control_counter = max(self._control_counter + 1, _micros(self._clock))
        return seal(data, key, self._control_counter)

    def counters(self) -> dict[str, dict[str, int]]:
        """The highest accepted counter per sensor and topic class, for `restore` after a
        restart (else a message captured before it could be replayed once after it)."""
        out: dict[str, dict[str, int]] = {}
        for (sid, cls), window in self._windows.items():
            out.setdefault(sid, {})[cls] = window.highest
        return out

    def restore(self, counters: Mapping[str, Mapping[str, int]]) -> None:
        """Start from saved `counters`: only counters above them are new."""
        for sid, classes in counters.items():
            for cls, highest in classes.items():
                if cls in ("hello", "data", "status") and isinstance(highest, int):
                    window = self._windows.setdefault((sid, cls), ReplayWindow())
                    if highest > window.highest:
                        window.highest, window._seen = highest, _ALL_SEEN

    def forget(self, sensor_id: str) -> None:
        """The sensor left the catalog: drop its windows (its next messages start new ones)."""
        self._verified_keys.pop(sensor_id, None)
        for cls in ("hello", "data", "status"):
            self._windows.pop((sensor_id, cls), None)


@dataclass(slots=True)
class MoteAuth:
    """One mote's key: seals what it sends, opens the controls it receives."""

    sensor_id: str
    key: bytes
    clock: Callable[[], int] = time.time_ns
    #: controls ignored, by reason (`unsigned`, `bad_mac`, `replay`, `protocol`, `sender`)
    rejected: dict[str, int] = field(default_factory=dict)
    _counter: int = 0
    _window: ReplayWindow = field(default_factory=ReplayWindow)
    _mac: KeyedMac = field(init=False)

    def __post_init__(self) -> None:
        self._mac = KeyedMac(self.key)

    def next_counter(self) -> int:
        self._counter = max(self._counter + 1, _micros(self.clock))
        return self._counter

    def seal(self, msg: Message) -> bytes:
        return seal(encode_message(msg), self._mac, self.next_counter())

    def seal_bytes(self, data: bytes) -> bytes:
        """An already encoded message, sealed (the bytes of `encode_message`)."""
        return seal(data, self._mac, self.next_counter())

    def open_control(self, data: bytes | bytearray | memoryview) -> Control | None:
        """The control in `data`, or None (counted in `rejected`) when it is not authentic,
        is replayed, or is not a control for this mote."""
        try:
            inner, counter = unseal(bytes(data), self._mac)
            self._window.check(counter)
        except AuthError as exc:
            self._ignore(exc.reason)
            return None
        try:
            msg = decode_message(inner)
        except ProtocolError:
            msg = None
        if not isinstance(msg, Control) or msg.sensor_id != self.sensor_id:
            self._ignore("protocol" if msg is None else "sender")
            return None
        self._window.accept(counter)
        return msg

    def _ignore(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
