"""The sans-IO decoder of plain MQTT devices' payloads (sensors/plain_decoder.py): what
Tasmota and Zigbee2MQTT publish becomes readings; everything else is a counted drop, never an
exception (fuzzed with Hypothesis like the protocol decoders)."""

from __future__ import annotations

import json
import logging
import math
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sensors.plain_decoder import (
    DROP_REASONS,
    Drop,
    PlainIngest,
    PlainStreamSpec,
    Reading,
    SpecError,
    parse_path,
    topic_matches,
    topics_overlap,
)

T = datetime(2026, 11, 23, 16, 17, tzinfo=UTC).timestamp()


def tasmota_spec(**kw: Any) -> PlainStreamSpec:
    args: dict[str, Any] = {
        "name": "climate",
        "topic": "tele/+/SENSOR",
        "sensor_id_level": 1,
        "time_path": "Time",
        "columns": {
            "temperature": {"path": "AM2301.Temperature", "type": "float"},
            "humidity": {"path": "AM2301.Humidity", "type": "float"},
        },
    }
    return PlainStreamSpec.build(**{**args, **kw})


def zigbee_spec(**kw: Any) -> PlainStreamSpec:
    args: dict[str, Any] = {
        "name": "zigbee",
        "topic": "zigbee2mqtt/+",
        "sensor_id_level": 1,
        "columns": {
            "temperature": {"path": "temperature"},
            "battery": {"path": "battery", "type": "int", "optional": True},
            "occupancy": {"path": "occupancy", "type": "bool", "optional": True},
            "action": {"path": "action", "type": "str", "optional": True},
        },
    }
    return PlainStreamSpec.build(**{**args, **kw})


def feed(ingest: PlainIngest, topic: str, doc: Any, wall: float = T, mono: float = 0.0) -> Any:
    payload = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    out = ingest.feed(topic, payload, wall=wall, mono=mono)
    assert len(out) == 1, out
    return out[0]


def test_tasmota_sensor_document_is_one_reading() -> None:
    ingest = PlainIngest([tasmota_spec()])
    doc = {
        "Time": "2026-11-23T16:17:00",
        "AM2301": {"Temperature": 21.3, "Humidity": 40},
        "TempUnit": "C",
    }
    r = feed(ingest, "tele/kitchen/SENSOR", doc)
    assert r == Reading("climate", "kitchen", T, (21.3, 40.0))
    assert isinstance(r.values[1], float)
    hello, stream = ingest.hello("kitchen")  # type: ignore[misc]
    assert stream == "climate" and hello.sensor_id == "kitchen"
    assert hello.schema == (("temperature", "float"), ("humidity", "float"))
    assert ingest.hello("unknown") is None


def test_zigbee2mqtt_optional_columns_and_arrival_time() -> None:
    ingest = PlainIngest([zigbee_spec()])
    r1 = feed(ingest, "zigbee2mqtt/hall", {"temperature": 20, "battery": 97.0, "linkquality": 3})
    assert r1.values == (20.0, 97, None, None) and r1.time == T
    # Same wall clock tick, and then a clock that stepped back: still strictly increasing.
    r2 = feed(ingest, "zigbee2mqtt/hall", {"temperature": 21, "occupancy": "ON"}, wall=T)
    r3 = feed(ingest, "zigbee2mqtt/hall", {"temperature": 22, "action": "single"}, wall=T - 60)
    assert r1.time < r2.time < r3.time and r3.time - r1.time < 1e-3
    assert r2.values[2] is True and r3.values[3] == "single"
    # Other sensors have their own clock.
    assert feed(ingest, "zigbee2mqtt/door", {"temperature": 5}, wall=T).time == T
    # Topics the filter does not match are not ours.
    assert ingest.feed("zigbee2mqtt/hall/availability", b"{}", wall=T, mono=0) == []
    assert ingest.feed("zigbee2mqtt", b"{}", wall=T, mono=0) == []


@pytest.mark.parametrize(
    ("stamp", "zone", "want"),
    [
        ("2026-11-23T16:17:00", "UTC", T),
        ("2026-11-23T17:17:00", "Europe/Oslo", T),  # Tasmota's local time, no offset
        ("2026-11-23T17:17:00+01:00", "UTC", T),
        ("2026-11-23T16:17:00Z", "Europe/Oslo", T),
        ("2026-11-23T16:17:00.250Z", "UTC", T + 0.25),
        (T, "UTC", T),
        (int(T), "UTC", T),
    ],
)
def test_times(stamp: Any, zone: str, want: float) -> None:
    ingest = PlainIngest([tasmota_spec(time_zone=zone)])
    doc = {"Time": stamp, "AM2301": {"Temperature": 1, "Humidity": 2}}
    assert feed(ingest, "tele/a/SENSOR", doc).time == pytest.approx(want)


@pytest.mark.parametrize(
    ("doc", "reason"),
    [
        (b"not json", "malformed"),
        (b'{"Time": 1e400}', "malformed"),
        (b"", "malformed"),
        (b'{"a": 1', "malformed"),
        (b"[1, 2]", "not_object"),
        (b"21.5", "not_object"),
        ({"Time": "2026-11-23T16:17:00"}, "missing_path"),
        (
            {"Time": "2026-11-23T16:17:00", "AM2301": {"Temperature": None, "Humidity": 1}},
            "missing_path",
        ),
        ({"AM2301": {"Temperature": 1, "Humidity": 1}}, "missing_path"),
        ({"Time": "2026-11-23T16:17:00", "AM2301": 5}, "missing_path"),
        (
            {"Time": "2026-11-23T16:17:00", "AM2301": {"Temperature": "hot", "Humidity": 1}},
            "wrong_type",
        ),
        (
            {"Time": "2026-11-23T16:17:00", "AM2301": {"Temperature": True, "Humidity": 1}},
            "wrong_type",
        ),
        (
            {"Time": "2026-11-23T16:17:00", "AM2301": {"Temperature": [1], "Humidity": 1}},
            "wrong_type",
        ),
        ({"Time": "yesterday", "AM2301": {"Temperature": 1, "Humidity": 1}}, "bad_time"),
        ({"Time": T * 1000, "AM2301": {"Temperature": 1, "Humidity": 1}}, "bad_time"),
        ({"Time": -5, "AM2301": {"Temperature": 1, "Humidity": 1}}, "bad_time"),
        ({"Time": True, "AM2301": {"Temperature": 1, "Humidity": 1}}, "bad_time"),
        ({"Time": {"x": 1}, "AM2301": {"Temperature": 1, "Humidity": 1}}, "bad_time"),
        ({"Time": "9" * 100, "AM2301": {"Temperature": 1, "Humidity": 1}}, "bad_time"),
        (b'{"a":' + b"[" * 40 + b"]" * 40 + b"}", "too_deep"),
        (b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", "oversize"),
    ],
)
def test_what_does_not_match_is_a_drop(doc: Any, reason: str) -> None:
    ingest = PlainIngest([tasmota_spec()])
    d = feed(ingest, "tele/a/SENSOR", doc)
    assert isinstance(d, Drop) and d.reason == reason, d
    assert ingest.drops == {reason: 1}


def test_int_bool_and_str_columns() -> None:
    spec = PlainStreamSpec.build(
        name="s",
        topic="dev/+",
        sensor_id_level=1,
        columns={
            "n": {"path": "n", "type": "int"},
            "b": {"path": "b", "type": "bool"},
            "s": {"path": "s", "type": "str"},
        },
    )
    ingest = PlainIngest([spec])
    ok = feed(ingest, "dev/x", {"n": 3.0, "b": "off", "s": "hi"})
    assert ok.values == (3, False, "hi") and isinstance(ok.values[0], int)
    for bad in (
        {"n": 3.5, "b": True, "s": ""},
        {"n": 1, "b": 1, "s": ""},
        {"n": 1, "b": True, "s": 5},
    ):
        assert feed(ingest, "dev/x", bad).reason == "wrong_type"


def test_paths_through_lists_and_msgpack() -> None:
    spec = PlainStreamSpec.build(
        name="s",
        topic="a/+/b",
        sensor_id_level=1,
        format="msgpack",
        columns={"v": {"path": "sensors.1.value"}},
    )
    ingest = PlainIngest([spec])
    doc = {"sensors": [{"value": 1}, {"value": 2.5}]}
    assert feed(ingest, "a/x/b", msgspec.msgpack.encode(doc)).values == (2.5,)
    assert feed(ingest, "a/x/b", msgspec.msgpack.encode({"sensors": [1]})).reason == "missing_path"
    assert feed(ingest, "a/x/b", b"\xc1").reason == "malformed"
    assert feed(ingest, "a/x/b", msgspec.msgpack.encode({1: 2})).reason == "missing_path"


def test_sensors_are_bounded_per_stream_and_forgotten_when_silent() -> None:
    ingest = PlainIngest([zigbee_spec()], max_sensors=2, forget_after_s=100.0)
    assert isinstance(feed(ingest, "zigbee2mqtt/a", {"temperature": 1}, mono=0), Reading)
    assert isinstance(feed(ingest, "zigbee2mqtt/b", {"temperature": 1}, mono=50), Reading)
    assert feed(ingest, "zigbee2mqtt/c", {"temperature": 1}, mono=60).reason == "too_many_sensors"
    # a was last heard at 0: forgotten after 100 s, which makes room for c.
    assert isinstance(feed(ingest, "zigbee2mqtt/c", {"temperature": 1}, mono=101), Reading)
    assert ingest.hello("a") is None and ingest.sensor_count() == 2


def test_one_sensor_id_feeds_one_plain_stream_and_bad_ids_are_dropped() -> None:
    ingest = PlainIngest([tasmota_spec(), zigbee_spec(topic="zb/+", sensor_id_level=1)])
    good = {"Time": T, "AM2301": {"Temperature": 1, "Humidity": 2}}
    assert isinstance(feed(ingest, "tele/x/SENSOR", good), Reading)
    assert feed(ingest, "zb/x", {"temperature": 1}).reason == "sensor_id_taken"
    assert feed(ingest, "tele//SENSOR", good).reason == "bad_sensor_id"
    assert feed(ingest, f"tele/{'x' * 200}/SENSOR", good).reason == "bad_sensor_id"


def test_a_topic_matching_two_streams_feeds_both() -> None:
    a = zigbee_spec(name="a", topic="home/+/state")
    b = zigbee_spec(
        name="b", topic="home/+/#", sensor_id_level=1, columns={"t": {"path": "temperature"}}
    )
    ingest = PlainIngest([a, b])
    out = ingest.feed("home/x/state", b'{"temperature": 3}', wall=T, mono=0)
    assert [type(o).__name__ for o in out] == ["Reading", "Drop"]  # x is a's: b may not take it
    assert ingest.subscriptions() == ["home/+/state", "home/+/#"]


def test_drops_are_logged_once_per_sensor(caplog: pytest.LogCaptureFixture) -> None:
    ingest = PlainIngest([zigbee_spec()])
    with caplog.at_level(logging.WARNING, "sensors.plain_decoder"):
        for sid in ("a", "a", "a", "b"):
            ingest.feed(f"zigbee2mqtt/{sid}", b"nope", wall=T, mono=0)
            ingest.feed(f"zigbee2mqtt/{sid}", b"{}", wall=T, mono=0)
    assert ingest.drops == {"malformed": 4, "missing_path": 4}
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 2 and "'a'" in logged[0] and "'b'" in logged[1]


def test_paths_and_topics() -> None:
    assert parse_path("AM2301.Temperature") == ("AM2301", "Temperature")
    assert parse_path("DS18B20-1.Temperature") == ("DS18B20-1", "Temperature")
    for bad in ("", "a..b", ".a", "a.", "a[0]", "a b", "*"):
        with pytest.raises(SpecError, match="path"):
            parse_path(bad)
    with pytest.raises(SpecError, match="deep"):
        parse_path("a.b.c", max_depth=2)
    assert topic_matches(["tele", "+", "SENSOR"], "tele/x/SENSOR") == ["tele", "x", "SENSOR"]
    assert topic_matches(["tele", "+", "SENSOR"], "tele/x/STATE") is None
    assert topic_matches(["a", "#"], "a/b/c") == ["a", "b", "c"]
    assert topic_matches(["a", "+"], "a/b/c") is None
    assert topics_overlap("+/sensors/+/data", "fjords/#")
    assert topics_overlap("fjords", "fjords/#")
    assert not topics_overlap("tele/+/SENSOR", "fjords/#")
    assert not topics_overlap("a/b", "a/b/c")


# -- fuzzing ------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=30,
)
docs = st.fixed_dictionaries(
    {},
    optional={
        "Time": json_values | st.sampled_from(["2026-11-23T16:17:00", "2026-02-30T00:00:00", "Z"]),
        "AM2301": st.fixed_dictionaries(
            {}, optional={"Temperature": json_values, "Humidity": json_values}
        )
        | json_values,
    },
)


def check(out: list[Reading | Drop]) -> None:
    for o in out:
        if isinstance(o, Drop):
            assert o.reason in DROP_REASONS
        else:
            assert math.isfinite(o.time)
            assert all(v is None or isinstance(v, float) for v in o.values)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.sampled_from(["json", "msgpack"]))
def test_random_bytes_never_raise(payload: bytes, fmt: str) -> None:
    ingest = PlainIngest([tasmota_spec(format=fmt, max_depth=3)])
    check(ingest.feed("tele/x/SENSOR", payload, wall=T, mono=0))


@settings(max_examples=300, deadline=None)
@given(docs, st.sampled_from(["json", "msgpack"]))
def test_random_documents_are_readings_or_counted_drops(doc: Any, fmt: str) -> None:
    ingest = PlainIngest([tasmota_spec(format=fmt, max_depth=3)])
    payload = json.dumps(doc).encode() if fmt == "json" else msgspec.msgpack.encode(doc)
    out = ingest.feed("tele/x/SENSOR", payload, wall=T, mono=0)
    check(out)
    assert sum(ingest.drops.values()) == sum(isinstance(o, Drop) for o in out)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_random_topics_never_raise(topic: str) -> None:
    ingest = PlainIngest([tasmota_spec(), zigbee_spec(topic="+/#", sensor_id_level=0)])
    check(ingest.feed(topic, b'{"temperature": 1}', wall=T, mono=0))


def test_msgpack_timestamps_and_nesting() -> None:
    spec = PlainStreamSpec.build(
        name="s",
        topic="m/+",
        sensor_id_level=1,
        format="msgpack",
        time_path="t",
        max_depth=2,
        columns={"v": {"path": "x.v"}},
    )
    ingest = PlainIngest([spec])
    when = datetime.fromtimestamp(T, UTC)
    assert feed(ingest, "m/a", msgspec.msgpack.encode({"t": when, "x": {"v": 1}})).time == T
    deep = msgspec.msgpack.encode({"t": T, "x": {"v": 1, "w": [1]}})
    assert feed(ingest, "m/a", deep).reason == "too_deep"
    deeper = b"\x91" * 5000 + b"\x90"  # a list in a list in ... 5000 deep: msgspec's own guard
    assert feed(ingest, "m/a", deeper).reason == "too_deep"


def test_local_time_zone_is_the_gateways() -> None:
    ingest = PlainIngest([tasmota_spec(time_zone="local")])
    doc = {"Time": "2026-11-23T16:17:00", "AM2301": {"Temperature": 1, "Humidity": 2}}
    want = datetime(2026, 11, 23, 16, 17).timestamp()  # naive: Python's local time
    assert feed(ingest, "tele/a/SENSOR", doc).time == want
