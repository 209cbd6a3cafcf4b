"""One hostile MQTT packet cannot stop ingestion: the real daemon against a real
Mosquitto, msgpack nested 2,000 deep on the data topic and retained on a hello topic (so it comes
back after a restart). A well-behaved simulated mote's data still reaches a query, the bad
packets are counted in /metrics, and /healthz keeps answering throughout (within 2 s: a liveness
bound, not a timing figure)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import aiomqtt
import pytest

from tests.daemon import wait_healthy
from tests.support import ROOT, Broker, free_port, shared_file

pytestmark = [pytest.mark.needs_mosquitto, pytest.mark.timeout(240)]

DEEP = b"\x93\x01\xa5hello" + b"\x91" * 2000 + b"\x01"
SQL = "SELECT station, speed FROM traffic"


def _get(url: str, timeout: float = 5) -> bytes:
    return urllib.request.urlopen(url, timeout=timeout).read()


def _start(config: Path, url: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "run", "--config", str(config)],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_healthy(url, proc, log=proc.stderr.read)
    return proc


def _stop(proc: subprocess.Popen) -> str:
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return err


async def _publish_hostile(b: Broker, n: int) -> None:
    async with aiomqtt.Client(b.host, b.port) as c:
        await c.publish("fjords/sensors/evil/hello", DEEP, qos=1, retain=True)
        for _ in range(n):
            await c.publish("fjords/sensors/evil/data", DEEP, qos=1)


def _fleet(b: Broker, trace: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "simulate-motes",
            "--transport",
            "mqtt",
            "--broker",
            f"{b.host}:{b.port}",
            "--trace",
            str(trace),
            "--stations",
            str(shared_file("data/metr-la/stations.csv")),
            "--limit",
            "2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def _results(url: str, qid: str):
    return urllib.request.urlopen(f"{url}/queries/{qid}/results?format=ndjson", timeout=60)


def _rows(stream, want: int) -> list[dict]:
    """Rows of the query as they come (NDJSON), until `want` rows."""
    rows: list[dict] = []
    while len(rows) < want:
        line = stream.readline().decode().strip()
        if line:
            obj = json.loads(line)
            rows += obj.get("rows", [obj]) if "missed" not in obj else []
    stream.close()
    return rows


def _bad_packets(url: str) -> float:
    text = _get(f"{url}/metrics").decode()
    found = re.findall(
        r'^fjords_transport_dropped_total\{reason="bad_protocol",transport="mqtt[^"]*"\} (\S+)$',
        text,
        re.M,
    )
    return sum(float(x) for x in found)


class _HealthProbe(threading.Thread):
    """Calls /healthz over and over; records the slowest answer."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.slowest = 0.0
        self.statuses: set[str] = set()
        self.calls = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t = time.perf_counter()
            body = json.loads(_get(f"{self.url}/healthz", timeout=5))
            self.slowest = max(self.slowest, time.perf_counter() - t)
            self.statuses.add(body["status"])
            self.calls += 1
            time.sleep(0.01)


def test_a_deeply_nested_packet_does_not_stop_ingestion(broker: Broker, tmp_path: Path) -> None:
    stations = [
        line.split(",")[0]
        for line in shared_file("data/metr-la/stations.csv").read_text().splitlines()[1:3]
    ]
    trace = tmp_path / "readings.csv"
    trace.write_text(
        "time,station,speed\n"
        + "".join(f"{1330588800 + 300 * k},{s},{50 + k % 7}\n" for k in range(20) for s in stations)
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[http]\nport = {port}\n[mqtt]\nurl = "mqtt://{broker.host}:{broker.port}"\n'
        f'[state]\ndir = "{tmp_path / "state"}"\n'
    )
    # Retained before the gateway starts: it is the first thing the gateway receives.
    asyncio.run(_publish_hostile(broker, 0))
    gateway = _start(config, url)
    probes = [_HealthProbe(url)]
    probes[-1].start()
    try:
        req = urllib.request.Request(
            f"{url}/queries",
            data=json.dumps({"sql": SQL}).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        qid = json.loads(urllib.request.urlopen(req, timeout=10).read())["id"]
        results = _results(url, qid)
        asyncio.run(_publish_hostile(broker, 50))
        _fleet(broker, trace)
        rows = _rows(results, 10)
        assert {r["station"] for r in rows} <= set(stations) and rows
        assert _bad_packets(url) >= 51
        assert gateway.poll() is None
        # Restarted, the gateway gets the retained hostile hello again, and copes again.
        probes[-1].stop.set()
        probes[-1].join(10)
        _stop(gateway)
        gateway = _start(config, url)
        probes.append(_HealthProbe(url))
        probes[-1].start()
        results = _results(url, qid)
        asyncio.run(_publish_hostile(broker, 10))
        _fleet(broker, trace)
        assert _rows(results, 10)
        assert _bad_packets(url) >= 11
        health = json.loads(_get(f"{url}/healthz"))  # alive, and saying what it drops
        assert health["status"] == "degraded", health
        assert any("bad_" in r for r in health["reasons"]), health
    finally:
        probes[-1].stop.set()
        probes[-1].join(10)
        err = _stop(gateway)
    for probe in probes:
        assert probe.calls > 10
        # A liveness bound, not a timing figure: a loop stuck on a packet answers in seconds
        # or never (a busy shared machine can make a healthy answer take 100+ ms).
        assert probe.slowest < 2.0, f"/healthz took {probe.slowest * 1000:.0f} ms"
    assert "RecursionError" not in err
