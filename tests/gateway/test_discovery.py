"""Discovery that survives boot order: motes that were running before the gateway started (or
restarted) are asked to introduce themselves, and every one of them shows up and feeds queries.

A real mote on /dev/ttyUSB0 that booted first sends data, never a hello again; the gateway must
ask. Here the simulated fleet talks through a real pseudo-terminal base station."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from tests.daemon import Daemon
from tests.support import ROOT, Broker, eventually, shared_file

MOTES = 12


def _wait_for_sensors(gw: Daemon, n: int, seconds: float) -> list[dict]:
    return eventually(
        lambda: gw.get("/sensors")["sensors"],
        lambda sensors: len(sensors) >= n,
        message=f"{n} sensors discovered",
        timeout=seconds,
        interval=0.5,
    )


def _wait_for_rows(gw: Daemon, qid: str, seconds: float) -> int:
    return eventually(
        lambda: gw.get(f"/queries/{qid}")["rows"],
        lambda rows: rows > 0,
        message=f"a row reaches query {qid}",
        timeout=seconds,
        interval=0.5,
    )


def _fleet(tmp_path: Path, hours: int, n: int, speedup: int, *link: str) -> subprocess.Popen:
    """`simulate-motes` over `link` (its transport options): the first `n` METR-LA stations,
    the first `hours` of their readings, `speedup` times real time; stderr in motes.log."""
    readings = pd.read_csv(shared_file("data/metr-la/readings.csv"), dtype={"station": str})
    trace = tmp_path / "readings.csv"
    readings[readings.time < readings.time.min() + hours * 3600].to_csv(trace, index=False)
    return subprocess.Popen(
        [
            sys.executable, "-m", "gateway.cli", "simulate-motes", *link, "--trace", str(trace),
            "--stations", str(shared_file("data/metr-la/stations.csv")), "--limit", str(n),
            "--speedup", str(speedup),
        ],
        cwd=ROOT,
        stderr=(tmp_path / "motes.log").open("w"),
    )  # fmt: skip


def test_serial_motes_that_booted_first_and_a_gateway_restart(tmp_path: Path) -> None:
    device = tmp_path / "ttyMOTES"
    motes_log = tmp_path / "motes.log"
    # 288 readings a mote
    motes = _fleet(tmp_path, 24, MOTES, 600, "--transport", "serial", "--device", str(device))
    gw = Daemon(
        tmp_path, f'[state]\ndir = "{tmp_path / "state"}"\n[[serial]]\ndevice = "{device}"\n'
    )
    try:
        eventually(
            device.exists,
            message=lambda: f"the fleet opens {device}: {motes_log.read_text()}",
            timeout=20,
        )
        time.sleep(5)  # the motes have said hello to nobody and are sending data now
        gw.start()
        qid = gw.post("/queries", {"sql": "SELECT station, speed FROM traffic"})["id"]
        _wait_for_sensors(gw, MOTES, 40)
        _wait_for_rows(gw, qid, 20)
        # what the motes sent before their hellos waited for them, and so did the stream
        assert gw.metric("fjords_stream_late_samples_total") == 0, gw.tail()
        assert gw.stop() == 0
        gw.start()  # restarted while the motes run
        _wait_for_sensors(gw, MOTES, 40)
        _wait_for_rows(gw, qid, 20)
        assert gw.metric("fjords_stream_late_samples_total") == 0, gw.tail()
        assert motes.poll() is None, "the fleet ended before the test did: slow it down"
        assert gw.stop() == 0
    finally:
        gw.kill()
        motes.kill()
        motes.wait(timeout=10)


def test_mqtt_motes_whose_retained_hellos_the_broker_lost(broker: Broker, tmp_path: Path) -> None:
    """The broker lost the retained hellos (restarted without persistence, or a clean-up): the
    gateway that starts now hears only data, and must ask each mote to introduce itself."""
    import asyncio

    import aiomqtt

    stations_csv = shared_file("data/metr-la/stations.csv")
    ids = list(pd.read_csv(stations_csv, dtype={"station": str}).station[:MOTES])
    motes = _fleet(
        tmp_path, 24, MOTES, 600, "--transport", "mqtt", "--broker", f"{broker.host}:{broker.port}"
    )

    async def forget_hellos() -> None:
        """Once every mote has published its hello (retained), delete them."""
        async with aiomqtt.Client(broker.host, broker.port) as c:
            await c.subscribe("fjords/sensors/+/hello", qos=1)
            seen: set[str] = set()
            async with asyncio.timeout(60):
                async for m in c.messages:
                    if m.payload:
                        seen.add(str(m.topic).split("/")[2])
                    if seen >= set(ids):
                        break
            for sid in ids:  # an empty retained message deletes the retained one
                await c.publish(f"fjords/sensors/{sid}/hello", b"", qos=1, retain=True)

    gw = Daemon(tmp_path, f'[mqtt]\nurl = "mqtt://{broker.host}:{broker.port}"\n')
    try:
        asyncio.run(forget_hellos())
        gw.start()
        qid = gw.post("/queries", {"sql": "SELECT station, speed FROM traffic"})["id"]
        _wait_for_sensors(gw, MOTES, 40)
        _wait_for_rows(gw, qid, 20)
        assert gw.metric("fjords_stream_late_samples_total") == 0, gw.tail()
        assert motes.poll() is None, "the fleet ended before the test did: slow it down"
        assert gw.stop() == 0
    finally:
        gw.kill()
        motes.kill()
        motes.wait(timeout=10)


def test_mqtt_gateway_restart_under_a_publishing_fleet_loses_nothing_as_late(
    broker: Broker,
    tmp_path: Path,
) -> None:
    """The gateway restarts (an upgrade) while a QoS 1 fleet keeps publishing: the broker kept
    what the gateway's session missed and hands it over on reconnect, before the motes' hellos
    (those come on subscribing). That backlog is held until each mote's hello, while motes
    whose hello came first already push their newer readings: the stream's watermark must wait
    for the held ones, or they are dropped as late (1,884 readings of the 207-mote fleet, in a
    hands-on run)."""
    motes = _fleet(
        tmp_path, 48, 40, 3000,
        "--transport", "mqtt", "--broker", f"{broker.host}:{broker.port}", "--qos", "1",
    )  # fmt: skip
    gw = Daemon(
        tmp_path,
        f'[state]\ndir = "{tmp_path / "state"}"\n[mqtt]\nurl = "mqtt://{broker.host}:{broker.port}"\n'
        "[simulation]\nenabled = false\n",
    )
    try:
        time.sleep(2)
        gw.start()
        qid = gw.post("/queries", {"sql": "SELECT station, speed FROM traffic"})["id"]
        _wait_for_sensors(gw, 40, 40)
        _wait_for_rows(gw, qid, 20)
        assert gw.stop() == 0
        time.sleep(3)  # the fleet publishes on; the broker keeps it for the gateway's session
        gw.start()
        _wait_for_sensors(gw, 40, 40)
        time.sleep(3)
        assert motes.poll() is None, "the fleet ended before the test did: slow it down"
        assert gw.metric("fjords_stream_late_samples_total") == 0, gw.tail()
        assert gw.stop() == 0
    finally:
        gw.kill()
        motes.kill()
        motes.wait(timeout=10)
