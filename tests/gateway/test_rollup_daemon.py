"""A ROLLUP query on the real daemon: registered over HTTP, fed by a simulated METR-LA fleet
through a real Mosquitto, its rows (a total row per window with segment NULL) read over SSE
and checked against pandas."""

from __future__ import annotations

import json
import subprocess
import urllib.request

import pandas as pd

from tests.daemon import Daemon
from tests.support import ROOT, Broker, fleet_command, shared_file

SQL = (
    "SELECT segment, AVG(speed) AS avg_speed, GROUPING(segment) AS g FROM traffic "
    "[RANGE 15 MINUTES] WHERE segment IN ('S05','S14') GROUP BY ROLLUP(segment)"
)
HOURS = 2


def test_rollup_registers_and_sends_rows_with_nulls(broker: Broker, tmp_path) -> None:
    readings = pd.read_csv(shared_file("data/metr-la/readings.csv"), dtype={"station": str})
    stations = pd.read_csv(shared_file("data/metr-la/stations.csv"), dtype={"station": str})
    part = readings[readings.time < readings.time.min() + HOURS * 3600]
    trace = tmp_path / "readings.csv"
    part.to_csv(trace, index=False)
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
        want_windows = HOURS * 4 - 1  # the last closes only with later data
        rows: list[dict] = []
        while len(rows) < 3 * want_windows:
            line = sse.readline().decode().strip()
            if line.startswith("data: "):
                rows.append(json.loads(line[6:]))
        sse.close()
    df = part.merge(stations, on="station")
    df = df[df.segment.isin(["S05", "S14"])]
    df = df.assign(window_start=(df.time // 900) * 900.0)
    want = {(s, ws): g.speed.mean() for (s, ws), g in df.groupby(["segment", "window_start"])}
    want |= {(None, ws): g.speed.mean() for ws, g in df.groupby("window_start")}
    got = {(r["segment"], r["window_start"]): r for r in rows}
    assert len(got) == len(rows) == 3 * want_windows
    for key, r in got.items():
        assert abs(r["avg_speed"] - want[key]) < 1e-6
        assert r["g"] == (r["segment"] is None)
    assert sum(r["segment"] is None for r in rows) == want_windows
