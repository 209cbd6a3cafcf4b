"""Snapshots from memory and the archive against the real daemon, a real Mosquitto and METR-LA
motes: with `[archive] dir` and a history of 2 hours, two days of the fleet are answered exactly
(against brute force over readings.csv) from memory alone, from the archive alone, and across
the boundary between them; a corrupt segment is skipped, counted and named."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.daemon import wait_healthy
from tests.gateway.test_snapshot_fleet import (
    brute,
    close,
    fleet_readings,
    metric,
    post,
    replay,
    trace,
)
from tests.support import ROOT, Broker, eventually, free_port, require_binary, shared_file

START = 1_330_588_800
DAYS = 2
KEEP_S = 7200


@pytest.fixture(scope="module", name="fleet_readings")
def two_days() -> list[tuple[float, str, float, str]]:
    return fleet_readings(START + DAYS * 86400)


class Run:
    def __init__(self, url: str, archive: Path) -> None:
        self.url = url
        self.archive = archive

    def boundary(self) -> float:
        status = json.loads(urllib.request.urlopen(f"{self.url}/status", timeout=10).read())
        return status["history"]["traffic"]["complete_from"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, fleet_readings):
    """A daemon with an archive and 2 hours of history that took in two days of the fleet,
    with no query registered (the archive's demand keeps the motes sending raw readings)."""
    tmp = tmp_path_factory.mktemp("snapshot-archive")
    broker = Broker(require_binary("mosquitto", "mosquitto"), tmp)
    broker.start()
    port = free_port()
    archive = tmp / "archive"
    config = tmp / "gateway.toml"
    config.write_text(
        f'[http]\nport = {port}\n[mqtt]\nurl = "mqtt://{broker.host}:{broker.port}"\n'
        f'[state]\ndir = "{tmp / "state"}"\n'
        f'[archive]\ndir = "{archive}"\nsegment_rows = 1000\nsegment_seconds = 3600\n'
        f"[history]\nkeep_s = {KEEP_S}\n"
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
        lines = [r for r in list(csv.reader(f))[1:] if float(r[0]) < START + DAYS * 86400]
    try:
        wait_healthy(url, gateway)
        sent = replay(broker, trace(tmp / "days.csv", lines))
        assert sent == len(fleet_readings)
        last = max(t for t, *_ in fleet_readings)
        count = {"sql": "SELECT COUNT(*) AS n FROM traffic", "partial": True}
        eventually(
            lambda: (
                post(url, "/snapshot", count)[1].get("rows"),
                metric(url, "fjords_stream_watermark_seconds"),
            ),
            lambda s: s[0] == [{"n": sent}] and s[1] >= last,
            message=lambda: urllib.request.urlopen(f"{url}/status", timeout=10).read().decode(),
            timeout=120,
            interval=0.5,
        )
        yield Run(url, archive / "traffic")
    finally:
        gateway.terminate()
        assert gateway.wait(timeout=30) == 0
        log.close()
        broker.stop()


def check_grouped(body: dict, want: dict, key: str) -> None:
    got = {r[key]: r for r in body["rows"]}
    assert got.keys() == want.keys()
    for k, vals in want.items():
        assert got[k]["n"] == len(vals), k
        assert close(got[k]["avg"], sum(vals) / len(vals)), k


def test_the_last_minutes_come_from_memory_alone(run, fleet_readings) -> None:
    sql = (
        "SELECT segment, COUNT(*) AS n, AVG(speed) AS avg FROM traffic [RANGE 30 MINUTES] "
        "GROUP BY segment"
    )
    status, body = post(run.url, "/snapshot", {"sql": sql})
    assert status == 200, body
    assert body["from"] >= run.boundary()
    assert body["complete"] is True
    assert body["sources"] == {"memory": body["sources"]["memory"], "archive": 0}
    check_grouped(body, brute(fleet_readings, body["from"], body["to"], lambda st, s: s), "segment")


def test_the_first_day_comes_from_the_archive_alone(run, fleet_readings) -> None:
    t0, t1 = START + 3600.5, START + 86400
    assert t1 < run.boundary()
    for expr in ("AVG(speed)", "AVG(speed * 1)"):  # cells path (memory part empty); readings
        sql = (
            f"SELECT station, COUNT(*) AS n, {expr} AS avg FROM traffic "
            f"WHERE time >= {t0} AND time < {t1} GROUP BY station"
        )
        status, body = post(run.url, "/snapshot", {"sql": sql})
        assert status == 200, body
        assert (body["from"], body["to"]) == (t0, t1)
        assert body["complete"] is True and "skipped" not in body
        want = brute(fleet_readings, t0, t1, lambda st, seg: st)
        assert body["sources"] == {"memory": 0, "archive": sum(map(len, want.values()))}
        check_grouped(body, want, "station")


def test_a_range_across_the_boundary_is_exact_counting_each_reading_once(
    run, fleet_readings
) -> None:
    b = run.boundary()
    t0, t1 = b - 3 * 3600 + 0.5, b + 3600
    want = brute(fleet_readings, t0, t1, lambda st, seg: seg)
    n = sum(map(len, want.values()))
    for expr in ("AVG(speed)", "AVG(speed + 0)"):
        sql = (
            f"SELECT segment, COUNT(*) AS n, {expr} AS avg FROM traffic "
            f"WHERE time >= {t0} AND time < {t1} GROUP BY segment"
        )
        status, body = post(run.url, "/snapshot", {"sql": sql})
        assert status == 200, body
        assert body["complete"] is True
        src = body["sources"]
        assert src["memory"] > 0 and src["archive"] > 0 and src["memory"] + src["archive"] == n
        assert src["archive"] == sum(1 for t, *_ in fleet_readings if t0 <= t < b)
        check_grouped(body, want, "segment")
    station = fleet_readings[0][1]
    sql = (
        f"SELECT time, speed FROM traffic WHERE station = '{station}' AND time >= {t0} "
        f"AND time < {t1} ORDER BY time"
    )
    status, body = post(run.url, "/snapshot", {"sql": sql})
    assert status == 200, body
    want_rows = sorted((t, v) for t, st, v, _ in fleet_readings if st == station and t0 <= t < t1)
    assert [(r["time"], r["speed"]) for r in body["rows"]] == want_rows


def test_since_reaches_into_the_archive_for_windows_the_history_no_longer_holds(
    run, fleet_readings
) -> None:
    """A query registered with `since` a day back: its windows come from the archive, then
    from memory, each reading once, in one stream of results."""
    from tests.support import ResultRows

    since = START + 6 * 3600.0
    assert since < run.boundary()
    sql = "SELECT segment, COUNT(*) AS n, AVG(speed) AS a FROM traffic [RANGE 1 HOUR] GROUP BY segment"
    status, q = post(run.url, "/queries", {"sql": sql, "since": since})
    assert status == 201, q
    reader = ResultRows(f"{run.url}/queries/{q['id']}/results?format=ndjson&since=0")
    reader.start()
    end = max(t for t, *_ in fleet_readings)
    want: dict = {}
    for t, _, v, seg in fleet_readings:
        ws = t // 3600 * 3600
        if ws >= since and ws + 3600 <= end:
            want.setdefault((seg, ws), []).append(v)
    eventually(lambda: len(reader.rows), lambda n: n >= len(want), timeout=60, interval=0.2)
    got = {(r["segment"], r["window_start"]): r for r in reader.rows}
    assert len(got) == len(reader.rows), "a window emitted twice"
    assert got.keys() == want.keys()
    for key, vals in want.items():
        assert got[key]["n"] == len(vals), key
        assert close(got[key]["a"], sum(vals) / len(vals))
    assert post(run.url, "/queries", {"sql": sql, "since": START - 86400.0})[0] == 201


def test_engine_spark_refuses_a_snapshot_that_needs_every_reading(run) -> None:
    body = {"sql": "SELECT time, station FROM traffic", "engine": "spark"}
    status, answer = post(run.url, "/snapshot", body)
    assert status == 400 and "needs every reading" in answer["error"], answer


def test_a_corrupt_segment_is_skipped_counted_and_named(run, fleet_readings) -> None:
    """Last in the module: it spoils a segment."""
    from gateway.archive import segments

    def pending() -> int:
        status = json.loads(urllib.request.urlopen(f"{run.url}/status", timeout=10).read())
        return status["archive"]["traffic"]["rows_pending"]

    # The writer may still be writing what the fixture saw answered (pending rows count too):
    # wait until only the segment being cut (under segment_rows) is left.
    eventually(pending, lambda n: n < 1000, timeout=120, interval=0.2)
    parts = segments(run.archive)  # every gateway's, in order of number
    assert len(parts) > 3
    bad = parts[2]
    bad.write_bytes(b"PAR1 this is not what it was")
    sql = "SELECT segment, COUNT(*) AS n FROM traffic GROUP BY segment"
    for _ in range(2):
        status, body = post(run.url, "/snapshot", {"sql": sql})
        assert status == 200, body
        assert body["complete"] is False
        assert body["skipped"] == [bad.name]
    assert sum(r["n"] for r in body["rows"]) < len(fleet_readings)
    assert metric(run.url, "fjords_archive_segments_unreadable_total") == 1
