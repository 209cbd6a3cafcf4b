"""A DRILLDOWN query on the real daemon: registered over HTTP, fed by a simulated METR-LA
fleet through a real Mosquitto, its rows read over SSE and checked against a brute-force
pruning in pandas (segment rows meeting their condition, station rows only under those)."""

from __future__ import annotations

import json
import subprocess
import urllib.request

import pandas as pd

from tests.daemon import Daemon
from tests.support import ROOT, Broker, fleet_command, shared_file

SQL = (
    "SELECT segment, station, AVG(speed) AS avg_speed FROM traffic [RANGE 15 MINUTES] "
    "WHERE segment IN ('S02','S11') GROUP BY segment DRILLDOWN station "
    "HAVING avg_speed(segment) < 60 AND avg_speed(station) < 55"
)
HOURS = 2


def test_drilldown_registers_and_sends_the_pruned_levels(broker: Broker, tmp_path) -> None:
    readings = pd.read_csv(shared_file("data/metr-la/readings.csv"), dtype={"station": str})
    stations = pd.read_csv(shared_file("data/metr-la/stations.csv"), dtype={"station": str})
    part = readings[readings.time < readings.time.min() + HOURS * 3600]
    trace = tmp_path / "readings.csv"
    part.to_csv(trace, index=False)
    df = part.merge(stations, on="station")
    df = df[df.segment.isin(["S02", "S11"])]
    df = df.assign(window_start=(df.time // 900) * 900.0)
    df = df[df.window_start < df.window_start.max()]  # the last closes only with later data
    want: dict[tuple, float] = {}
    for (s, ws), g in df.groupby(["segment", "window_start"]):
        if g.speed.mean() < 60:
            want[(s, None, ws)] = g.speed.mean()
    for (s, st, ws), g in df.groupby(["segment", "station", "window_start"]):
        if (s, None, ws) in want and g.speed.mean() < 55:
            want[(s, st, ws)] = g.speed.mean()
    assert any(k[1] is not None for k in want)
    config = f'[mqtt]\nurl = "mqtt://{broker.host}:{broker.port}"\n[state]\ndir = "{tmp_path / "state"}"\n'
    with Daemon(tmp_path, config) as gw:
        qid = gw.post("/queries", {"sql": SQL})["id"]
        sse = urllib.request.urlopen(f"{gw.url}/queries/{qid}/results", timeout=60)
        fleet = subprocess.run(
            fleet_command(broker, trace, shared_file("data/metr-la/stations.csv")),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert fleet.returncode == 0, fleet.stderr
        rows: list[dict] = []
        while len(rows) < len(want):
            line = sse.readline().decode().strip()
            if line.startswith("data: "):
                rows.append(json.loads(line[6:]))
        sse.close()
    got = {(r["segment"], r["station"], r["window_start"]): r["avg_speed"] for r in rows}
    assert len(got) == len(rows)
    assert got.keys() == want.keys()
    for key, v in got.items():
        assert abs(v - want[key]) < 1e-6, key
