"""Query results published to a real Mosquitto, with Home Assistant discovery and availability."""

from __future__ import annotations

import asyncio
import json

import aiomqtt

from gateway.config import Config, MqttConfig
from gateway.daemon import Gateway
from sensors.transports.broker import broker_address
from tests.support import Broker, async_eventually


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


async def test_results_are_published_and_discovered(broker: Broker) -> None:
    """Home Assistant gets one entity per query and result group: its own retained state topic,
    the aggregate as the value with the schema's unit, availability from the gateway's status;
    deleting the query deletes the entities."""
    cfg = Config()
    cfg.mqtt = MqttConfig(url=f"mqtt://{broker.host}:{broker.port}", home_assistant_discovery=True)
    sql = (
        "SELECT segment, AVG(speed) AS avg_speed, COUNT(*) AS n FROM traffic [RANGE 5 MINUTES] "
        "GROUP BY segment"
    )
    async with aiomqtt.Client(broker.host, broker.port, identifier="watcher") as watcher:
        await watcher.subscribe("fjords/#", qos=1)
        await watcher.subscribe("homeassistant/#", qos=1)
        async with Gateway(cfg) as gw:
            rq = gw.add_query(sql, {"publish": "mqtt"})
            gw.add_query("SELECT * FROM traffic")  # not published
            first = await _collect(watcher, 1)
            assert (first[0].topic.value, first[0].payload) == ("fjords/gateway/status", b"online")
            for t, seg, speed in ((1.0, "S1", 40.0), (2.0, "S2", 60.0), (3.0, "S1", 50.0)):
                gw.fjord.push("traffic", (t, "st1", speed, 34.0, -118.0, seg))
            gw.fjord.end_of_stream()
            got = await _collect(watcher, 2 + 2 * 2)  # 2 rows; per group a config and a state
            topics = {m.topic.value: m.payload for m in got}
            rows = [
                json.loads(m.payload) for m in got if m.topic.value == f"fjords/results/{rq.id}"
            ]
            assert sorted((r["segment"], r["avg_speed"], r["n"]) for r in rows) == [
                ("S1", 45.0, 2),
                ("S2", 60.0, 1),
            ]
            configs = {
                t: json.loads(p) for t, p in topics.items() if t.startswith("homeassistant/")
            }
            assert len(configs) == 2
            by_name = {c["name"]: c for c in configs.values()}
            s1 = by_name["avg_speed S1"]
            assert s1["value_template"] == "{{ value_json.avg_speed }}"
            assert s1["unit_of_measurement"] == "mph"
            assert s1["availability_topic"] == "fjords/gateway/status"
            assert s1["state_topic"] == s1["json_attributes_topic"]
            assert s1["state_topic"].startswith(f"fjords/results/{rq.id}/")
            assert json.loads(topics[s1["state_topic"]])["avg_speed"] == 45.0
            gw.remove_query(rq.id)
            gone = await _collect(watcher, 4)  # both configs and states, emptied
            assert all(m.payload == b"" for m in gone)
            assert {m.topic.value for m in gone} >= set(configs)
        last = await _collect(watcher, 1)
        assert (last[0].topic.value, last[0].payload) == ("fjords/gateway/status", b"offline")


def test_entity_shapes() -> None:
    from fjords.compile.sql.parser import parse
    from gateway.daemon import TRAFFIC_SCHEMA
    from gateway.home_assistant import entity_shape, object_id

    def shape(sql: str, cols: list[str]):
        return entity_shape(parse(sql), cols, TRAFFIC_SCHEMA)

    s = shape(
        "SELECT segment, COUNT(*) AS n, MAX(speed) AS top FROM traffic [RANGE 1 HOURS] "
        "GROUP BY segment",
        ["segment", "n", "top", "window_start", "window_end"],
    )
    assert (s.group_columns, s.value_column, s.unit) == (("segment",), "n", None)
    s = shape("SELECT station, speed FROM traffic", ["station", "speed"])
    assert (s.group_columns, s.value_column, s.unit) == ((), "speed", "mph")
    assert object_id("fjords", "q1", "S05") == "fjords_q1_S05"
    assert object_id("fjords", "q1", "a b") != object_id("fjords", "q1", "a/b")


async def test_spark_mqtt_sink_publishes_rows(broker: Broker) -> None:
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


async def test_bridge_is_supervised_through_a_broker_restart(broker: Broker) -> None:
    cfg = Config()
    cfg.simulation = None
    cfg.mqtt = MqttConfig(url=f"mqtt://{broker.host}:{broker.port}")
    async with Gateway(cfg) as gw:
        assert gw.mqtt is not None
        gw.mqtt.backoff = type(gw.mqtt.backoff)(0.05, 0.2)
        await gw.mqtt.wait_connected(10)
        assert gw.health()["status"] == "ok"
        broker.stop()
        await async_eventually(lambda: not gw.mqtt.stats.connected, timeout=60, interval=0.01)
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


async def test_the_bridge_sleeps_once_its_rows_are_out(broker: Broker) -> None:
    """A drained result subscription leaves its event set: the pump must not take that for new
    rows, or it spins on the event loop (and a SIGTERM then waited for the spinning task)."""
    cfg = Config()
    cfg.mqtt = MqttConfig(url=f"mqtt://{broker.host}:{broker.port}")
    async with Gateway(cfg) as gw:
        bridge = gw.mqtt
        assert bridge is not None
        rq = gw.add_query("SELECT * FROM traffic", {"publish": "mqtt"})
        await bridge.wait_connected(10)
        gw.fjord.push("traffic", (1.0, "st1", 40.0, 34.0, -118.0, "S1"))
        await async_eventually(lambda: bridge.published >= 1)
        sub = bridge._subs[rq.id]
        calls = 0
        pending = sub.pending

        def counted() -> int:
            nonlocal calls
            calls += 1
            return pending()

        sub.pending = counted  # type: ignore[method-assign]
        await asyncio.sleep(0.3)  # idle: a spinning pump asks thousands of times meanwhile
        assert calls < 10


async def _retained(broker: Broker, topic: str) -> dict:
    """What a client subscribing now gets: the topic's retained message."""
    async with aiomqtt.Client(broker.host, broker.port, identifier="late") as late:
        await late.subscribe(topic, qos=1)
        (msg,) = await _collect(late, 1)
        assert msg.retain
        return json.loads(msg.payload)


async def test_rolled_up_groups_are_named_and_early_rows_are_the_retained_state(
    broker: Broker,
) -> None:
    """A ROLLUP query's total rows get their own entities, "all segments" rather than "None";
    an EMIT CHANGES query's retained state is its latest row, early (`final` false, `as_of`)
    until the window closes, then final."""
    cfg = Config()
    cfg.mqtt = MqttConfig(url=f"mqtt://{broker.host}:{broker.port}", home_assistant_discovery=True)
    rollup = (
        "SELECT segment, station, AVG(speed) AS avg_speed FROM traffic [RANGE 1 HOUR] "
        "GROUP BY ROLLUP(segment, station)"
    )
    changes = (
        "SELECT segment, AVG(speed) AS avg_speed FROM traffic [RANGE 1 HOUR] "
        "GROUP BY segment EMIT CHANGES EVERY 10 MINUTES"
    )
    async with aiomqtt.Client(broker.host, broker.port, identifier="watcher") as watcher:
        await watcher.subscribe("homeassistant/#", qos=1)
        async with Gateway(cfg) as gw:
            r = gw.add_query(rollup, {"publish": "mqtt"})
            c = gw.add_query(changes, {"publish": "mqtt"})
            for t, st, speed, seg in ((10.0, "a", 40.0, "S1"), (20.0, "b", 60.0, "S1")):
                gw.fjord.push("traffic", (t, st, speed, 34.0, -118.0, seg))
            for st in "ab":  # both sensors past 1200 s: the watermark is
                gw.fjord.push("traffic", (1300.0, st, 50.0, 34.0, -118.0, "S1"))
            configs = [json.loads(m.payload) for m in await _collect(watcher, 1)]
            (early,) = [x for x in configs if x["device"]["name"].endswith(c.id)]
            want = {"segment": "S1", "avg_speed": 50.0, "final": False, "as_of": 1200.0}
            got = await async_eventually(
                lambda: _retained(broker, early["state_topic"]),
                until=lambda row: row.get("as_of") == 1200.0,
                timeout=30,
                retry_on=(TimeoutError,),
            )
            assert {k: got[k] for k in want} == want
            gw.fjord.end_of_stream()
            configs += [json.loads(m.payload) for m in await _collect(watcher, 4)]
            names = {x["name"]: x for x in configs if x["device"]["name"].endswith(r.id)}
            assert set(names) == {
                "avg_speed S1 a",
                "avg_speed S1 b",
                "avg_speed S1 all stations",
                "avg_speed all segments all stations",
            }
            total = names["avg_speed all segments all stations"]
            assert total["object_id"].startswith(f"fjords_{r.id}_all_all_")
            assert "None" not in json.dumps(configs)
            state = await _retained(broker, total["state_topic"])
            assert (state["segment"], state["station"], state["avg_speed"]) == (None, None, 50.0)
            final = await _retained(broker, early["state_topic"])
            assert (final["final"], final["as_of"], final["avg_speed"]) == (True, 3600.0, 50.0)
