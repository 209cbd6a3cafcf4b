"""Plain MQTT devices as streams, end to end: the real daemon (`fjords-gateway run`) and a real
Mosquitto; Tasmota-style and Zigbee2MQTT-style JSON from three devices, published as the devices
do; a windowed query, a filter query and a join with a table registered over HTTP; hostile
payloads counted in /metrics while the daemon keeps ingesting."""

from __future__ import annotations

import asyncio
import json
import math
import re
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiomqtt

from tests.daemon import Daemon
from tests.support import ROOT, Broker, eventually

CONFIG = """
[mqtt]
url = "mqtt://{host}:{port}"

[[mqtt.streams]]
name = "climate"
topic = "tele/+/SENSOR"
sensor_id_level = 1
time_path = "Time"
[mqtt.streams.columns]
temperature = {{ path = "AM2301.Temperature", type = "float" }}
humidity = {{ path = "AM2301.Humidity", type = "float" }}

[[mqtt.streams]]
name = "zigbee"
topic = "zigbee2mqtt/+"
sensor_id_level = 1
max_payload_bytes = 4096
max_depth = 4
[mqtt.streams.columns]
temperature = {{ path = "temperature", type = "float" }}
battery = {{ path = "battery", type = "int", optional = true }}
occupancy = {{ path = "occupancy", type = "bool", optional = true }}

[tables]
rooms = "{rooms}"

[archive]
dir = "{archive}"
"""

WINDOWED = (
    "SELECT sensor, AVG(temperature) AS t, MAX(humidity) AS h, COUNT(*) AS n "
    "FROM climate [RANGE 10 SECONDS] GROUP BY sensor"
)
FILTER = "SELECT sensor, temperature, battery, occupancy FROM zigbee WHERE temperature > 25"
JOIN = (
    "SELECT c.sensor, r.room, c.temperature FROM climate AS c, rooms AS r "
    "WHERE r.sensor = c.sensor AND c.temperature > 22.5"
)


class Rows:
    """A query's results over Server-Sent Events, read in a thread (connected before publishing:
    results go to the clients connected at the time). The stream ends when the daemon stops."""

    def __init__(self, url: str) -> None:
        self.rows: list[dict[str, Any]] = []
        self._resp = urllib.request.urlopen(url, timeout=60)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for raw in self._resp:
                line = raw.decode().strip()
                if line.startswith("data: "):
                    row = json.loads(line[6:])
                    if "missed" not in row:
                        self.rows.append(row)
        except (OSError, ValueError):  # the daemon stopped
            return

    def wait(self, n: int, seconds: float = 30) -> list[dict[str, Any]]:
        eventually(
            lambda: len(self.rows),
            lambda got: got >= n,
            message=lambda: f"{n} rows: {self.rows}",
            timeout=seconds,
            interval=0.05,
        )
        return list(self.rows)


async def publish(b: Broker, messages: list[tuple[str, bytes]]) -> None:
    async with aiomqtt.Client(b.host, b.port, identifier="plain-devices") as client:
        for topic, payload in messages:
            await client.publish(topic, payload, qos=1)


def tasmota(sensor: str, t: float, temperature: float, humidity: float, *, iso_z: bool) -> tuple:
    """What Tasmota publishes every TelePeriod (its Time is local time, here UTC, no offset)."""
    d = datetime.fromtimestamp(t, UTC)
    stamp = d.strftime("%Y-%m-%dT%H:%M:%S") + ("+00:00" if iso_z else "")
    doc = {
        "Time": stamp,
        "AM2301": {"Temperature": temperature, "Humidity": humidity, "DewPoint": 8.1},
        "TempUnit": "C",
    }
    return f"tele/{sensor}/SENSOR", json.dumps(doc).encode()


def dropped(gw: Daemon) -> dict[str, float]:
    text = urllib.request.urlopen(f"{gw.url}/metrics", timeout=10).read().decode()
    out = {}
    for m in re.finditer(
        r'^fjords_dropped_total\{reason="([a-z_]+)",stage="mqtt_json"\} (\S+)$', text, re.M
    ):
        out[m[1]] = float(m[2])
    return out


def test_tasmota_and_zigbee2mqtt_devices_are_queried_as_streams(
    broker: Broker,
    tmp_path: Path,
) -> None:
    rooms = tmp_path / "rooms.csv"
    rooms.write_text("sensor,room\nkitchen,Kitchen\nhall,Hallway\n")
    archive = tmp_path / "archive"
    config = CONFIG.format(host=broker.host, port=broker.port, rooms=rooms, archive=archive)
    with Daemon(tmp_path, config) as gw:
        windowed = gw.post("/queries", {"sql": WINDOWED})["id"]
        filtered = gw.post("/queries", {"sql": FILTER})["id"]
        joined = gw.post("/queries", {"sql": JOIN})["id"]
        streams = {q: Rows(f"{gw.url}/queries/{q}/results") for q in (windowed, filtered, joined)}
        # Two Tasmota devices, a reading every 2 s of their time for 30 s, in the recent past.
        base = math.floor(time.time() / 10) * 10 - 120
        msgs = []
        for k in range(15):
            t = base + 2 * k
            msgs.append(tasmota("kitchen", t, 20.0 + k % 5, 40.0 + k, iso_z=False))
            msgs.append(tasmota("hall", t, 23.0, 50.0, iso_z=True))
        # A Zigbee2MQTT sensor: flat JSON, no time (arrival time), some fields only sometimes.
        for temp, extra in [(20.5, {"battery": 90}), (30.0, {"occupancy": True}), (26.5, {})]:
            doc = {"temperature": temp, "humidity": 41, "linkquality": 120, **extra}
            msgs.append(("zigbee2mqtt/living_room", json.dumps(doc).encode()))
        asyncio.run(publish(broker, msgs))

        # Windows [base, base+10) and [base+10, base+20) have closed for both Tasmota devices
        # (both passed base+20); each sensor had 5 readings in each.
        rows = streams[windowed].wait(4)
        by = {(r["sensor"], r["window_start"]): r for r in rows}
        for w in (base, base + 10):
            k0 = (w - base) // 2
            want_t = sum(20.0 + k % 5 for k in range(k0, k0 + 5)) / 5
            assert by["kitchen", w]["n"] == 5 and by["hall", w]["n"] == 5
            assert abs(by["kitchen", w]["t"] - want_t) < 1e-9
            assert by["kitchen", w]["h"] == 40.0 + k0 + 4
            assert by["hall", w]["t"] == 23.0 and by["hall", w]["window_end"] == w + 10
        zig = streams[filtered].wait(2)
        assert [(r["sensor"], r["temperature"]) for r in zig] == [
            ("living_room", 30.0),
            ("living_room", 26.5),
        ]
        assert zig[0]["occupancy"] is True and zig[0]["battery"] is None
        # The join: every hall reading (23.0) and kitchen's 23.0 and 24.0 ones, with the room.
        want_join = 15 + sum(1 for k in range(15) if 20.0 + k % 5 > 22.5)
        joins = streams[joined].wait(want_join)
        assert {(r["sensor"], r["room"]) for r in joins} == {
            ("kitchen", "Kitchen"),
            ("hall", "Hallway"),
        }

        sensors = {s["id"]: s for s in gw.get("/sensors")["sensors"]}
        assert set(sensors) == {"kitchen", "hall", "living_room"}
        for s in sensors.values():
            assert s["programmable"] is False and s["pending_controls"] == []
            assert s["counters"]["controls_sent"] == 0
        assert sensors["living_room"]["stream"] == "zigbee"
        assert sensors["kitchen"]["stream"] == "climate"
        assert gw.get("/sensors/kitchen")["programmable"] is False
        status = gw.get("/status")
        assert "climate" in json.dumps(status) and "zigbee" in json.dumps(status)
        cli = subprocess.run(
            [sys.executable, "-m", "gateway.cli", "sensors", "--url", gw.url, "--json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 0, cli.stderr
        assert {s["id"] for s in json.loads(cli.stdout)} == {"kitchen", "hall", "living_room"}

        # Hostile payloads: each counted under its reason, none stops ingestion.
        hostile = [
            ("zigbee2mqtt/living_room", b"not json"),
            ("zigbee2mqtt/living_room", b'{"a":' + b"[" * 50 + b"]" * 50 + b"}"),
            ("zigbee2mqtt/living_room", b'{"temperature": 1, "pad": "' + b"x" * 5000 + b'"}'),
            ("zigbee2mqtt/living_room", b'{"humidity": 40}'),
            ("zigbee2mqtt/living_room", b'{"temperature": "hot"}'),
            ("zigbee2mqtt/living_room", b"[1, 2]"),
            (
                "tele/kitchen/SENSOR",
                b'{"Time": "yesterday", "AM2301": {"Temperature": 1, "Humidity": 2}}',
            ),
            (
                "tele/kitchen/SENSOR",
                b'{"Time": 1e400, "AM2301": {"Temperature": 1, "Humidity": 2}}',
            ),
            ("tele/kitchen/SENSOR", b"\xff\xfe\x00"),
        ]
        asyncio.run(publish(broker, hostile))
        # Then good data again: still ingested.
        asyncio.run(publish(broker, [("zigbee2mqtt/living_room", b'{"temperature": 27.25}')]))
        after = streams[filtered].wait(3)
        assert after[-1]["temperature"] == 27.25
        d = dropped(gw)
        assert d == {
            "malformed": 3,
            "too_deep": 1,
            "oversize": 1,
            "missing_path": 1,
            "wrong_type": 1,
            "not_object": 1,
            "bad_time": 1,
        }, d
        health = gw.get("/healthz")
        assert health["status"] in ("ok", "degraded")
        assert all("mqtt_json" in r for r in health["reasons"]), health
        assert gw.running
    assert "Traceback" not in gw.tail(100_000)
    # Each plain stream is archived like traffic (the Spark jobs' input): what it accepted.
    import pyarrow.parquet as pq

    climate = pq.read_table(archive / "climate", partitioning=None).to_pylist()
    assert len(climate) == 30 and {r["sensor"] for r in climate} == {"kitchen", "hall"}
    zigbee = pq.read_table(archive / "zigbee", partitioning=None).to_pylist()
    assert [r["temperature"] for r in zigbee] == [20.5, 30.0, 26.5, 27.25]
    assert zigbee[0]["battery"] == 90 and zigbee[1]["occupancy"] is True
