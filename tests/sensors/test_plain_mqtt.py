"""The plain MQTT devices' transport against a real Mosquitto: a device's JSON becomes a one-row
`Samples` for the proxies, a retained message (a device's last state, re-sent at every
subscription) is skipped, a bad payload is counted, and no control can be sent."""

from __future__ import annotations

import asyncio

import aiomqtt
import pytest

from sensors.plain_decoder import PlainStreamSpec
from sensors.protocol import Control, Samples
from sensors.transports.base import Inbound, TransportUnavailable
from sensors.transports.broker import BrokerSettings
from sensors.transports.plain_mqtt import PlainMqttTransport
from tests.support import Broker

SPEC = PlainStreamSpec.build(
    name="zigbee",
    topic="zigbee2mqtt/+",
    sensor_id_level=1,
    columns={"temperature": {"path": "temperature"}},
)


async def test_readings_arrive_retained_are_skipped_bad_ones_counted(broker: Broker) -> None:
    async with aiomqtt.Client(broker.host, broker.port) as device:
        await device.publish("zigbee2mqtt/old", b'{"temperature": 1}', qos=1, retain=True)
        async with PlainMqttTransport(
            [SPEC], BrokerSettings(broker.host, broker.port), clean_session=True
        ) as transport:
            await transport.wait_connected(10)
            await device.publish("zigbee2mqtt/hall", b"{oops", qos=1)
            await device.publish("zigbee2mqtt/hall", b'{"temperature": 21.5}', qos=1)
            got: Inbound = await asyncio.wait_for(anext(aiter(transport.messages())), 10)
            assert got.sensor_id == "hall" and isinstance(got.message, Samples)
            assert got.message.rows == ((21.5,),)
            assert transport.retained_skipped == 1
            assert transport.drop_counts() == {("mqtt_json", "malformed"): 1}
            hello, stream = transport.implied_hello("hall")  # type: ignore[misc]
            assert stream == "zigbee" and hello.schema == (("temperature", "float"),)
            assert transport.implied_hello("old") is None
            with pytest.raises(TransportUnavailable, match="takes no controls"):
                await transport.send("hall", Control.wake("hall"))
            assert transport.stats.sent == 0
