"""`fjords-gateway run` on a serial line with AVR firmware motes in simavr behind it
(`simulate-motes --firmware avr`): discovery, data and the proxies' filter pushdown, all
through the real daemon and its serial transport, with nothing Python-simulated on the mote
side. Deleting the query puts the motes to sleep."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

from tests.daemon import Daemon
from tests.support import ROOT, eventually, require, require_binary, shared_file

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


def _start_motes(
    device: Path, trace: Path, stations: Path, env: dict[str, str], log: Path
) -> subprocess.Popen:
    """MOTES AVR firmware motes in simavr on the serial line `device`, replaying `trace` at 1200x."""
    return subprocess.Popen(
        [
            sys.executable, "-m", "gateway.cli", "simulate-motes", "--firmware", "avr",
            "--transport", "serial", "--device", str(device), "--trace", str(trace),
            "--stations", str(stations), "--limit", str(MOTES), "--speedup", "1200",
        ],
        cwd=ROOT,
        env=env,
        stderr=log.open("w"),
    )  # fmt: skip


def _until_program(gw: Daemon, motes: subprocess.Popen, log: Path, program: str) -> list[dict]:
    """The daemon's /sensors once every mote runs `program` (the proxies pushed it down)."""

    def sensors() -> list[dict]:
        assert motes.poll() in (None, 0), log.read_text()
        return gw.get("/sensors")["sensors"]

    return eventually(
        sensors,
        lambda got: len(got) == MOTES and all(s["program"] == program for s in got),
        message=lambda: f"{program} pushed down to every mote\n{log.read_text()}",
        timeout=60,
        interval=0.5,
    )


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
        motes = _start_motes(device, trace, stations, env, motes_log)
        sensors = _until_program(gw, motes, motes_log, "filter")
        for s in sensors:
            assert ["speed", "float"] in s["schema"]
            assert s["attributes"]["station"] == s["id"]
            assert "filter" in s["capabilities"]
            assert s["params"]["ranges"] == [[None, 50.0]] or s["params"]["ranges"][0][1] == 50
        # No query left: the proxies put the motes to sleep, and the firmware acknowledges it.
        urllib.request.urlopen(urllib.request.Request(f"{url}/queries/{qid}", method="DELETE"))
        eventually(
            lambda: gw.get("/sensors")["sensors"],
            lambda sensors: all(s["status"] == "asleep" for s in sensors),
            message=lambda: f"every mote asleep\n{motes_log.read_text()}",
            timeout=30,
            interval=0.5,
        )
    finally:
        if motes is not None:
            motes.kill()
            motes.wait(timeout=10)
        gw.kill()


AGG_SQL = (
    "SELECT station, AVG(speed) AS avg_speed, COUNT(*) AS n, MIN(speed) AS lo, "
    "MAX(speed) AS hi FROM traffic [RANGE 1 HOUR] GROUP BY station"
)


def _mote_readings(part: pd.DataFrame, sid: str) -> pd.DataFrame:
    """The readings a firmware mote of `sid` converts: the trace on its grid, in A-to-D counts
    (sensors.motes.firmware), back in mph."""
    from firmware_sim.loop import to_counts

    from sensors.motes.firmware import DEFAULT_SCALE, grid

    rows = part[part.station == sid].sort_values("time")
    start, step, values = grid(list(zip(rows.time.astype(float), rows.speed, strict=True)))
    counts = to_counts(values, DEFAULT_SCALE)
    return pd.DataFrame(
        {"time": [start + k * step for k in range(len(counts))],
         "speed": [c / DEFAULT_SCALE for c in counts]}
    )  # fmt: skip


def test_daemon_pushes_a_windowed_aggregate_into_firmware_motes(tmp_path: Path) -> None:
    """An aggregate query's sensors run `aggregate` on the firmware (its own
    frames are partials, not samples), the query's answers equal a computation over the
    readings the motes took, and deleting the query puts the motes to sleep."""
    import json
    import re
    import threading

    require_binary("avr-gcc", "gcc-avr")
    require_binary("simavr", "simavr")
    from firmware_sim.loop import toolchain_missing

    missing = toolchain_missing()
    require(not missing, f"{', '.join(missing)} (Debian packages libsimavr-dev, gcc)")
    readings = pd.read_csv(shared_file("data/metr-la/readings.csv"), dtype={"station": str})
    stations = shared_file("data/metr-la/stations.csv")
    t0 = readings.time.min()
    part = readings[readings.time < t0 + 24 * 3600]  # 288 readings a mote, 72 s at 1200x
    trace = tmp_path / "readings.csv"
    part.to_csv(trace, index=False)
    device = tmp_path / "ttyMOTES"
    gw = Daemon(
        tmp_path, f'[state]\ndir = "{tmp_path / "state"}"\n[[serial]]\ndevice = "{device}"\n'
    )
    env = _env(tmp_path)
    motes = None
    motes_log = tmp_path / "motes.log"
    rows: list[dict] = []
    events: list[str] = []  # other than rows: only the query's end, once it is deleted
    try:
        gw.start()
        qid = gw.post("/queries", {"sql": AGG_SQL})["id"]
        sse = urllib.request.urlopen(f"{gw.url}/queries/{qid}/results", timeout=120)

        def read_results() -> None:
            event = "message"
            for raw in sse:
                line = raw.decode().strip()
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    if event == "message":
                        rows.append(json.loads(line[6:]))
                    else:
                        events.append(event)
                    event = "message"

        reader = threading.Thread(target=read_results, daemon=True)
        reader.start()
        motes = _start_motes(device, trace, stations, env, motes_log)
        sensors = _until_program(gw, motes, motes_log, "aggregate")
        assert all(s["params"] == {"window_ms": 3_600_000} for s in sensors), sensors
        ids = sorted(s["id"] for s in sensors)
        # Half the day's windows answered, then the query goes: the motes must go to sleep
        # while their traces still run.

        def n_rows() -> int:
            assert motes.poll() is None, motes_log.read_text()
            return len(rows)

        eventually(
            n_rows,
            lambda n: n >= MOTES * 10,
            message=lambda: f"{MOTES * 10} rows: {rows}, {gw.get('/sensors')}",
            timeout=60,
            interval=0.2,
        )
        urllib.request.urlopen(urllib.request.Request(f"{gw.url}/queries/{qid}", method="DELETE"))
        eventually(
            lambda: gw.get("/sensors")["sensors"],
            lambda sensors: all(s["status"] == "asleep" for s in sensors),
            message=lambda: f"every mote asleep\n{motes_log.read_text()}",
            timeout=30,
            interval=0.5,
        )
        assert motes.wait(timeout=90) == 0, motes_log.read_text()
        late = gw.metric("fjords_stream_late_samples_total")
        final = gw.get("/sensors")["sensors"]
    finally:
        if motes is not None and motes.poll() is None:
            motes.kill()
            motes.wait(timeout=10)
        gw.kill()
    log = motes_log.read_text()
    # The firmware's own frames: partial aggregates, not raw samples, once the program is on.
    for sid in ids:
        m = re.search(rf"firmware mote {sid} sent (.*)", log)
        assert m, log
        kinds = {k: int(n) for k, n in (item.split() for item in m.group(1).split(", "))}
        assert kinds.get("aggregate", 0) >= 10, kinds
        assert kinds.get("samples", 0) < 12, kinds  # raw only before the load, in the first hour
    # Every answered window equals the same aggregates over the readings the motes took.
    assert set(events) <= {"end"}, events
    assert late == 0, final
    got = pd.DataFrame(rows)
    assert set(got.station) == set(ids)
    for sid in ids:
        mine = _mote_readings(part, sid)
        mine = mine.assign(window_start=(mine.time // 3600) * 3600)
        want = mine.groupby("window_start").speed.agg(["mean", "count", "min", "max"])
        first = got.window_start.min()
        for r in got[got.station == sid].itertuples():
            w = want.loc[r.window_start]
            if r.window_start == first and r.n < w["count"]:
                # Readings a mote sent before the gateway had opened the serial line (the
                # simulator makes the pty) are lost with its boot hello; discovery asks again.
                continue
            assert r.n == w["count"], (r, w, [s for s in final if s["id"] == sid])
            # the firmware sends sum, min and max in reading units as float32
            assert r.avg_speed == pytest.approx(w["mean"], rel=1e-6), (r, w)
            assert (r.lo, r.hi) == pytest.approx((w["min"], w["max"]), rel=1e-6), (r, w)
