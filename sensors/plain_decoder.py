"""Plain MQTT devices (Tasmota, Zigbee2MQTT, ESPHome, Shelly...) as streams: sans-IO decoding.

Devices that do not speak the mote protocol publish one JSON (or msgpack) document per reading
on their own topics. A :class:`PlainStreamSpec` says which topics feed a stream, which topic
level names the sensor, where the reading's time is (or that arrival time is used) and where
each column's value is in the document. :class:`PlainIngest` turns (topic, payload) into one
:class:`Reading` per matching stream, or a counted :class:`Drop`, never an exception:

    ingest = PlainIngest([spec])
    for out in ingest.feed("tele/kitchen/SENSOR", b'{"AM2301": {"Temperature": 21.5}}', ...):
        ...  # Reading(stream, sensor_id, time, values) or Drop(reason, sensor_id, detail)

Why these bounds: a payload is at most `max_payload_bytes` (so its decoded size is bounded),
msgspec guards its own recursion (a nesting thousands deep is a RecursionError, counted), and a
document nested more than `max_depth` containers deep is dropped (for JSON, a count of its
brackets in C skips the walk that checks this for any ordinary document). Sensors per stream
are bounded (`max_sensors`, the catalog's bound); a sensor silent for `forget_after_s` is
forgotten.

Arrival time (no `time_path`) is the gateway's wall clock made strictly increasing per sensor, so
two readings that arrive in the same clock tick are not taken for duplicates, and a clock that
steps back never makes a sensor's readings look out of order.
"""

from __future__ import annotations

import logging
import math
import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from typing import Any, Literal, NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec

from sensors.protocol import Hello

__all__ = [
    "DROP_REASONS",
    "ColumnSpec",
    "Drop",
    "PlainIngest",
    "PlainStreamSpec",
    "Reading",
    "SpecError",
    "parse_path",
    "topic_matches",
    "topics_overlap",
]

log = logging.getLogger("sensors.plain_decoder")

ColumnType = Literal["float", "int", "str", "bool"]
COLUMN_TYPES: tuple[str, ...] = ("float", "int", "str", "bool")
#: Columns every plain stream has before the declared ones.
FIXED_COLUMNS = ("time", "sensor")
#: Why a payload was dropped (the `reason` label of fjords_dropped_total{stage="mqtt_json"}).
DROP_REASONS = (
    "oversize",  # longer than max_payload_bytes
    "malformed",  # not JSON / msgpack, or a number out of range
    "too_deep",  # nested deeper than max_depth
    "not_object",  # the document is not an object (a bare number, a list...)
    "missing_path",  # a required column's path (or time_path) is absent or null
    "wrong_type",  # a value of the wrong type for its column
    "bad_time",  # time_path holds no time (not epoch seconds nor ISO-8601)
    "bad_sensor_id",  # the topic level that names the sensor is empty or too long
    "sensor_id_taken",  # that sensor id already feeds another plain stream
    "too_many_sensors",  # the stream holds max_sensors sensors already
)
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SEGMENT = re.compile(r"[^\s.\[\]*]+\Z")
MAX_SENSOR_ID_CHARS = 128
#: Epoch seconds beyond this are not seconds (1e11 s is year 5138; milliseconds of today are 1e12).
MAX_EPOCH_S = 1e11


class SpecError(ValueError):
    """A stream declaration that cannot work; `key` names the offending setting."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


def parse_path(path: str, key: str = "path", max_depth: int = 16) -> tuple[str, ...]:
    """`AM2301.Temperature` -> ("AM2301", "Temperature"); a list item is a number (`a.0.b`)."""
    if not isinstance(path, str) or not path:
        raise SpecError(
            key, "an empty path (write the keys separated by dots, e.g. AM2301.Temperature)"
        )
    parts = tuple(path.split("."))
    for p in parts:
        if not p:
            raise SpecError(key, f"{path!r} has an empty key (two dots, or a dot at an end)")
        if not _SEGMENT.match(p):
            raise SpecError(
                key,
                f"{path!r}: key {p!r} may not hold spaces, brackets or '*' "
                "(write list items as a.0.b, not a[0].b)",
            )
    if len(parts) > max_depth:
        raise SpecError(key, f"{path!r} is {len(parts)} keys deep, more than max_depth={max_depth}")
    return parts


def _levels(topic: str) -> list[str]:
    return topic.split("/")


def check_topic_filter(topic: str, key: str = "topic") -> list[str]:
    """The levels of an MQTT topic filter, or a SpecError saying what is wrong with it."""
    if not topic:
        raise SpecError(key, "an empty topic")
    if len(topic.encode()) > 65535 or "\0" in topic:
        raise SpecError(key, f"{topic!r} is not a valid MQTT topic")
    levels = _levels(topic)
    for i, lv in enumerate(levels):
        if "+" in lv and lv != "+":
            raise SpecError(key, f"{topic!r}: '+' must be a whole level")
        if "#" in lv and (lv != "#" or i != len(levels) - 1):
            raise SpecError(key, f"{topic!r}: '#' must be the whole last level")
    return levels


def topic_matches(levels: Sequence[str], topic: str) -> list[str] | None:
    """The topic's levels if it matches the filter `levels`, else None."""
    parts = _levels(topic)
    for i, f in enumerate(levels):
        if f == "#":
            return parts
        if i >= len(parts) or (f != "+" and f != parts[i]):
            return None
    return parts if len(parts) == len(levels) else None


def topics_overlap(a: str, b: str) -> bool:
    """Whether some topic matches both filters `a` and `b`."""
    la, lb = _levels(a), _levels(b)
    for x, y in zip(la, lb, strict=False):
        if x == "#" or y == "#":
            return True
        if x != "+" and y != "+" and x != y:
            return False
    return len(la) == len(lb) or (la[len(lb) :] or lb[len(la) :]) == ["#"]


@dataclass(frozen=True, slots=True)
class ColumnSpec:
    name: str
    path: tuple[str, ...]
    type: ColumnType = "float"
    optional: bool = False  # a missing value is NULL instead of dropping the reading
    unit: str | None = None


@dataclass(frozen=True, slots=True)
class PlainStreamSpec:
    """One `[[mqtt.streams]]` entry, checked. Build it with :meth:`build`."""

    name: str
    topic: str
    sensor_id_level: int
    columns: tuple[ColumnSpec, ...]
    format: Literal["json", "msgpack"] = "json"
    time_path: tuple[str, ...] | None = None
    time_zone: str = "UTC"
    max_payload_bytes: int = 64 * 1024
    max_depth: int = 16
    levels: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def build(
        cls,
        *,
        name: str,
        topic: str,
        sensor_id_level: int,
        columns: Mapping[str, Mapping[str, Any]],
        format: str = "json",
        time_path: str | None = None,
        time_zone: str = "UTC",
        max_payload_bytes: int = 64 * 1024,
        max_depth: int = 16,
        reserved: Iterable[str] = (),
    ) -> PlainStreamSpec:
        """Check a declaration; a SpecError names the key at fault. `reserved`: names taken."""
        if not IDENT.match(name):
            raise SpecError("name", f"{name!r} is not a stream name (letters, digits, _)")
        if name in set(reserved):
            raise SpecError("name", f"{name!r} is already a stream or table")
        if format not in ("json", "msgpack"):
            raise SpecError("format", f"{format!r}: expected json or msgpack")
        if max_depth < 1 or max_payload_bytes < 1:
            raise SpecError("max_depth", "max_depth and max_payload_bytes must be at least 1")
        levels = check_topic_filter(topic)
        if isinstance(sensor_id_level, bool) or not isinstance(sensor_id_level, int):
            raise SpecError("sensor_id_level", f"{sensor_id_level!r} is not a level number")
        if not 0 <= sensor_id_level < len(levels) or levels[sensor_id_level] == "#":
            n = len(levels) - (levels[-1] == "#")
            raise SpecError(
                "sensor_id_level",
                f"{sensor_id_level} is out of range for topic {topic!r}"
                f" (its levels are 0..{n - 1}, counted from 0)",
            )
        if levels[sensor_id_level] != "+":
            pluses = [i for i, lv in enumerate(levels) if lv == "+"]
            hint = f"; its '+' levels: {pluses}" if pluses else "; it has no '+' level"
            raise SpecError(
                "sensor_id_level",
                f"level {sensor_id_level} of topic {topic!r} is {levels[sensor_id_level]!r}, "
                f"not '+' (the sensor id is the topic level a '+' matches){hint}",
            )
        if not columns:
            raise SpecError("columns", "declare at least one column")
        cols = []
        for col, c in columns.items():
            key = f"columns.{col}"
            if not IDENT.match(col):
                raise SpecError(key, f"{col!r} is not a column name (letters, digits, _)")
            if col in FIXED_COLUMNS:
                raise SpecError(key, f"{col!r} is a column of every plain stream already")
            typ = c.get("type", "float")
            if typ not in COLUMN_TYPES:
                raise SpecError(
                    f"{key}.type", f"unknown type {typ!r} (known: {', '.join(COLUMN_TYPES)})"
                )
            path = parse_path(c.get("path", ""), f"{key}.path", max_depth)
            cols.append(ColumnSpec(col, path, typ, bool(c.get("optional", False)), c.get("unit")))
        tpath = None if time_path is None else parse_path(time_path, "time_path", max_depth)
        try:
            _zone(time_zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise SpecError("time_zone", f"unknown time zone {time_zone!r}") from None
        return cls(
            name=name,
            topic=topic,
            sensor_id_level=sensor_id_level,
            columns=tuple(cols),
            format=format,  # type: ignore[arg-type]
            time_path=tpath,
            time_zone=time_zone,
            max_payload_bytes=max_payload_bytes,
            max_depth=max_depth,
            levels=tuple(levels),
        )

    def field_types(self) -> list[tuple[str, str, str | None]]:
        """(name, type, unit) of every column, `time` and `sensor` first."""
        return [("time", "float", "s"), ("sensor", "str", None)] + [
            (c.name, c.type, c.unit) for c in self.columns
        ]


class Reading(NamedTuple):
    stream: str
    sensor_id: str
    time: float
    values: tuple[Any, ...]


class Drop(NamedTuple):
    reason: str
    stream: str
    sensor_id: str | None
    detail: str


_MISSING = object()


def _deeper_than(doc: Any, limit: int) -> bool:
    """Whether containers nest more than `limit` deep in `doc` (iterative: no recursion)."""
    stack = [(doc, 1)]
    while stack:
        v, depth = stack.pop()
        items = v.values() if isinstance(v, dict) else v
        if depth > limit:
            return True
        stack.extend((x, depth + 1) for x in items if isinstance(x, dict | list))
    return False


class _Decoder:
    """Bytes -> a bounded document, or (reason, detail)."""

    def __init__(self, spec: PlainStreamSpec) -> None:
        self.max_bytes = spec.max_payload_bytes
        self.max_depth = spec.max_depth
        self.fmt = spec.format
        self._decode = msgspec.json.decode if spec.format == "json" else msgspec.msgpack.decode

    def __call__(self, payload: bytes) -> Any:
        if len(payload) > self.max_bytes:
            raise _Bad("oversize", f"{len(payload)} bytes, more than {self.max_bytes}")
        try:
            doc = self._decode(payload)
        except RecursionError:
            raise _Bad("too_deep", f"nested deeper than max_depth={self.max_depth}") from None
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            raise _Bad("malformed", f"not {self.fmt}: {exc}") from None
        if isinstance(doc, dict | list):
            if self.fmt != "json" or payload.count(b"[") + payload.count(b"{") > self.max_depth:
                if _deeper_than(doc, self.max_depth):
                    raise _Bad("too_deep", f"nested deeper than max_depth={self.max_depth}")
        return doc


class _Bad(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _lookup(doc: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if isinstance(doc, dict):
            doc = doc.get(key, _MISSING)
        elif isinstance(doc, list) and key.isdigit() and int(key) < len(doc):
            doc = doc[int(key)]
        else:
            return _MISSING
        if doc is _MISSING:
            return doc
    return doc


_BOOL_WORDS = {"on": True, "off": False, "true": True, "false": False}


def convert_value(v: Any, typ: str) -> Any:
    """`v` as a column of type `typ`; raises ValueError when it is not one."""
    if typ == "float":
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ValueError(f"{v!r} is not a number")
        return float(v)
    if typ == "int":
        if isinstance(v, float) and v.is_integer() and abs(v) < 2**63:
            return int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{v!r} is not an integer")
        return v
    if typ == "bool":
        if isinstance(v, bool):
            return v
        if isinstance(v, str) and v.strip().lower() in _BOOL_WORDS:
            return _BOOL_WORDS[v.strip().lower()]
        raise ValueError(f"{v!r} is not a boolean (true/false, ON/OFF)")
    if isinstance(v, str):
        return v
    raise ValueError(f"{v!r} is not a string")


def _zone(name: str) -> tzinfo | None:
    """An IANA zone; "local" is the gateway's own (None: Python's local time, DST included)."""
    return None if name == "local" else ZoneInfo(name)


def parse_time(v: Any, zone: tzinfo | None) -> float:
    """Epoch seconds (a number) or ISO-8601 text (`zone` when it has no offset; None: the
    gateway's local time) -> epoch seconds."""
    if isinstance(v, datetime):  # a msgpack timestamp
        d = v if v.tzinfo is not None or zone is None else v.replace(tzinfo=zone)
        return d.timestamp()
    if isinstance(v, bool):
        raise ValueError(f"{v!r} is not a time")
    if isinstance(v, int | float):
        t = float(v)
        if not math.isfinite(t) or t < 0:
            raise ValueError(f"{v!r} is not a time in epoch seconds")
        if t >= MAX_EPOCH_S:
            raise ValueError(f"{v!r} is too large for epoch seconds (milliseconds?)")
        return t
    if isinstance(v, str) and len(v) <= 64:
        try:
            d = datetime.fromisoformat(v)
        except ValueError:
            raise ValueError(f"{v!r} is not ISO-8601") from None
        if d.tzinfo is None and zone is not None:
            d = d.replace(tzinfo=zone)
        try:
            return d.timestamp()
        except (OverflowError, OSError, ValueError):
            raise ValueError(f"{v!r} is out of range") from None
    raise ValueError(f"{str(v)[:64]!r} is not a time (epoch seconds or ISO-8601)")


class _SensorTimes:
    """When a sensor was last heard (gateway monotonic, to forget it) and its last reading's
    time (arrival times are made strictly increasing from it)."""

    __slots__ = ("heard", "last_time")

    def __init__(self, heard: float) -> None:
        self.heard = heard
        self.last_time = -math.inf


class _Stream:
    def __init__(self, spec: PlainStreamSpec) -> None:
        self.spec = spec
        self.decode = _Decoder(spec)
        self.zone = _zone(spec.time_zone)
        self.sensors: OrderedDict[str, _SensorTimes] = OrderedDict()  # least recently heard first
        self.readings = 0


class PlainIngest:
    """(topic, payload) -> readings of every matching stream, or counted drops; see the module.

    `drops` counts by reason; `forget_after_s` (gateway monotonic seconds) bounds how long a
    silent sensor keeps its place among a stream's `max_sensors`.
    """

    def __init__(
        self,
        specs: Sequence[PlainStreamSpec],
        *,
        max_sensors: int = 10_000,
        forget_after_s: float = 86_400.0,
        max_logged_sensors: int = 1024,
    ) -> None:
        self.streams = [_Stream(s) for s in specs]
        self.max_sensors = max_sensors
        self.forget_after_s = forget_after_s
        self.drops: dict[str, int] = {}
        self._owner: dict[str, _Stream] = {}  # sensor id -> the stream it feeds
        self._logged: set[tuple[str, str]] = set()
        self._max_logged = max_logged_sensors

    def subscriptions(self) -> list[str]:
        return list(dict.fromkeys(s.spec.topic for s in self.streams))

    # -- what the transport calls ------------------------------------------------------------
    def feed(self, topic: str, payload: bytes, *, wall: float, mono: float) -> list[Reading | Drop]:
        """One MQTT message: a Reading or a Drop for each stream whose topic filter matches."""
        out: list[Reading | Drop] = []
        for st in self.streams:
            parts = topic_matches(st.spec.levels, topic)
            if parts is None:
                continue
            result = self._one(st, parts, payload, wall, mono)
            if isinstance(result, Drop):
                self._count(result)
            out.append(result)
        return out

    def hello(self, sensor_id: str) -> tuple[Hello, str] | None:
        """The hello a known sensor implies (its stream's columns), and the stream's name."""
        st = self._owner.get(sensor_id)
        if st is None:
            return None
        schema = tuple((c.name, c.type) for c in st.spec.columns)
        return Hello(sensor_id=sensor_id, schema=schema), st.spec.name

    def stream_of(self, sensor_id: str) -> str | None:
        st = self._owner.get(sensor_id)
        return None if st is None else st.spec.name

    def sensor_count(self) -> int:
        return len(self._owner)

    # -- the work -------------------------------------------------------------------------------
    def _one(
        self, st: _Stream, parts: list[str], payload: bytes, wall: float, mono: float
    ) -> Reading | Drop:
        spec = st.spec
        sid = parts[spec.sensor_id_level]
        if not sid or len(sid) > MAX_SENSOR_ID_CHARS or not sid.isprintable():
            return Drop("bad_sensor_id", spec.name, None, f"topic level {sid[:64]!r}")
        try:
            doc = st.decode(payload)
        except _Bad as bad:
            return Drop(bad.reason, spec.name, sid, bad.detail)
        if not isinstance(doc, dict):
            return Drop("not_object", spec.name, sid, f"a {type(doc).__name__}, not an object")
        values: list[Any] = []
        for c in spec.columns:
            v = _lookup(doc, c.path)
            if v is _MISSING or v is None:
                if c.optional:
                    values.append(None)
                    continue
                return Drop("missing_path", spec.name, sid, f"no value at {'.'.join(c.path)}")
            try:
                values.append(convert_value(v, c.type))
            except ValueError as exc:
                return Drop("wrong_type", spec.name, sid, f"{'.'.join(c.path)}: {exc}")
        t: float | None = None
        if spec.time_path is not None:
            raw = _lookup(doc, spec.time_path)
            if raw is _MISSING or raw is None:
                return Drop(
                    "missing_path", spec.name, sid, f"no time at {'.'.join(spec.time_path)}"
                )
            try:
                t = parse_time(raw, st.zone)
            except ValueError as exc:
                return Drop("bad_time", spec.name, sid, str(exc))
        sensor = self._admit(st, sid, mono)
        if isinstance(sensor, Drop):
            return sensor
        if t is None:  # arrival time, strictly increasing per sensor
            t = max(wall, sensor.last_time + 1e-6)
        sensor.last_time = max(sensor.last_time, t)
        st.readings += 1
        return Reading(spec.name, sid, t, tuple(values))

    def _admit(self, st: _Stream, sid: str, mono: float) -> _SensorTimes | Drop:
        self._forget_silent(st, mono)
        owner = self._owner.get(sid)
        if owner is not None and owner is not st:
            return Drop(
                "sensor_id_taken",
                st.spec.name,
                sid,
                f"sensor {sid!r} feeds stream {owner.spec.name!r} already",
            )
        sensor = st.sensors.get(sid)
        if sensor is None:
            if len(st.sensors) >= self.max_sensors:
                return Drop(
                    "too_many_sensors",
                    st.spec.name,
                    sid,
                    f"the stream holds max_sensors={self.max_sensors} sensors already",
                )
            sensor = st.sensors[sid] = _SensorTimes(mono)
            self._owner[sid] = st
        else:
            st.sensors.move_to_end(sid)
            sensor.heard = mono
        return sensor

    def _forget_silent(self, st: _Stream, mono: float) -> None:
        sensors = st.sensors
        while sensors:
            sid, s = next(iter(sensors.items()))
            if mono - s.heard <= self.forget_after_s:
                return
            del sensors[sid]
            self._owner.pop(sid, None)

    def _count(self, drop: Drop) -> None:
        self.drops[drop.reason] = self.drops.get(drop.reason, 0) + 1
        key = (drop.stream, drop.sensor_id if drop.sensor_id is not None else drop.reason)
        if key in self._logged:
            return
        if len(self._logged) >= self._max_logged:
            if ("", "") not in self._logged:
                self._logged.add(("", ""))
                log.warning(
                    "plain MQTT: more than %d sensors dropped readings; further ones only counted",
                    self._max_logged,
                )
            return
        self._logged.add(key)
        who = f"sensor {drop.sensor_id!r}" if drop.sensor_id is not None else "a device"
        log.warning(
            "stream %r: dropped a reading from %s (%s: %s); logged once per sensor, "
            'counted in fjords_dropped_total{stage="mqtt_json", reason=%r}',
            drop.stream,
            who,
            drop.reason,
            drop.detail[:200],
            drop.reason,
        )
