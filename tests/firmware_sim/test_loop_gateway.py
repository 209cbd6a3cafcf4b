"""`fjords-gateway run` on a serial line with AVR firmware motes in simavr behind it
(`simulate-motes --firmware avr`): discovery, data and the proxies' filter pushdown, all
through the real daemon and its serial transport, with nothing Python-simulated on the mote
side. Deleting the query puts the motes to sleep."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

from tests.daemon import Daemon
from tests.support import ROOT, require, require_binary, shared_file

pytestmark = [pytest.mark.needs_avr, pytest.mark.timeout(180)]
MOTES = 3


def _env(tmp_path: Path) -> dict[str, str]:
    """This checkout's code in the subprocesses, firmware_sim included (its folder is
    firmware-sim/, so it is reached through a link named like the package)."""
    shim = tmp_path / "pythonpath"
    shim.mkdir()
    (shim / "firmware_sim").symlink_to(ROOT / "firmware-sim")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(shim), env.get("PYTHONPATH", "")])
    return env


def test_daemon_discovers_firmware_motes_and_pushes_a_filter_into_them(tmp_path: Path) -> None:
    require_binary("avr-gcc", "gcc-avr")
    require_binary("simavr", "simavr")
    from firmware_sim.loop import toolchain_missing

    missing = toolchain_missing()
    require(not missing, f"{', '.join(missing)} (Debian packages libsimavr-dev, gcc)")
    readings = pd.read_csv(shared_file("data/metr-la/readings.csv"), dtype={"station": str})
    stations = shared_file("data/metr-la/stations.csv")
    t0 = readings.time.min()
    trace = tmp_path / "readings.csv"
    readings[readings.time < t0 + 12 * 3600].to_csv(trace, index=False)  # 144 readings a mote
    device = tmp_path / "ttyMOTES"
    gw = Daemon(
        tmp_path, f'[state]\ndir = "{tmp_path / "state"}"\n[[serial]]\ndevice = "{device}"\n'
    )
    url = gw.url
    env = _env(tmp_path)
    motes = None
    motes_log = tmp_path / "motes.log"
    try:
        gw.start()
        qid = gw.post("/queries", {"sql": "SELECT station, speed FROM traffic WHERE speed < 50"})[
            "id"
        ]
        motes = subprocess.Popen(
            [
                sys.executable, "-m", "gateway.cli", "simulate-motes", "--firmware", "avr",
                "--transport", "serial", "--device", str(device), "--trace", str(trace),
                "--stations", str(stations), "--limit", str(MOTES), "--speedup", "1200",
            ],
            cwd=ROOT,
            env=env,
            stderr=motes_log.open("w"),
        )  # fmt: skip
        deadline = time.monotonic() + 60
        sensors: list[dict] = []
        while time.monotonic() < deadline:
            assert motes.poll() in (None, 0), motes_log.read_text()
            sensors = gw.get("/sensors")["sensors"]
            if len(sensors) == MOTES and all(s["program"] == "filter" for s in sensors):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"no filter pushdown: {sensors}\n{motes_log.read_text()}")
        for s in sensors:
            assert ["speed", "float"] in s["schema"]
            assert s["attributes"]["station"] == s["id"]
            assert "filter" in s["capabilities"]
            assert s["params"]["ranges"] == [[None, 50.0]] or s["params"]["ranges"][0][1] == 50
        # No query left: the proxies put the motes to sleep, and the firmware acknowledges it.
        urllib.request.urlopen(urllib.request.Request(f"{url}/queries/{qid}", method="DELETE"))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            sensors = gw.get("/sensors")["sensors"]
            if all(s["status"] == "asleep" for s in sensors):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"not asleep: {sensors}\n{motes_log.read_text()}")
    finally:
        if motes is not None:
            motes.kill()
            motes.wait(timeout=10)
        gw.kill()
