"""A mote that goes quiet is noticed, whatever a control claimed: the real daemon, a real
Mosquitto and the simulated fleet (`simulate-motes`). Another broker client sends one mote a
`sleep` the gateway never sent; the mote obeys and acknowledges it, and from then on opens its
receive windows but sends no readings. The gateway still counts on its readings (it asked for
`raw`): within a few of its periods the sensor is `stalled` on /sensors, /healthz is degraded
naming it and `fjords_sensors_stalled` says 1; a (forged) `wake` brings its data back, and the
stall is cleared. (On the code before stalls existed: "online" and "ok" throughout.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiomqtt
import pandas as pd
import pytest

from sensors.protocol import Control, encode_message
from tests.daemon import Daemon
from tests.gateway.test_discovery import _fleet
from tests.support import Broker, eventually, shared_file

pytestmark = [pytest.mark.needs_mosquitto, pytest.mark.timeout(240)]

MOTES = 3


async def _forge(broker: Broker, control: Control) -> None:
    async with aiomqtt.Client(broker.host, broker.port, identifier="not-the-gateway") as c:
        topic = f"fjords/sensors/{control.sensor_id}/control"
        await c.publish(topic, encode_message(control), qos=1)


def _status(gw: Daemon, sid: str) -> str:
    return str(gw.get(f"/sensors/{sid}")["status"])


def test_a_mote_put_to_sleep_by_someone_else_is_stalled_until_its_data_resumes(
    broker: Broker, tmp_path: Path
) -> None:
    ids = list(
        pd.read_csv(shared_file("data/metr-la/stations.csv"), dtype={"station": str}).station[
            :MOTES
        ]
    )
    victim, others = ids[0], ids[1:]
    gw = Daemon(
        tmp_path,
        f'[mqtt]\nurl = "mqtt://{broker.host}:{broker.port}"\n[simulation]\nenabled = false\n',
    ).start()
    # 300 s readings at 1200x: one every 0.25 s of wall clock, for 144 s (the stall shows
    # after 3 of its raw packets' gaps, so a faster fleet stalls sooner)
    motes = _fleet(
        tmp_path, 48, MOTES, 1200, "--transport", "mqtt", "--broker", f"{broker.host}:{broker.port}"
    )
    try:
        gw.post("/queries", {"sql": "SELECT station, speed FROM traffic"})
        eventually(
            lambda: [_status(gw, sid) for sid in ids],
            lambda s: s == ["online"] * MOTES,
            message=gw.tail,
            timeout=40,
            interval=0.5,
            retry_on=(OSError,),  # (a 404 until its hello)
        )
        assert gw.get("/healthz")["status"] == "ok", gw.get("/healthz")
        asyncio.run(_forge(broker, Control.sleep(victim, 60_000.0, seq=4242)))
        entry = eventually(
            lambda: gw.get(f"/sensors/{victim}"),
            lambda e: e["status"] == "stalled",
            message=lambda: f"{victim} stalled: {gw.get(f'/sensors/{victim}')} {gw.tail()}",
            timeout=60,
            interval=0.5,
        )
        assert entry["counters"]["unknown_acks"] >= 1  # it acked a sleep nobody here sent
        assert entry["program"] == "raw" and entry["stall"]["why"]
        health = gw.get("/healthz")
        assert health["status"] == "degraded", health
        assert any("1 sensor stalled" in r and victim in r for r in health["reasons"]), health
        assert gw.metric("fjords_sensors_stalled") == 1
        assert gw.metric("fjords_sensor_stalls_total") >= 1
        assert [_status(gw, sid) for sid in others] == ["online"] * len(others)
        assert [s["id"] for s in gw.get("/sensors?status=stalled")["sensors"]] == [victim]
        # Its data resumes: cleared.
        asyncio.run(_forge(broker, Control.wake(victim, seq=4243)))
        eventually(
            lambda: _status(gw, victim),
            lambda s: s == "online",
            message=gw.tail,
            timeout=60,
            interval=0.5,
        )
        assert gw.metric("fjords_sensors_stalled") == 0
        assert not any("stalled" in r for r in gw.get("/healthz")["reasons"])
        assert motes.poll() is None, "the fleet ended before the test did: slow it down"
        log = gw.tail(100_000)
        assert f"sensor '{victim}' stalled" in log and f"sensor '{victim}' resumed" in log
    finally:
        motes.kill()
        motes.wait(timeout=10)
        gw.stop()
