"""Plain MQTT devices through the proxy manager: no hello is expected (the first reading makes the
sensor's proxy, from the hello its transport implies), no control is ever sent whatever the
queries want, the catalog marks them not programmable, and the catalog's bounds hold."""

from __future__ import annotations

import json
import time

from fjords.engine import Engine
from fjords.schema import Field, Schema
from gateway.sensors_view import sensors_catalog
from proxies.manager import ProxyManager
from sensors.plain_decoder import PlainStreamSpec
from sensors.transports.plain_mqtt import PlainMqttTransport
from tests.proxies.helpers import TRAFFIC, make_fjord

SPEC = PlainStreamSpec.build(
    name="zigbee",
    topic="zigbee2mqtt/+",
    sensor_id_level=1,
    time_path="t",
    columns={"temperature": {"path": "temperature"}},
)
ZIGBEE = Schema(
    [Field("time", "float"), Field("sensor", "str"), Field("temperature", "float")], time="time"
)
T0 = float(int(time.time()) // 60 * 60 - 600)


def publish(t: PlainMqttTransport, sensor: str, when: float, temperature: float) -> None:
    doc = {"t": when, "temperature": temperature}
    t.on_message(f"zigbee2mqtt/{sensor}", json.dumps(doc).encode())


async def test_first_reading_makes_a_proxy_that_never_sends_controls() -> None:
    fjord = make_fjord(traffic=TRAFFIC, zigbee=ZIGBEE)
    engine = Engine(fjord)
    rows: list[tuple] = []
    windowed = engine.add_query(
        "SELECT sensor, AVG(temperature) AS t FROM zigbee [RANGE 10 SECONDS] GROUP BY sensor "
        "SAMPLE PERIOD 5 SECONDS LIFETIME 30 DAYS"
    )
    windowed.sink.add_batch_callback(rows.extend)
    transport = PlainMqttTransport([SPEC])  # not entered: no broker, messages fed by hand
    async with ProxyManager(fjord, [transport]) as manager:
        for k in range(6):
            publish(transport, "a", T0 + 2 * k, 20.0 + k)
            publish(transport, "b", T0 + 2 * k, 10.0)
        await manager.settle()
        manager.queries_changed()
        manager.tick()
        await manager.settle()
        fjord.run_until_idle()
        catalog = {s["id"]: s for s in sensors_catalog(manager)}
        assert set(catalog) == {"a", "b"}
        for s in catalog.values():
            assert s["programmable"] is False and s["wanted"] is None
            assert s["stream"] == "zigbee" and s["pending_controls"] == []
        assert manager.stats.controls_sent == 0 and transport.stats.sent == 0
        assert manager.stats.before_hello == 0 and manager.discovery.stats.hello_requests == 0
        assert manager.what_if(windowed.demand) == []  # EXPLAIN: nothing to change on them
        # Windows [T0, T0+10) closed: both sensors passed T0+10.
        got = {(r[0], r[2]): r[1] for r in rows}
        assert got[("a", T0)] == sum(20.0 + k for k in range(5)) / 5
        assert got[("b", T0)] == 10.0
        # Forgotten, then heard again: a new proxy from the implied hello.
        manager.forget("a")
        publish(transport, "a", T0 + 20, 1.0)
        await manager.settle()
        assert "a" in manager.proxies and sensors_catalog(manager)[0]["programmable"] is False


async def test_the_catalog_bound_holds_for_plain_devices() -> None:
    fjord = make_fjord(zigbee=ZIGBEE)
    transport = PlainMqttTransport([SPEC])
    async with ProxyManager(fjord, [transport], max_sensors=2) as manager:
        for sid in ("a", "b", "c"):
            publish(transport, sid, T0, 1.0)
        await manager.settle()
        assert sorted(manager.proxies) == ["a", "b"]
        assert manager.stats.catalog_full == 1 and manager.stats.no_proxy == 1
