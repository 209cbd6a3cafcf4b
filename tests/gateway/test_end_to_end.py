"""The whole system as an operator runs it: `fjords-gateway run` with the MQTT transport against a
real Mosquitto, a simulated METR-LA fleet publishing through it, the paper's Query 1 registered
over HTTP and its results read over Server-Sent Events, checked against pandas."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pandas as pd

from tests.gateway.test_cli import free_port
from tests.sensors.conftest import Broker, broker  # noqa: F401 - the shared broker fixture
from tests.support import ROOT, shared_file

Q1 = (
    "SELECT segment, AVG(speed) AS avg_speed FROM traffic [RANGE 15 MINUTES] "
    "WHERE segment IN ('S05','S14') GROUP BY segment"
)
HOURS = 6


def _wait_http(url: str, proc: subprocess.Popen, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"gateway exited: {proc.stderr.read()}")
        try:
            urllib.request.urlopen(f"{url}/healthz", timeout=1)
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("gateway did not start")


def test_query1_over_mqtt_and_sse_equals_pandas(broker: Broker, tmp_path) -> None:  # noqa: ANN001, F811
    readings = pd.read_csv(shared_file("data/metr-la/readings.csv"), dtype={"station": str})
    stations = pd.read_csv(shared_file("data/metr-la/stations.csv"), dtype={"station": str})
    t0 = readings.time.min()
    part = readings[readings.time < t0 + HOURS * 3600]
    trace = tmp_path / "readings.csv"
    part.to_csv(trace, index=False)
    config = tmp_path / "gateway.toml"
    port = free_port()
    config.write_text(
        f'[http]\nport = {port}\n[mqtt]\nurl = "mqtt://{broker.host}:{broker.port}"\n'
        f'[runtime]\nmax_lag_seconds = 1e12\n[state]\ndir = "{tmp_path / "state"}"\n'
    )
    url = f"http://127.0.0.1:{port}"
    gateway = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "run", "--config", str(config)],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_http(url, gateway)
        req = urllib.request.Request(
            f"{url}/queries",
            data=json.dumps({"sql": Q1}).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        qid = json.loads(urllib.request.urlopen(req, timeout=10).read())["id"]
        sse = urllib.request.urlopen(f"{url}/queries/{qid}/results", timeout=60)
        fleet = subprocess.run(
            [
                sys.executable,
                "-m",
                "gateway.cli",
                "simulate-motes",
                "--transport",
                "mqtt",
                "--broker",
                f"{broker.host}:{broker.port}",
                "--trace",
                str(trace),
                "--stations",
                str(shared_file("data/metr-la/stations.csv")),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert fleet.returncode == 0, fleet.stderr
        # Every 15-minute window but the last closes while the fleet runs (the last needs later data).
        want_windows = HOURS * 4 - 1
        rows: list[dict] = []
        while len(rows) < 2 * want_windows:
            line = sse.readline().decode().strip()
            if line.startswith("data: "):
                rows.append(json.loads(line[6:]))
        sse.close()
    finally:
        gateway.terminate()
        assert gateway.wait(timeout=20) == 0
    df = part.merge(stations, on="station")
    df = df[df.segment.isin(["S05", "S14"])]
    df = df.assign(window_start=(df.time // 900) * 900)
    want = df.groupby(["segment", "window_start"]).speed.mean().reset_index()
    got = pd.DataFrame(rows)
    m = got.merge(want, on=["segment", "window_start"], how="left")
    assert len(got) == 2 * want_windows and m.speed.notna().all()
    assert (m.avg_speed - m.speed).abs().max() < 1e-6
