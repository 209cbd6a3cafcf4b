"""As a new user sees it: `fjords-gateway run --trace` (METR-LA), a filter query
registered then deleted. The sensors must go to sleep and stay asleep (not one `sleep` per
reading with `pending_controls: ["sleep"]` forever, nor keep running `filter`), and their
energy estimates must be the mote's few joules, not 1.8e5 J counted from time 0."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pandas as pd

from tests.daemon import wait_healthy
from tests.support import ROOT, eventually, free_port, shared_file

HOURS = 10
STATIONS = 6


def _get(url: str) -> Any:
    return json.loads(urllib.request.urlopen(url, timeout=10).read())


def test_daemon_replay_sleeps_after_the_filter_is_deleted_and_counts_energy_from_its_readings(
    tmp_path: Path,
) -> None:
    readings = pd.read_csv(shared_file("data/metr-la/readings.csv"), dtype={"station": str})
    stations = pd.read_csv(shared_file("data/metr-la/stations.csv"), dtype={"station": str})
    keep = stations.head(STATIONS)
    part = readings[
        readings.station.isin(keep.station) & (readings.time < readings.time.min() + HOURS * 3600)
    ]
    trace, stations_csv = tmp_path / "readings.csv", tmp_path / "stations.csv"
    part.to_csv(trace, index=False)
    keep.to_csv(stations_csv, index=False)
    port = free_port()
    config = tmp_path / "gateway.toml"
    config.write_text(f'[http]\nport = {port}\n[state]\ndir = "{tmp_path / "state"}"\n')
    url = f"http://127.0.0.1:{port}"
    # 10 hours at 1,200 x real time: 30 s, 12 readings a second per station.
    gateway = subprocess.Popen(
        [
            *(sys.executable, "-m", "gateway.cli", "run", "--config", str(config)),
            *("--trace", str(trace), "--stations", str(stations_csv), "--speedup", "1200"),
        ],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )

    ids = set(keep.station)

    def sensors() -> list[dict[str, Any]]:
        # (the embedded defaults' generated fleet and loop pair run beside the trace)
        return [e for e in _get(f"{url}/sensors")["sensors"] if e["id"] in ids]

    try:
        wait_healthy(url, gateway)
        req = urllib.request.Request(
            f"{url}/queries",
            data=json.dumps(
                {"sql": "SELECT station, time, speed FROM traffic WHERE speed < 50"}
            ).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        qid = json.loads(urllib.request.urlopen(req, timeout=10).read())["id"]
        eventually(
            sensors,
            lambda s: len(s) == STATIONS and all(e["program"] == "filter" for e in s),
            message="every sensor runs the filter",
            timeout=90,
            interval=0.3,
        )
        delete = urllib.request.Request(f"{url}/queries/{qid}", method="DELETE")
        urllib.request.urlopen(delete, timeout=10).read()
        eventually(
            sensors,
            lambda s: all(e["status"] == "asleep" and not e["pending_controls"] for e in s),
            message="every sensor asleep, nothing pending",
            timeout=90,
            interval=0.3,
        )
        before = {e["id"]: e["counters"]["controls_sent"] for e in sensors()}
        time.sleep(4)  # some 80 minutes of readings: asleep, no control sent again
        after = sensors()
        assert gateway.poll() is None
    finally:
        gateway.terminate()
        gateway.wait(timeout=20)
    for e in after:
        assert e["status"] == "asleep" and e["pending_controls"] == [], e
        assert e["wanted"]["program"] == "sleep"
        assert e["counters"]["controls_sent"] == before[e["id"]] <= 4, e["counters"]
        assert e["counters"]["listen_windows"] > 0
        # Hours of a mote drawing well under a milliwatt: joules, not 1.8e5 J.
        assert 0 < e["energy_j_estimate"] < 2.0, e["energy_j_estimate"]
        assert e["battery_estimate"] > 0.999
