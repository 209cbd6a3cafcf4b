"""The whole system as an operator runs it: `fjords-gateway run` with the MQTT transport against a
real Mosquitto, a simulated METR-LA fleet publishing through it, the paper's Query 1 registered
over HTTP and its results read over Server-Sent Events, checked against pandas."""

from __future__ import annotations

import json
import subprocess
import urllib.request

import pandas as pd

from tests.daemon import Daemon
from tests.support import ROOT, Broker, fleet_command, shared_file

Q1 = (
    "SELECT segment, AVG(speed) AS avg_speed FROM traffic [RANGE 15 MINUTES] "
    "WHERE segment IN ('S05','S14') GROUP BY segment"
)
HOURS = 6


def test_query1_over_mqtt_and_sse_equals_pandas(broker: Broker, tmp_path) -> None:
    readings = pd.read_csv(shared_file("data/metr-la/readings.csv"), dtype={"station": str})
    stations = pd.read_csv(shared_file("data/metr-la/stations.csv"), dtype={"station": str})
    t0 = readings.time.min()
    part = readings[readings.time < t0 + HOURS * 3600]
    trace = tmp_path / "readings.csv"
    part.to_csv(trace, index=False)
    # Default [runtime]: the sensors' own periods and idleness decide progress.
    config = f'[mqtt]\nurl = "mqtt://{broker.host}:{broker.port}"\n[state]\ndir = "{tmp_path / "state"}"\n'
    with Daemon(tmp_path, config) as gw:
        qid = gw.post("/queries", {"sql": Q1})["id"]
        sse = urllib.request.urlopen(f"{gw.url}/queries/{qid}/results", timeout=60)
        fleet = subprocess.run(
            fleet_command(broker, trace, shared_file("data/metr-la/stations.csv")),
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
        assert gw.metric("fjords_stream_late_samples_total") == 0
    df = part.merge(stations, on="station")
    df = df[df.segment.isin(["S05", "S14"])]
    df = df.assign(window_start=(df.time // 900) * 900)
    want = df.groupby(["segment", "window_start"]).speed.mean().reset_index()
    got = pd.DataFrame(rows)
    m = got.merge(want, on=["segment", "window_start"], how="left")
    assert len(got) == 2 * want_windows and m.speed.notna().all()
    assert (m.avg_speed - m.speed).abs().max() < 1e-6
