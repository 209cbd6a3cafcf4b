"""Snapshots against the real daemon, a real Mosquitto and METR-LA motes: after the fleet has
replayed its week, ad hoc questions about the past are answered at once and exactly (against
a brute-force computation over readings.csv), over the range the answer says it covers."""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest

from tests.daemon import wait_healthy
from tests.support import (
    ROOT,
    Broker,
    ResultRows,
    eventually,
    fleet_command,
    free_port,
    require_binary,
    shared_file,
)

STATIONS = 30  # simulate-motes --limit: the first 30 stations of stations.csv
MIDDLE = 1_330_588_800 + 4 * 86_400  # the fleet's week in two halves, split here
SINCE = MIDDLE - 6 * 3600
LATE_QUERIES = {  # registered between the halves
    "sliding": {
        "sql": "SELECT segment, COUNT(*) AS n, AVG(speed) AS avg FROM traffic "
        "[RANGE 2 HOURS SLIDE 30 MINUTES] GROUP BY segment"
    },
    "since": {
        "sql": "SELECT segment, COUNT(*) AS n FROM traffic [RANGE 1 HOUR] GROUP BY segment",
        "since": SINCE,
    },
}
DEMAND = "SELECT * FROM traffic"  # every raw reading: nothing is pushed down to the motes


def post(url: str, path: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        url + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def metric(url: str, name: str) -> float:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    return sum(
        float(m.group(1)) for m in re.finditer(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
    )


def fleet_readings(until: float = math.inf) -> list[tuple[float, str, float, str]]:
    """(time, station, speed, segment) of the readings the fleet's motes send (before `until`)."""
    with shared_file("data/metr-la/stations.csv").open() as f:
        segment = {r["station"]: r["segment"] for r in list(csv.DictReader(f))[:STATIONS]}
    out = []
    with shared_file("data/metr-la/readings.csv").open() as f:
        for r in csv.DictReader(f):
            t = float(r["time"])
            if r["station"] in segment and r["speed"] != "" and t < until:
                out.append((t, r["station"], float(r["speed"]), segment[r["station"]]))
    return out


@pytest.fixture(scope="module")
def readings() -> list[tuple[float, str, float, str]]:
    return fleet_readings()


def trace(path: Path, rows: list[list[str]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["time", "station", "speed"])
        w.writerows(rows)
    return path


class Run:
    """The daemon's URL, and the results of the queries registered between the halves."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.readers: dict[str, ResultRows] = {}


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory, readings):
    """A daemon that took in the fleet's whole week (history kept for 8 days), in two halves
    with queries registered in between (the motes boot again for the second half)."""
    tmp = tmp_path_factory.mktemp("snapshot")
    broker = Broker(require_binary("mosquitto", "mosquitto"), tmp)
    broker.start()
    port = free_port()
    config = tmp / "gateway.toml"
    config.write_text(
        f'[http]\nport = {port}\n[mqtt]\nurl = "mqtt://{broker.host}:{broker.port}"\n'
        f'[state]\ndir = "{tmp / "state"}"\n'
        "[history]\nkeep_s = 691200\n[limits]\nmax_snapshot_readings = 5000\n"
    )
    url = f"http://127.0.0.1:{port}"
    log = (tmp / "gateway.log").open("w")
    gateway = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "run", "--config", str(config)],
        cwd=ROOT,
        stderr=log,
        text=True,
    )
    with shared_file("data/metr-la/readings.csv").open() as f:
        lines = list(csv.reader(f))[1:]
    halves = [
        trace(tmp / "first.csv", [r for r in lines if float(r[0]) < MIDDLE]),
        trace(tmp / "second.csv", [r for r in lines if float(r[0]) >= MIDDLE]),
    ]
    run = Run(url)
    try:
        wait_healthy(url, gateway)
        assert post(url, "/queries", {"sql": DEMAND})[0] == 201
        sent = 0
        for i, half in enumerate(halves):
            sent += replay(broker, half)
            last = max(t for t, *_ in readings if (t < MIDDLE) == (i == 0))
            # The fleet goes quiet and idleness releases every mote: the watermark reaches it.
            eventually(
                lambda: (
                    metric(url, "fjords_history_rows"),
                    metric(url, "fjords_stream_watermark_seconds"),
                ),
                lambda s, sent=sent, last=last: s[0] == sent and s[1] >= last,
                message=lambda: urllib.request.urlopen(f"{url}/status", timeout=10).read().decode(),
                timeout=120,
                interval=0.5,
            )
            if i == 0:
                for name, body in LATE_QUERIES.items():
                    status, q = post(url, "/queries", body)
                    assert status == 201, q
                    # ?since=0: from its first row (those emitted while it was registered)
                    run.readers[name] = ResultRows(
                        f"{url}/queries/{q['id']}/results?format=ndjson&since=0"
                    )
                    run.readers[name].start()
        assert sent == len(readings)
        yield run
    finally:
        gateway.terminate()
        assert gateway.wait(timeout=30) == 0
        log.close()
        broker.stop()


@pytest.fixture(scope="module")
def daemon(fleet_run: Run) -> str:
    return fleet_run.url


def replay(broker: Broker, half: Path) -> int:
    cmd = fleet_command(
        broker,
        half,
        shared_file("data/metr-la/stations.csv"),
        "--limit",
        str(STATIONS),
        "--qos",
        "1",
    )
    fleet = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert fleet.returncode == 0, fleet.stderr
    return int(re.search(r"sent (\d+) samples", fleet.stderr).group(1))  # type: ignore[union-attr]


def brute(readings, t0: float, t1: float, key) -> dict:
    acc: dict = defaultdict(list)
    for t, st, v, seg in readings:
        if t0 <= t < t1:
            acc[key(st, seg)].append(v)
    return acc


def close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(b))


def test_a_range_snapshot_covers_exactly_the_last_range_before_the_watermark(daemon, readings):
    status, body = post(
        daemon,
        "/snapshot",
        {
            "sql": "SELECT segment, COUNT(*) AS n, AVG(speed) AS avg, MIN(speed) AS lo, "
            "MAX(speed) AS hi FROM traffic [RANGE 30 MINUTES] GROUP BY segment"
        },
    )
    assert status == 200, body
    assert body["to"] - body["from"] == 1800
    assert body["to"] >= max(t for t, *_ in readings)
    assert body["complete"] is True
    want = brute(readings, body["from"], body["to"], lambda st, seg: seg)
    got = {r["segment"]: r for r in body["rows"]}
    assert got.keys() == want.keys()
    for seg, vals in want.items():
        r = got[seg]
        assert r["n"] == len(vals)
        assert close(r["avg"], sum(vals) / len(vals))
        assert (r["lo"], r["hi"]) == (min(vals), max(vals))
        assert (r["window_start"], r["window_end"]) == (body["from"], body["to"])
    assert body["sources"]["memory"] == sum(len(v) for v in want.values())


def test_a_past_day_per_station_is_exact_from_cells_and_from_readings(daemon, readings):
    t0 = min(t for t, *_ in readings) + 86400 * 2 + 1234.5  # not on a bucket's edge
    t1 = t0 + 86400
    want = brute(readings, t0, t1, lambda st, seg: st)
    for expr in ("AVG(speed)", "AVG(speed * 1)"):  # per-sensor cells; then every reading
        sql = (
            f"SELECT station, COUNT(*) AS n, {expr} AS avg FROM traffic "
            f"WHERE time >= {t0} AND time < {t1} AND segment <> 'nowhere' GROUP BY station"
        )
        status, body = post(daemon, "/snapshot", {"sql": sql})
        if expr == "AVG(speed * 1)":  # a day of 30 motes: over max_snapshot_readings
            assert status == 400 and "max_snapshot_readings" in body["error"], body
            continue
        assert status == 200, body
        assert (body["from"], body["to"]) == (t0, t1)
        got = {r["station"]: r for r in body["rows"]}
        assert got.keys() == want.keys()
        for st, vals in want.items():
            assert got[st]["n"] == len(vals)
            assert close(got[st]["avg"], sum(vals) / len(vals))


def test_rows_of_an_hour_ordered_and_limited_and_an_hour_by_readings(daemon, readings):
    station = readings[0][1]
    t0 = min(t for t, *_ in readings) + 3 * 86400
    sql = (
        f"SELECT time, speed FROM traffic WHERE station = '{station}' AND time >= {t0} "
        f"AND time < {t0 + 3600} ORDER BY speed DESC LIMIT 5"
    )
    status, body = post(daemon, "/snapshot", {"sql": sql})
    assert status == 200, body
    want = sorted(((t, v) for t, st, v, _ in readings if st == station and t0 <= t < t0 + 3600),
                  key=lambda r: -r[1])[:5]  # fmt: skip
    assert [r["speed"] for r in body["rows"]] == [v for _, v in want]
    # An hour of the whole fleet through the readings path equals the cells path.
    answers = []
    for expr in ("SUM(speed)", "SUM(speed + 0)"):
        status, body = post(
            daemon,
            "/snapshot",
            {"sql": f"SELECT segment, {expr} AS s FROM traffic WHERE time >= {t0} AND "
                    f"time < {t0 + 3600} GROUP BY segment HAVING COUNT(*) > 10 ORDER BY s"},
        )  # fmt: skip
        assert status == 200, body
        answers.append(body["rows"])
    assert [r["segment"] for r in answers[0]] == [r["segment"] for r in answers[1]]
    assert all(close(a["s"], b["s"]) for a, b in zip(*answers, strict=True))


def test_what_a_snapshot_cannot_answer_is_a_400_with_a_reason(daemon):
    cases = {
        "SELECT nope FROM traffic": "nope",
        "SELECT COUNT(*) FROM traffic [RANGE 1 HOUR] EMIT EVERY 1 MINUTE": "EMIT EVERY",
        "SELECT COUNT(*) FROM traffic [RANGE 1 HOUR] SAMPLE PERIOD 10 SECONDS": "SAMPLE PERIOD",
        "SELECT COUNT(*) FROM traffic [RANGE 1 HOUR SLIDE 10 MINUTES]": "SLIDE",
        "SELECT COUNT(*) FROM traffic WHERE time > 4000000000": "after the stream's data",
        "SELECT COUNT(*) FROM traffic [ROWS 10]": "ROWS",
    }
    for sql, says in cases.items():
        status, body = post(daemon, "/snapshot", {"sql": sql})
        assert status == 400, (sql, body)
        assert says in json.dumps(body), (sql, body)
    status, body = post(daemon, "/snapshot", {"sql": "SELECT COUNT(*) FROM traffic WHERE"})
    assert status == 400 and body.get("line") == 1, body


def test_history_is_in_metrics_and_status(daemon, readings):
    assert metric(daemon, "fjords_history_rows") == len(readings)
    assert metric(daemon, "fjords_history_bytes") <= 32 * len(readings) + 64 * 1024
    status = json.loads(urllib.request.urlopen(f"{daemon}/status", timeout=10).read())
    h = status["history"]["traffic"]
    assert h["rows"] == len(readings)
    assert h["oldest"] == min(t for t, *_ in readings)


def test_the_snapshot_command_prints_a_table_or_ndjson(daemon) -> None:
    sql = "SELECT segment, COUNT(*) AS n FROM traffic [RANGE 1 HOUR] GROUP BY segment"
    cmd = [sys.executable, "-m", "gateway.cli", "snapshot", "--url", daemon]
    table = subprocess.run([*cmd, sql], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split("\t") == ["segment", "n", "window_start", "window_end"]
    assert "(complete)" in table.stderr
    as_json = subprocess.run(
        [*cmd, sql, "--json"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    rows = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert len(rows) == len(lines) - 1 and all(r["n"] > 0 for r in rows)
    bad = subprocess.run(
        [*cmd, "SELECT nope FROM traffic"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "nope" in bad.stderr
    spark = subprocess.run(  # this daemon has no archive for Spark to read
        [*cmd, sql, "--engine", "spark"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert spark.returncode == 2 and "[archive] dir" in spark.stderr


def test_a_query_registered_late_has_a_whole_first_window(fleet_run: Run, readings) -> None:
    rows = fleet_run.readers["sliding"].rows
    want = {}
    for t, _, v, seg in readings:
        last = int(t // 1800)
        for k in range(last - 3, last + 1):
            want.setdefault((seg, k * 1800.0), []).append(v)
    assert rows, "no window emitted"
    first = min(r["window_start"] for r in rows)
    assert first < MIDDLE - 1800  # it began before the query was registered
    assert len({(r["segment"], r["window_start"]) for r in rows}) == len(rows)
    for r in rows:
        vals = want[(r["segment"], r["window_start"])]
        assert r["n"] == len(vals), r
        assert close(r["avg"], sum(vals) / len(vals))


def test_since_gets_every_past_window_then_live_ones(fleet_run: Run, readings) -> None:
    rows = fleet_run.readers["since"].rows
    got = {(r["segment"], r["window_start"]): r["n"] for r in rows}
    assert len(got) == len(rows), "a window emitted twice"
    end = max(t for t, *_ in readings)
    want: dict = defaultdict(int)
    for t, _, _, seg in readings:
        ws = t // 3600 * 3600
        if ws >= SINCE and ws + 3600 <= end:
            want[(seg, ws)] += 1
    assert {k: v for k, v in got.items() if k[1] + 3600 <= end} == dict(want)
