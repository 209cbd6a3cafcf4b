"""Discovery that survives boot order: motes that were running before the gateway started (or
restarted) are asked to introduce themselves, and every one of them shows up and feeds queries.

A real mote on /dev/ttyUSB0 that booted first sends data, never a hello again; the gateway must
ask. Here the simulated fleet talks through a real pseudo-terminal base station."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd

from tests.gateway.test_cli import free_port
from tests.sensors.conftest import Broker, broker  # noqa: F401 - the shared broker fixture
from tests.support import ROOT, shared_file

MOTES = 12


def _get(url: str) -> dict:
    return json.loads(urllib.request.urlopen(url, timeout=5).read())


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    return json.loads(urllib.request.urlopen(req, timeout=10).read())


def _start_gateway(config: Path, url: str, log: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "run", "--config", str(config)],
        cwd=ROOT,
        stderr=log.open("a"),
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            urllib.request.urlopen(f"{url}/healthz", timeout=1)
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("gateway did not start")


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the gateway did not stop on SIGTERM") from None


def _wait_for_sensors(url: str, n: int, seconds: float) -> list[dict]:
    deadline = time.monotonic() + seconds
    sensors: list[dict] = []
    while time.monotonic() < deadline:
        sensors = _get(f"{url}/sensors")["sensors"]
        if len(sensors) >= n:
            return sensors
        time.sleep(0.5)
    raise AssertionError(f"{len(sensors)} of {n} sensors discovered after {seconds} s")


def _wait_for_rows(url: str, qid: str, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        rows = _get(f"{url}/queries/{qid}")["rows"]
        if rows > 0:
            return rows
        time.sleep(0.5)
    raise AssertionError(f"no row reached query {qid} within {seconds} s")


def test_serial_motes_that_booted_first_and_a_gateway_restart(tmp_path: Path) -> None:
    readings = pd.read_csv(shared_file("data/metr-la/readings.csv"), dtype={"station": str})
    stations = shared_file("data/metr-la/stations.csv")
    t0 = readings.time.min()
    trace = tmp_path / "readings.csv"
    readings[readings.time < t0 + 24 * 3600].to_csv(trace, index=False)  # 288 readings a mote
    device = tmp_path / "ttyMOTES"
    motes_log = tmp_path / "motes.log"
    motes = subprocess.Popen(
        [
            sys.executable, "-m", "gateway.cli", "simulate-motes", "--transport", "serial",
            "--device", str(device), "--trace", str(trace), "--stations", str(stations),
            "--limit", str(MOTES), "--speedup", "600",
        ],
        cwd=ROOT,
        stderr=motes_log.open("w"),
    )  # fmt: skip
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[http]\nport = {port}\n[state]\ndir = "{tmp_path / "state"}"\n'
        f'[[serial]]\ndevice = "{device}"\n'
    )
    gw_log = tmp_path / "gateway.log"
    gateway = None
    try:
        deadline = time.monotonic() + 20
        while not device.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert device.exists(), motes_log.read_text()
        time.sleep(5)  # the motes have said hello to nobody and are sending data now
        gateway = _start_gateway(config, url, gw_log)
        qid = _post(f"{url}/queries", {"sql": "SELECT station, speed FROM traffic"})["id"]
        _wait_for_sensors(url, MOTES, 40)
        _wait_for_rows(url, qid, 20)
        _stop(gateway)
        gateway = _start_gateway(config, url, gw_log)  # restarted while the motes run
        _wait_for_sensors(url, MOTES, 40)
        _wait_for_rows(url, qid, 20)
        assert motes.poll() is None, "the fleet ended before the test did: slow it down"
    finally:
        if gateway is not None and gateway.poll() is None:
            gateway.kill()
        motes.kill()
        motes.wait(timeout=10)


def test_mqtt_motes_whose_retained_hellos_the_broker_lost(broker: Broker, tmp_path: Path) -> None:  # noqa: F811
    """The broker lost the retained hellos (restarted without persistence, or a clean-up): the
    gateway that starts now hears only data, and must ask each mote to introduce itself."""
    import asyncio

    import aiomqtt

    readings = pd.read_csv(shared_file("data/metr-la/readings.csv"), dtype={"station": str})
    stations_csv = shared_file("data/metr-la/stations.csv")
    ids = list(pd.read_csv(stations_csv, dtype={"station": str}).station[:MOTES])
    t0 = readings.time.min()
    trace = tmp_path / "readings.csv"
    readings[readings.time < t0 + 24 * 3600].to_csv(trace, index=False)
    motes_log = tmp_path / "motes.log"
    motes = subprocess.Popen(
        [
            sys.executable, "-m", "gateway.cli", "simulate-motes", "--transport", "mqtt",
            "--broker", f"{broker.host}:{broker.port}", "--trace", str(trace),
            "--stations", str(stations_csv), "--limit", str(MOTES), "--speedup", "600",
        ],
        cwd=ROOT,
        stderr=motes_log.open("w"),
    )  # fmt: skip

    async def forget_hellos() -> None:
        async with aiomqtt.Client(broker.host, broker.port) as c:
            for sid in ids:  # an empty retained message deletes the retained one
                await c.publish(f"fjords/sensors/{sid}/hello", b"", qos=1, retain=True)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[http]\nport = {port}\n[mqtt]\nurl = "mqtt://{broker.host}:{broker.port}"\n'
    )
    gateway = None
    try:
        time.sleep(4)  # the motes are connected and have published their hellos
        asyncio.run(forget_hellos())
        gateway = _start_gateway(config, url, tmp_path / "gateway.log")
        qid = _post(f"{url}/queries", {"sql": "SELECT station, speed FROM traffic"})["id"]
        _wait_for_sensors(url, MOTES, 40)
        _wait_for_rows(url, qid, 20)
        assert motes.poll() is None, "the fleet ended before the test did: slow it down"
    finally:
        if gateway is not None and gateway.poll() is None:
            gateway.kill()
        motes.kill()
        motes.wait(timeout=10)
