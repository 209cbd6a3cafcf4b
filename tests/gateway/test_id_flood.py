"""A flood of made-up sensor ids: the real daemon against a real Mosquitto, a simulated fleet
of real motes, and one broker client that publishes readings for 50,000 random ids as fast as
it can (QoS 0, no hellos). The real sensors' readings keep reaching their query; the flood is
refused past `[sensors] max_new_per_minute` and counted; what got in is forgotten within
`forget_unknown_after_s` (lowered here); a real sensor that starts after the flood is in the
catalog within a minute; /sensors stays one small page; the log stays short (one line per
interval, not one per id). (On the code before the limit: a log line per id, nothing
counted.)"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path

import aiomqtt
import paho.mqtt.client as mqtt
import pandas as pd
import pytest

from sensors.protocol import Hello, Samples, encode_message
from tests.daemon import Daemon
from tests.gateway.test_discovery import _fleet
from tests.support import Broker, eventually, shared_file

pytestmark = [pytest.mark.needs_mosquitto, pytest.mark.timeout(240)]

JUNK = 50_000


def _flood(broker: Broker) -> float:
    """Readings for JUNK random ids from one client (paho, QoS 0: as fast as the socket takes
    them); returns how long publishing took."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="flooder")
    client.max_queued_messages_set(0)
    client.connect(broker.host, broker.port)
    client.loop_start()
    start = time.monotonic()
    try:
        info = None
        for i in range(JUNK):
            sid = f"junk{i:05d}x{i * 7919 % 100_003}"
            msg = Samples(sensor_id=sid, seq=0, times=(1_330_588_800.0 + i,), rows=((55.0,),))
            info = client.publish(f"fjords/sensors/{sid}/data", encode_message(msg), qos=0)
        assert info is not None
        info.wait_for_publish(60)
        return time.monotonic() - start
    finally:
        client.disconnect()
        client.loop_stop()


async def _newcomer(broker: Broker, sid: str, readings: int) -> None:
    """A real sensor that starts after the flood: its hello, then readings."""
    hello = Hello(
        sensor_id=sid,
        schema=(("speed", "float"),),
        programs=("raw",),
        program="raw",
        sample_period_ms=300_000.0,
        attributes={"station": sid, "segment": "S99", "latitude": 34.0, "longitude": -118.0},
    )
    async with aiomqtt.Client(broker.host, broker.port, identifier=f"mote-{sid}") as c:
        await c.publish(f"fjords/sensors/{sid}/hello", encode_message(hello), qos=1, retain=True)
        for k in range(readings):
            msg = Samples(
                sensor_id=sid, seq=k + 1, times=(1_330_588_800.0 + 300 * k,), rows=((60.0,),)
            )
            await c.publish(f"fjords/sensors/{sid}/data", encode_message(msg), qos=1)
            await asyncio.sleep(0.05)


def test_fifty_thousand_made_up_ids_do_not_lock_out_real_sensors(
    broker: Broker, tmp_path: Path
) -> None:
    stations = pd.read_csv(shared_file("data/metr-la/stations.csv"), dtype={"station": str})
    real = list(stations.station[:2])
    gw = Daemon(
        tmp_path,
        f'[mqtt]\nurl = "mqtt://{broker.host}:{broker.port}"\nqos = 0\n'
        "[simulation]\nenabled = false\n"
        "[sensors]\nforget_unknown_after_s = 3\n",
    ).start()
    motes = _fleet(
        tmp_path, 24, 2, 600, "--transport", "mqtt", "--broker", f"{broker.host}:{broker.port}"
    )
    try:
        qid = gw.post("/queries", {"sql": "SELECT station, speed FROM traffic"})["id"]
        eventually(
            lambda: gw.get(f"/queries/{qid}")["rows"], lambda n: n > 0, message=gw.tail, timeout=40
        )
        lines_before = len(gw.tail(10**8).splitlines())
        took = _flood(broker)
        print(f"published {JUNK} junk readings in {took:.1f} s")
        # The real sensors' readings keep arriving.
        after = gw.get(f"/queries/{qid}")["rows"]
        eventually(
            lambda: gw.get(f"/queries/{qid}")["rows"],
            lambda n: n > after + 5,
            message=lambda: f"rows keep coming: {gw.tail()}",
            timeout=60,
        )
        refused = eventually(
            lambda: gw.metric('fjords_sensors_refused_total{reason="new_id_rate"}'),
            lambda n: n > JUNK // 2,  # (QoS 0: a loaded broker may drop some)
            message=gw.tail,
            timeout=60,
        )
        assert refused <= JUNK
        # What got in (a burst of max_new_per_minute) is forgotten within minutes.
        eventually(
            lambda: gw.metric("fjords_sensors_unknown"), lambda n: n == 0, timeout=60, interval=1
        )
        # A real sensor that starts now is accepted within a minute.
        asyncio.run(_newcomer(broker, "newbie", 5))
        entry = eventually(
            lambda: gw.get("/sensors/newbie"), message=gw.tail, timeout=60, retry_on=(OSError,)
        )
        assert entry["status"] in ("online", "asleep")
        # /sensors is one small page, junk never in it.
        body = urllib.request.urlopen(f"{gw.url}/sensors", timeout=10).read()
        page = gw.get("/sensors")
        assert page["total"] == 3 and {s["id"] for s in page["sensors"]} == {*real, "newbie"}
        assert len(body) < 100_000
        health = gw.get("/healthz")  # answering, and saying what it refuses
        assert any("new_id_rate" in r for r in health["reasons"]), health
        # One line per interval for the refusals, not one per id.
        lines = gw.tail(10**8).splitlines()[lines_before:]
        assert len(lines) < 100, "\n".join(lines[:50])
        assert motes.poll() is None, "the fleet ended before the test did: slow it down"
    finally:
        motes.kill()
        motes.wait(timeout=10)
        gw.stop()
