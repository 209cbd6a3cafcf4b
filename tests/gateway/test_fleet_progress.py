"""The README's fleet command against the real daemon and a real Mosquitto, default [runtime]:
the METR-LA fleet (one mote per station, readings every 300 s of event time) replayed as fast as
the link takes it, and at `--speedup N`. Nothing may be late and every closed window of a
tumbling 30-minute COUNT/AVG per segment must equal a brute-force computation over the trace.

The full 207-mote fleet runs once (the CI full-fleet run); the paced run uses a subset.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from pathlib import Path

from tests.daemon import wait_healthy
from tests.support import (
    ROOT,
    Broker,
    ResultRows,
    eventually,
    fleet_command,
    free_port,
    shared_file,
)

QUERY = (
    "SELECT segment, COUNT(*) AS n, AVG(speed) AS avg_speed "
    "FROM traffic [RANGE 30 MINUTES] GROUP BY segment"
)
WINDOW = 1800.0


def brute_force(trace: Path, stations_csv: Path, keep: set[str] | None) -> dict:
    """(segment, window_start) -> (count, mean speed), straight from the CSVs."""
    import csv

    segment = {}
    with stations_csv.open() as f:
        for row in csv.DictReader(f):
            segment[row["station"]] = row["segment"]
    acc: dict[tuple[str, float], list[float]] = defaultdict(lambda: [0, 0.0])
    with trace.open() as f:
        for row in csv.DictReader(f):
            sid = row["station"]
            if row["speed"] == "" or sid not in segment or (keep is not None and sid not in keep):
                continue
            t = float(row["time"])
            a = acc[(segment[sid], (t // WINDOW) * WINDOW)]
            a[0] += 1
            a[1] += float(row["speed"])
    return {k: (n, s / n) for k, (n, s) in acc.items()}


def metric(url: str, name: str) -> float:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"{name}(?:\{{[^}}]*\}})? (\S+)$", line)
        if m:
            total += float(m.group(1))
    return total


def drops(url: str) -> dict[tuple[str, str], float]:
    """`fjords_dropped_total` by (stage, reason), the ones above zero."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    out = {}
    for m in re.finditer(r"^fjords_dropped_total\{([^}]*)\} (\S+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if float(m.group(2)):
            out[(labels["stage"], labels["reason"])] = float(m.group(2))
    return out


def run_fleet(
    broker: Broker,
    tmp_path: Path,
    trace: Path,
    *,
    limit: int | None = None,
    speedup: float | None = None,
    archive: Path | None = None,
) -> int:
    """Runs the fleet into a daemon and checks its windows; returns the samples sent."""
    stations = shared_file("data/metr-la/stations.csv")
    config = tmp_path / "gateway.toml"
    port = free_port()
    # Default [runtime]: only the HTTP port, the broker and a state dir.
    config.write_text(
        f'[http]\nport = {port}\n[mqtt]\nurl = "mqtt://{broker.host}:{broker.port}"\n'
        f'[state]\ndir = "{tmp_path / "state"}"\n'
        + (f'[archive]\ndir = "{archive}"\n' if archive is not None else "")
    )
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "gateway.log").open("w")
    gateway = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "run", "--config", str(config)],
        cwd=ROOT,
        stderr=log,
        text=True,
    )
    try:
        wait_healthy(url, gateway)
        req = urllib.request.Request(
            f"{url}/queries",
            data=json.dumps({"sql": QUERY}).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        qid = json.loads(urllib.request.urlopen(req, timeout=10).read())["id"]
        reader = ResultRows(f"{url}/queries/{qid}/results?format=ndjson", timeout=600)
        reader.start()
        cmd = fleet_command(broker, trace, stations)
        if limit is not None:
            cmd += ["--limit", str(limit)]
        if speedup is not None:
            cmd += ["--speedup", str(speedup)]
        started = time.monotonic()
        fleet = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert fleet.returncode == 0, fleet.stderr
        sent = int(re.search(r"sent (\d+) samples", fleet.stderr).group(1))  # type: ignore[union-attr]
        keep = None
        if limit is not None:  # simulate-motes --limit: the first N stations of stations.csv
            with stations.open() as f:
                keep = {line.split(",", 1)[0] for line in list(f)[1 : limit + 1]}
        want = brute_force(trace, stations, keep)
        last = max(ws for _, ws in want)
        # Every window that ends at or before the last reading closes (the fleet then goes quiet
        # and idleness releases every sensor); only the last window waits for later data.
        closed = {k: v for k, v in want.items() if k[1] + WINDOW <= last}

        def not_out() -> list[tuple[str, float]]:
            return sorted(closed.keys() - {(r["segment"], r["window_start"]) for r in reader.rows})

        def progress() -> tuple[int, float | None]:
            """Closed windows not yet out, and (once none is) the samples taken in."""
            n = len(not_out())
            return n, None if n else metric(url, "fjords_stream_tuples_in_total")

        eventually(
            progress,
            lambda p: p[0] == 0 and p[1] >= sent,
            message=lambda: f"every closed window out (e.g. {not_out()[:3]}) and {sent} samples in",
            timeout=120,
            interval=0.5,
        )
        print(f"fleet of {limit or 'all'} motes: {time.monotonic() - started:.1f} s")
        assert metric(url, "fjords_stream_late_samples_total") == 0
        lost = {k: n for k, n in drops(url).items() if k[1] != "clock_rejected"}
        assert not lost, f"dropped (stage, reason): {lost}"
        assert metric(url, "fjords_stream_tuples_in_total") == sent
        got_rows = {(r["segment"], r["window_start"]): r for r in reader.rows}
        assert len(got_rows) == len(reader.rows), "a window was emitted twice"
        missing = sorted(closed.keys() - got_rows.keys())
        assert not missing, f"{len(missing)} windows never emitted, e.g. {missing[:3]}"
        wrong = [
            (k, got_rows[k]["n"], n)
            for k, (n, avg) in closed.items()
            if got_rows[k]["n"] != n or abs(got_rows[k]["avg_speed"] - avg) > 1e-6
        ]
        assert not wrong, f"{len(wrong)} windows differ, e.g. {wrong[:3]}"
        extra = sorted(k for k in got_rows if k not in want)
        assert not extra, f"rows for windows with no readings: {extra[:3]}"
    finally:
        gateway.terminate()
        assert gateway.wait(timeout=30) == 0
        log.close()
    return sent


def test_full_metr_la_fleet_as_fast_as_possible_is_complete_and_never_late(
    broker: Broker,
    tmp_path: Path,
    spark,
) -> None:
    """The README's fleet, default settings: 0 late, every window right, and an archive that
    holds every reading sent, over which Spark answers Query 2 like `python -m fjords` over
    the CSV."""
    import io

    import pyarrow.parquet as pq

    from fjords.__main__ import run_file
    from gateway.archive import segments
    from gateway.spark.batch import result_rows, run_archive
    from gateway.spark.sources import StaticTable
    from tests.gateway.test_spark import Q2, _assert_same, _of

    readings = shared_file("data/metr-la/readings.csv")
    archive = tmp_path / "archive"
    sent = run_fleet(broker, tmp_path, readings, archive=archive)
    parts = segments(archive / "traffic")
    assert sum(pq.read_metadata(p).num_rows for p in parts) == sent == 417_312

    incidents = shared_file("data/metr-la/incidents-sample.csv")
    out = io.StringIO()
    run_file(
        str(readings),
        [Q2],
        stations=str(shared_file("data/metr-la/stations.csv")),
        tables=[("incidents", str(incidents))],
        out=out,
    )
    want = _of([json.loads(line) for line in out.getvalue().splitlines()], 0)
    assert want
    tables = {"incidents": StaticTable("incidents", incidents)}
    _, df = run_archive(spark, Q2, archive, tables=tables)
    _assert_same(result_rows(df), want)


def test_paced_fleet_subset_is_complete_and_never_late(
    broker: Broker,
    tmp_path: Path,
) -> None:
    # 12 motes, 6 hours of readings at 7,200 x real time (3 s of wall time; 11 windows close).
    src = shared_file("data/metr-la/readings.csv")
    trace = tmp_path / "day.csv"
    with src.open() as f, trace.open("w") as out:
        header = f.readline()
        out.write(header)
        t0 = None
        for line in f:
            t = float(line.split(",", 1)[0])
            t0 = t if t0 is None else t0
            if t >= t0 + 6 * 3600:
                break
            out.write(line)
    run_fleet(broker, tmp_path, trace, limit=12, speedup=7200)


def test_one_sensor_ten_years_ahead_over_mqtt_poisons_no_one(
    broker: Broker,
    tmp_path: Path,
) -> None:
    """Three live motes (clocks in step with the gateway's); one sends a single reading dated
    ten years ahead. It is rejected and counted for that sensor, nobody's samples are late and
    every window still closes with the right counts."""
    import asyncio

    from sensors.protocol import Hello, Samples
    from sensors.transports.broker import BrokerSettings
    from sensors.transports.mqtt import MqttMoteLink

    config = tmp_path / "gateway.toml"
    port = free_port()
    config.write_text(
        f'[http]\nport = {port}\n[mqtt]\nurl = "mqtt://{broker.host}:{broker.port}"\n'
    )
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "gateway.log").open("w")
    gateway = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "run", "--config", str(config)],
        cwd=ROOT,
        stderr=log,
        text=True,
    )
    t0 = (time.time() - 7200) // 300 * 300
    ids = ["a", "b", "liar"]

    async def motes() -> None:
        at = BrokerSettings(broker.host, broker.port)
        links = {sid: MqttMoteLink(sid, at) for sid in ids}
        for link in links.values():
            await link.__aenter__()
        try:
            for link in links.values():
                await link.wait_connected(10)
            for sid, link in links.items():
                await link.send(
                    Hello(
                        sensor_id=sid,
                        schema=(("speed", "float"),),
                        programs=("raw",),
                        program="raw",
                        sample_period_ms=60_000.0,
                        attributes={"station": sid, "segment": "S1"},
                    )
                )
            await asyncio.sleep(1.0)
            for k in range(60):
                for sid, link in links.items():
                    if sid == "liar" and k == 10:
                        ahead = time.time() + 10 * 365 * 86_400
                        await link.send(Samples(sensor_id=sid, times=(ahead,), rows=((1.0,),)))
                    await link.send(Samples(sensor_id=sid, times=(t0 + 60 * k,), rows=((50.0,),)))
            for link in links.values():
                await link.drain()
        finally:
            for link in links.values():
                await link.__aexit__(None, None, None)

    try:
        wait_healthy(url, gateway)
        sql = "SELECT station, COUNT(*) AS n FROM traffic [RANGE 5 MINUTES] GROUP BY station"
        req = urllib.request.Request(
            f"{url}/queries",
            data=json.dumps({"sql": sql}).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        qid = json.loads(urllib.request.urlopen(req, timeout=10).read())["id"]
        reader = ResultRows(f"{url}/queries/{qid}/results?format=ndjson", timeout=600)
        reader.start()
        asyncio.run(motes())
        # Up to the last reading (t0 + 3540) every 5-minute window has closed: 11 per station.
        eventually(
            lambda: len(reader.rows), lambda n: n >= 33, message="33 rows", timeout=60, interval=0.2
        )
        assert metric(url, "fjords_stream_late_samples_total") == 0
        lost = {k: n for k, n in drops(url).items() if k[1] != "clock_rejected"}
        assert not lost, f"dropped (stage, reason): {lost}"
        assert metric(url, "fjords_stream_tuples_in_total") == 180
        by = defaultdict(list)
        for r in reader.rows:
            by[r["station"]].append((r["window_start"], r["n"]))
        for sid in ids:
            assert by[sid] == [(t0 + 300 * w, 5) for w in range(11)], sid
        sensors = json.loads(urllib.request.urlopen(f"{url}/sensors", timeout=10).read())
        cat = {s["id"]: s for s in sensors["sensors"]}
        assert cat["liar"]["clock_rejects"] == 1
        assert cat["a"]["clock_rejects"] == 0 and not cat["a"]["clock_suspect"]
        assert metric(url, "fjords_sensor_clock_rejects_total") == 1
        # No silent loss: the rejected reading is a drop like any other, and health says so.
        text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
        assert 'fjords_dropped_total{reason="clock_rejected",stage="proxies"} 1.0' in text
        health = json.loads(urllib.request.urlopen(f"{url}/healthz", timeout=10).read())
        assert health["status"] == "degraded", health
        assert any("clock_rejected" in r for r in health["reasons"]), health
    finally:
        gateway.terminate()
        assert gateway.wait(timeout=30) == 0
        log.close()
    logged = (tmp_path / "gateway.log").read_text()
    assert logged.count("dropping data: proxies (clock_rejected)") == 1, logged[-3000:]
