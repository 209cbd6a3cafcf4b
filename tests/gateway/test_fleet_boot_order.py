"""Motes first, gateway after, query last: the README's full METR-LA fleet (207 motes, as fast as
the link takes it, MQTT, a real Mosquitto) started BEFORE the daemon, and a tumbling COUNT/AVG per
segment registered a few seconds after the daemon is healthy.

With no query the proxies put every mote to sleep; the query wakes them. Nothing may be late, and
every window of the query that starts after all the motes of its segment were woken (on their own
clocks, from the fleet's report) must equal a brute-force count over the trace. Readings the motes
never took (asleep before the query) or sent before the gateway subscribed are not losses.

The fleet and the daemon run once (one full-fleet run, ~1-2 minutes).
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import paho.mqtt.subscribe as mqtt_subscribe
import pytest

from tests.daemon import Daemon
from tests.gateway.test_fleet_progress import QUERY, WINDOW, brute_force
from tests.support import ROOT, Broker, ResultRows, eventually, fleet_command, shared_file


@pytest.mark.timeout(600)  # ~1-2 minutes on an idle machine; a busy one takes longer
def test_motes_before_gateway_query_after_nothing_late_windows_after_wake_exact(
    broker: Broker,
    tmp_path: Path,
) -> None:
    boot_order(broker, tmp_path, limit=None)


def boot_order(
    broker: Broker,
    tmp_path: Path,
    *,
    limit: int | None,
    speedup: float | None = None,
) -> None:
    """The scenario for the whole fleet (`limit` None) or its first `limit` stations, as fast
    as possible or at `speedup` x real time."""
    started = time.monotonic()
    readings = shared_file("data/metr-la/readings.csv")
    stations = shared_file("data/metr-la/stations.csv")
    report = tmp_path / "motes.json"
    fleet_log = tmp_path / "fleet.log"
    cmd = fleet_command(broker, readings, stations, "--report", str(report))
    keep = None
    if limit is not None:  # simulate-motes --limit: the first N stations of stations.csv
        cmd += ["--limit", str(limit)]
        with stations.open() as f:
            keep = {line.split(",", 1)[0] for line in list(f)[1 : limit + 1]}
    n_motes = limit or 207
    if speedup is not None:
        cmd += ["--speedup", str(speedup)]
    with fleet_log.open("w") as err:
        fleet = subprocess.Popen(cmd, cwd=ROOT, stderr=err, text=True)
    try:
        # The motes run before the gateway exists: wait for their first data on the broker.
        mqtt_subscribe.simple(
            "fjords/sensors/+/data", hostname=broker.host, port=broker.port, msg_count=1
        )
        config = (
            f'[mqtt]\nurl = "mqtt://{broker.host}:{broker.port}"\n'
            f'[state]\ndir = "{tmp_path / "state"}"\n'
        )
        with Daemon(tmp_path, config) as gw:
            # No query: the proxies put the fleet to sleep (a few seconds; under load longer).
            t_healthy = time.monotonic()

            def count_asleep() -> int:
                # (a daemon taking in a fleet's flood on a busy machine may be slow: OSError)
                states = [s["status"] for s in gw.get("/sensors", timeout=30)["sensors"]]
                return states.count("asleep")

            asleep = eventually(
                count_asleep,
                lambda n: n == n_motes and time.monotonic() - t_healthy >= 3.0,
                message=f"all {n_motes} motes asleep, 3 s or more after the gateway started",
                timeout=120,
                interval=1.0,
                retry_on=(OSError,),
            )
            assert asleep == n_motes, f"{asleep} of {n_motes} motes asleep"
            assert fleet.poll() is None, "the fleet ended before the query: nothing to test"
            print(f"fleet asleep {time.monotonic() - t_healthy:.1f} s after the gateway")
            qid = gw.post("/queries", {"sql": QUERY}, timeout=60)["id"]
            reader = ResultRows(f"{gw.url}/queries/{qid}/results?format=ndjson")
            reader.start()
            assert fleet.wait(timeout=600) == 0, fleet_log.read_text()[-3000:]
            print(f"fleet done {time.monotonic() - t_healthy:.1f} s after the gateway")
            motes = json.loads(report.read_text())
            assert len(motes) == n_motes

            # Each mote's wake, on its own clock: it sends every reading after it.
            segment_of = {}
            with stations.open() as f:
                for row in csv.DictReader(f):
                    segment_of[row["station"]] = row["segment"]
            # A mote whose replay ends while the wake is on its way (its clock runs ~1 day per
            # 6 s on an idle machine, slower motes on a loaded one) is never woken: its
            # segment's windows cannot be checked, but such motes must stay few.
            woke: dict[str, float] = {}
            unwoken: set[str] = set()
            for sid, m in motes.items():
                moves = m["transitions"]
                assert moves, f"{sid} was never put to sleep: {moves}"
                seg = segment_of[sid]
                if moves[-1][0] != "wake":
                    unwoken.add(seg)
                    continue
                woke[seg] = max(woke.get(seg, -1.0), moves[-1][1])
            not_woken = [sid for sid, m in motes.items() if m["transitions"][-1][0] != "wake"]
            if len(not_woken) > 0.05 * n_motes:
                them = {s["id"]: s for s in gw.get("/sensors", timeout=60)["sensors"]}
                them = {k: v for k, v in them.items() if k in not_woken}
                example = {k: (motes[k], them.get(k)) for k in not_woken[:2]}
                raise AssertionError(
                    f"{len(not_woken)} motes not woken: {_control_summary(them)}; e.g. {example}"
                )
            if not_woken:
                print(f"{len(not_woken)} motes ended before their wake: {not_woken[:5]}")
            for seg in unwoken:
                woke.pop(seg, None)

            want = brute_force(readings, stations, keep)
            want = {k: v for k, v in want.items() if k[0] not in unwoken}
            last = max(ws for _, ws in want)
            latest_wake = max(woke.values())

            def required(rows: list[dict]) -> set[tuple[str, float]]:
                if not rows:
                    return {k for k in want if k[1] > latest_wake}  # (nothing emitted yet)
                first = min(r["window_start"] for r in rows)  # the query's first window
                return {
                    k for k in want if k[1] >= first and k[1] > woke[k[0]] and k[1] + WINDOW <= last
                }

            # The gateway may still be working through what the fleet sent: wait while the
            # stream's intake grows, then for the idle timeout (30 s) to release the quiet
            # fleet, until every required window is out.
            deadline = time.monotonic() + 120
            intake = -1.0
            while time.monotonic() < deadline:
                got = {(r["segment"], r["window_start"]) for r in reader.rows}
                if required(list(reader.rows)) <= got:
                    break
                time.sleep(1.0)
                try:
                    now_in = gw.metric("fjords_stream_tuples_in_total")
                except OSError:  # too busy to answer: still working
                    deadline = max(deadline, time.monotonic() + 30)
                    continue
                if now_in > intake:
                    intake, deadline = now_in, max(deadline, time.monotonic() + 90)
            rows = list(reader.rows)
            print(f"results {time.monotonic() - started:.1f} s after the fleet started")
            late = gw.metric("fjords_stream_late_samples_total")
            diag = {
                "watermark": gw.metric("fjords_stream_watermark_seconds"),
                "tuples_in": gw.metric("fjords_stream_tuples_in_total"),
                "query": {k: v for k, v in gw.get(f"/queries/{qid}").items() if k != "plan"},
            }
            drops = _drops(gw)
            sensors = {s["id"]: s for s in gw.get("/sensors", timeout=60)["sensors"]}
        summary = fleet_log.read_text()
        assert late == 0, f"{late:.0f} samples late; {_control_summary(sensors)}"
        # Readings sent after the gateway subscribed must all arrive (a loss, if any, is counted:
        # e.g. an overloaded machine's MQTT client queue) for the windows to be exact.
        assert not drops, f"the gateway dropped data: {drops}; {diag}"
        assert rows, "the query emitted nothing"
        first = min(r["window_start"] for r in rows)
        # The query started no later than the last wake (else the check below proves nothing).
        assert first <= latest_wake + WINDOW, (first, latest_wake)
        got_rows = {(r["segment"], r["window_start"]): r for r in rows}
        assert len(got_rows) == len(rows), "a window was emitted twice"
        need = required(rows)
        missing = sorted(need - got_rows.keys())
        assert not missing, f"{len(missing)} windows never emitted, e.g. {missing[:3]}; {diag}"
        # Not vacuous: a large share of the week is checked. How much of it the motes slept
        # through depends on how fast this machine replays the trace while the wake travels
        # (a wall-clock round trip while the motes' clocks run ~1 day per 6 s), so the bound is
        # loose: about half the week on an idle machine.
        closed = [k for k in want if k[1] + WINDOW <= last]
        assert len(need) >= 0.25 * len(closed), (len(need), len(closed))
        print(f"{len(need)} of {len(closed)} windows checked exactly (after every wake)")
        wrong = [
            (k, got_rows[k]["n"], want[k][0])
            for k in need
            if got_rows[k]["n"] != want[k][0] or abs(got_rows[k]["avg_speed"] - want[k][1]) > 1e-6
        ]
        assert not wrong, f"{len(wrong)} windows differ, e.g. {sorted(wrong)[:3]}"
        # No window holds more than the trace has (nothing counted twice), before wake included.
        full = brute_force(readings, stations, keep)
        over = [k for k, r in got_rows.items() if k not in full or r["n"] > full[k][0]]
        assert not over, f"windows over the trace: {over[:3]}"
        assert re.search(r"sent \d+ samples", summary), summary
    finally:
        if fleet.poll() is None:
            fleet.kill()
            fleet.wait(timeout=10)


def _control_summary(sensors: dict[str, dict]) -> str:
    """What the proxies' control channels did (for a failure message)."""
    keys = ("controls_sent", "retries", "acks", "unanswered", "unknown_acks")
    totals = {k: sum(s["counters"].get(k, 0) for s in sensors.values()) for k in keys}
    status: dict[str, int] = {}
    for s in sensors.values():
        status[s["status"]] = status.get(s["status"], 0) + 1
    errors = [e for s in sensors.values() for e in s["errors"]][:3]
    return f"controls {totals}, status {status}, e.g. errors {errors}"


def _drops(gw: Daemon) -> dict[str, float]:
    """fjords_dropped_total by stage and reason (sequence gaps of messages published before
    the gateway subscribed are not losses: it was not there)."""
    text = urllib.request.urlopen(f"{gw.url}/metrics", timeout=60).read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"fjords_dropped_total\{(.*)\} (\S+)$", line)
        if m and float(m.group(2)) > 0 and "sequence_gap" not in m.group(1):
            out[m.group(1)] = float(m.group(2))
    return out
