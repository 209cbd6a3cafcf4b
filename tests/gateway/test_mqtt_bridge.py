"""Query results published to a real Mosquitto, with Home Assistant discovery and availability."""

from __future__ import annotations

import asyncio
import json

import aiomqtt

from gateway.config import Config, MqttConfig
from gateway.daemon import Gateway
from gateway.mqtt_bridge import broker_address
from tests.sensors.conftest import Broker, broker  # noqa: F401 - the shared broker fixture


def test_broker_urls() -> None:
    assert broker_address("mqtt://10.0.0.5:1884") == ("10.0.0.5", 1884, False)
    assert broker_address("mqtts://broker") == ("broker", 8883, True)
    assert broker_address("localhost") == ("localhost", 1883, False)


async def _collect(client: aiomqtt.Client, n: int, timeout: float = 10) -> list[aiomqtt.Message]:
    got: list[aiomqtt.Message] = []

    async def read() -> None:
        async for msg in client.messages:
            got.append(msg)
            if len(got) >= n:
                return

    await asyncio.wait_for(read(), timeout)
    return got


async def test_results_are_published_and_discovered(broker: Broker) -> None:  # noqa: F811
    cfg = Config()
    cfg.mqtt = MqttConfig(url=f"mqtt://{broker.host}:{broker.port}", home_assistant_discovery=True)
    async with aiomqtt.Client(broker.host, broker.port, identifier="watcher") as watcher:
        await watcher.subscribe("fjords/#", qos=1)
        await watcher.subscribe("homeassistant/#", qos=1)
        async with Gateway(cfg) as gw:
            rq = gw.add_query(
                "SELECT station, speed FROM traffic WHERE speed > 10", {"publish": "mqtt"}
            )
            gw.add_query("SELECT * FROM traffic")  # not published
            first = await _collect(watcher, 2)  # status online + discovery config
            topics = {m.topic.value: m.payload for m in first}
            assert topics["fjords/gateway/status"] == b"online"
            disc = json.loads(topics[f"homeassistant/sensor/fjords_{rq.id}/config"])
            assert disc["state_topic"] == f"fjords/results/{rq.id}"
            assert disc["availability_topic"] == "fjords/gateway/status"
            for t, speed in ((1.0, 5.0), (2.0, 42.0), (3.0, 61.5)):
                gw.fjord.push("traffic", (t, "st1", speed, 34.0, -118.0, "S1"))
            rows = await _collect(watcher, 2)
            assert [m.topic.value for m in rows] == [f"fjords/results/{rq.id}"] * 2
            assert [json.loads(m.payload) for m in rows] == [
                {"station": "st1", "speed": 42.0},
                {"station": "st1", "speed": 61.5},
            ]
        last = await _collect(watcher, 1)
        assert (last[0].topic.value, last[0].payload) == ("fjords/gateway/status", b"offline")


async def test_spark_mqtt_sink_publishes_rows(broker: Broker) -> None:  # noqa: F811
    from gateway.spark.sinks import sink_from_spec

    sink = sink_from_spec(f"mqtt://{broker.host}:{broker.port}/fjords/results/spark-q")
    async with aiomqtt.Client(broker.host, broker.port, identifier="spark-watcher") as watcher:
        await watcher.subscribe("fjords/results/#", qos=1)
        # foreachBatch calls deliver on a Spark thread: do the same here.
        await asyncio.to_thread(
            sink.deliver,
            7,
            [{"segment": "S05", "avg_speed": 31.5}, {"segment": "S14", "avg_speed": 22.0}],
        )
        got = await _collect(watcher, 2)
    assert [json.loads(m.payload) for m in got] == [
        {"segment": "S05", "avg_speed": 31.5},
        {"segment": "S14", "avg_speed": 22.0},
    ]


async def test_bridge_is_supervised_through_a_broker_restart(broker: Broker) -> None:  # noqa: F811
    cfg = Config()
    cfg.simulation = None
    cfg.mqtt = MqttConfig(url=f"mqtt://{broker.host}:{broker.port}")
    async with Gateway(cfg) as gw:
        assert gw.mqtt is not None
        gw.mqtt.backoff = type(gw.mqtt.backoff)(0.05, 0.2)
        await gw.mqtt.wait_connected(10)
        assert gw.health()["status"] == "ok"
        broker.stop()
        while gw.mqtt.stats.connected:
            await asyncio.sleep(0.01)
        assert any("mqtt-bridge" in r for r in gw.health()["reasons"])
        broker.start()
        await gw.mqtt.wait_connected(10)
        assert gw.mqtt.connects == 2 and gw.mqtt.stats.reconnects == 1
        assert gw.health() == {"status": "ok", "reasons": []}
        rq = gw.add_query("SELECT station, speed FROM traffic", {"publish": "mqtt"})
        async with aiomqtt.Client(broker.host, broker.port, identifier="watcher2") as watcher:
            await watcher.subscribe(f"fjords/results/{rq.id}", qos=1)
            gw.fjord.push("traffic", (1.0, "st1", 42.0, 34.0, -118.0, "S1"))
            got = await _collect(watcher, 1)
        assert json.loads(got[0].payload) == {"station": "st1", "speed": 42.0}
