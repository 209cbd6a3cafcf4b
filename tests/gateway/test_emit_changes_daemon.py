"""EMIT CHANGES through the real daemon: a simulated METR-LA fleet over a real Mosquitto, the
query registered over HTTP, its early rows (`final` false, `as_of` every 10 minutes of the
open hour) and then the hour's final row read over SSE and NDJSON, checked by brute force."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import urllib.request
from collections import defaultdict

from tests.daemon import Daemon
from tests.support import ROOT, Broker, ResultRows, eventually, fleet_command, shared_file

SQL = (
    "SELECT segment, AVG(speed) AS avg_speed, COUNT(*) AS n FROM traffic [RANGE 1 HOUR] "
    "WHERE segment IN ('S05','S14') GROUP BY segment EMIT CHANGES EVERY 10 MINUTES"
)
HOURS = 3


def test_early_rows_then_final_over_sse_and_ndjson(broker: Broker, tmp_path) -> None:
    stations_csv = shared_file("data/metr-la/stations.csv")
    with stations_csv.open() as f:
        segment = {r["station"]: r["segment"] for r in csv.DictReader(f)}
    with shared_file("data/metr-la/readings.csv").open() as f:
        rows = list(csv.DictReader(f))
    t0 = min(int(r["time"]) for r in rows)
    part = [r for r in rows if int(r["time"]) < t0 + HOURS * 3600]
    trace = tmp_path / "readings.csv"
    with trace.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["time", "station", "speed"])
        w.writeheader()
        w.writerows(part)
    # brute force: (window_start, segment, as_of) -> the speeds before as_of in that window
    want: dict[tuple[float, str, float], list[float]] = defaultdict(list)
    for r in part:
        t, seg = int(r["time"]), segment[r["station"]]
        if seg not in ("S05", "S14"):
            continue
        ws = t // 3600 * 3600
        for k in range((t - ws) // 600 + 1, 7):
            want[(float(ws), seg, float(ws + k * 600))].append(float(r["speed"]))
    config = f'[mqtt]\nurl = "mqtt://{broker.host}:{broker.port}"\n[state]\ndir = "{tmp_path / "state"}"\n'
    with Daemon(tmp_path, config) as gw:
        qid = gw.post("/queries", {"sql": SQL})["id"]
        assert "every 600 s" in json.dumps(gw.get(f"/queries/{qid}"))  # the rhythm, explained
        ndjson = ResultRows(f"{gw.url}/queries/{qid}/results?format=ndjson")
        ndjson.start()
        sse = urllib.request.urlopen(f"{gw.url}/queries/{qid}/results", timeout=120)
        fleet = subprocess.run(
            fleet_command(broker, trace, stations_csv),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert fleet.returncode == 0, fleet.stderr
        # The first HOURS - 1 hours close while the fleet runs (the last needs later data):
        # five early rows and the final one each, per segment.
        closed = 2 * 6 * (HOURS - 1)
        eventually(
            lambda: [r for r in ndjson.rows if r["window_start"] < t0 + (HOURS - 1) * 3600],
            until=lambda rs: len(rs) >= closed,
            timeout=120,
        )
        over_sse: list[dict] = []
        while len(over_sse) < closed:
            line = sse.readline().decode().strip()
            if line.startswith("data: "):
                over_sse.append(json.loads(line[6:]))
        sse.close()
    for got in (over_sse, list(ndjson.rows)[: len(over_sse)]):
        assert got == over_sse  # the same rows, in the same order, on both streams
        per: dict[tuple[float, str], list[tuple[bool, float]]] = defaultdict(list)
        for r in got:
            assert set(r) == {"segment", "avg_speed", "n", "window_start", "window_end"} | {
                "final",
                "as_of",
            }
            per[(r["window_start"], r["segment"])].append((r["final"], r["as_of"]))
            speeds = want[(r["window_start"], r["segment"], r["as_of"])]
            assert r["n"] == len(speeds), r
            assert math.isclose(r["avg_speed"], sum(speeds) / len(speeds), rel_tol=1e-12), r
        for (ws, _), seq in per.items():
            assert seq == [(False, ws + k * 600) for k in range(1, 6)] + [(True, ws + 3600)]


def test_explain_text_shows_the_rhythm(tmp_path) -> None:
    from gateway.cli_text import explain_text
    from gateway.config import Config
    from gateway.daemon import Gateway

    cfg = Config()
    cfg.state_dir = str(tmp_path / "state")
    cfg.http.port = 0
    text = explain_text(SQL, Gateway(cfg).explain(SQL))
    assert "emit:       changes every 600 s of event time, final at the window's close" in text
    assert "final, as_of" in text
