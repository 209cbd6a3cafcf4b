"""Every level and every rhythm on the real daemon, in one run: one daemon, one Mosquitto, one
simulated METR-LA fleet (three hours of readings.csv at full speed) serving the ROLLUP, the
DRILLDOWN, EMIT CHANGES, EMIT EVERY n ROWS PARTITIONED BY and SAMPLE EVERY queries, all
registered over HTTP before the fleet starts; each query's rows checked against pandas.

Only the hours that close while the fleet runs are compared (the last closes with later data).
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.daemon import Daemon
from tests.support import (
    ROOT,
    Broker,
    ResultRows,
    eventually,
    fleet_command,
    require_binary,
    shared_file,
)

HOURS = 3
SQL = {
    "rollup": "SELECT segment, station, AVG(speed) AS avg_speed, COUNT(*) AS n, "
    "GROUPING(segment) AS g_seg, GROUPING(station) AS g_st FROM traffic [RANGE 1 HOUR] "
    "WHERE segment IN ('S05','S14') GROUP BY ROLLUP(segment, station)",
    "drilldown": "SELECT segment, station, AVG(speed) AS avg_speed FROM traffic [RANGE 1 HOUR] "
    "WHERE segment IN ('S02','S11') GROUP BY segment DRILLDOWN station "
    "HAVING avg_speed(segment) < 60 AND avg_speed(station) < 55",
    "changes": "SELECT segment, AVG(speed) AS avg_speed, COUNT(*) AS n FROM traffic "
    "[RANGE 1 HOUR] WHERE segment IN ('S05','S14') GROUP BY segment EMIT CHANGES EVERY 10 MINUTES",
    "rhythm": "SELECT station, AVG(speed) AS avg_speed, COUNT(*) AS n FROM traffic "
    "[RANGE 1 HOUR] WHERE segment IN ('S05','S14') GROUP BY station "
    "EMIT EVERY 6 ROWS PARTITIONED BY station",
    "sample": "SELECT time, station, speed FROM traffic SAMPLE EVERY 3 ROWS",
}
# Every reading of these segments' stations is needed by a query that does not sample: their
# motes keep their own rate; the others serve only SAMPLE EVERY and may sample 3 times slower.
FULL_RATE = {"S02", "S11", "S05", "S14"}


@dataclass
class Run:
    gw: Daemon
    df: pd.DataFrame  # the readings replayed, with each station's segment
    t0: float
    ids: dict[str, str]
    rows: dict[str, ResultRows]
    sse: Any
    taken: dict[str, int] = field(default_factory=dict)  # per mote, readings it took

    def closed(self, rows: list[dict]) -> list[dict]:
        return [r for r in rows if r["window_start"] < self.t0 + (HOURS - 1) * 3600]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("levels")
    readings = pd.read_csv(shared_file("data/metr-la/readings.csv"), dtype={"station": str})
    stations_csv = shared_file("data/metr-la/stations.csv")
    stations = pd.read_csv(stations_csv, dtype={"station": str})
    t0 = float(readings.time.min())
    part = readings[readings.time < t0 + HOURS * 3600]
    trace = tmp / "readings.csv"
    part.to_csv(trace, index=False)
    broker = Broker(require_binary("mosquitto", "mosquitto"), tmp)
    broker.start()
    try:
        config = f'[mqtt]\nurl = "mqtt://{broker.host}:{broker.port}"\n[state]\ndir = "{tmp / "state"}"\n'
        with Daemon(tmp, config) as gw:
            ids = {k: gw.post("/queries", {"sql": sql})["id"] for k, sql in SQL.items()}
            rows = {
                k: ResultRows(f"{gw.url}/queries/{q}/results?format=ndjson") for k, q in ids.items()
            }
            for r in rows.values():
                r.start()
            sse = urllib.request.urlopen(f"{gw.url}/queries/{ids['changes']}/results", timeout=120)
            report = tmp / "report.json"
            fleet = subprocess.run(
                fleet_command(broker, trace, stations_csv, "--report", str(report)),
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert fleet.returncode == 0, fleet.stderr
            taken = {sid: m["taken"] for sid, m in json.loads(report.read_text()).items()}
            df = part.merge(stations, on="station")
            yield Run(gw, df, t0, ids, rows, sse, taken)
            sse.close()
    finally:
        broker.stop()


def _wait(run: Run, name: str, n: int, pick=None) -> list[dict]:
    """The query's rows once at least `n` of them (of `pick`, by default the closed hours')
    have come."""
    pick = pick or run.closed
    return eventually(
        lambda: pick(list(run.rows[name].rows)),
        until=lambda rs: len(rs) >= n,
        timeout=120,
    )


def test_rollup_rows_at_station_segment_and_total_level(run: Run) -> None:
    df = run.df[run.df.segment.isin(["S05", "S14"])]
    df = df.assign(ws=df.time // 3600 * 3600.0)
    df = df[df.ws < run.t0 + (HOURS - 1) * 3600]
    want: dict[tuple, tuple[float, int]] = {}
    for (seg, st, ws), g in df.groupby(["segment", "station", "ws"]):
        want[(seg, st, ws)] = (g.speed.mean(), len(g))
    for (seg, ws), g in df.groupby(["segment", "ws"]):
        want[(seg, None, ws)] = (g.speed.mean(), len(g))
    for ws, g in df.groupby("ws"):
        want[(None, None, ws)] = (g.speed.mean(), len(g))
    rows = _wait(run, "rollup", len(want))
    got = {(r["segment"], r["station"], r["window_start"]): r for r in rows}
    assert len(got) == len(rows) and got.keys() == want.keys()
    for key, r in got.items():
        assert math.isclose(r["avg_speed"], want[key][0], rel_tol=1e-12) and r["n"] == want[key][1]
        assert (r["g_seg"], r["g_st"]) == (r["segment"] is None, r["station"] is None)
    assert sum(r["segment"] is None for r in rows) == HOURS - 1


def test_drilldown_rows_pruned_top_down(run: Run) -> None:
    df = run.df[run.df.segment.isin(["S02", "S11"])]
    df = df.assign(ws=df.time // 3600 * 3600.0)
    df = df[df.ws < run.t0 + (HOURS - 1) * 3600]
    want: dict[tuple, float] = {}
    for (seg, ws), g in df.groupby(["segment", "ws"]):
        if g.speed.mean() < 60:
            want[(seg, None, ws)] = g.speed.mean()
    for (seg, st, ws), g in df.groupby(["segment", "station", "ws"]):
        if (seg, None, ws) in want and g.speed.mean() < 55:
            want[(seg, st, ws)] = g.speed.mean()
    assert any(k[1] is not None for k in want) and any(k[0] == "S11" for k in want) is False
    # The station rows come with their hour's close, after the segment rows of that hour.
    rows = _wait(run, "drilldown", len(want))
    got = {(r["segment"], r["station"], r["window_start"]): r["avg_speed"] for r in rows}
    assert len(got) == len(rows) and got.keys() == want.keys()
    for key, v in got.items():
        assert math.isclose(v, want[key], rel_tol=1e-12), key


def test_emit_changes_early_rows_then_final_over_sse_and_ndjson(run: Run) -> None:
    df = run.df[run.df.segment.isin(["S05", "S14"])]
    # (window_start, segment, as_of) -> the speeds before as_of in that window
    want: dict[tuple[float, str, float], list[float]] = defaultdict(list)
    for t, seg, speed in zip(df.time, df.segment, df.speed, strict=True):
        ws = t // 3600 * 3600
        for k in range((t - ws) // 600 + 1, 7):
            want[(float(ws), seg, float(ws + k * 600))].append(float(speed))
    assert "every 600 s" in json.dumps(run.gw.get(f"/queries/{run.ids['changes']}"))
    closed = 2 * 6 * (HOURS - 1)  # five early rows and the final one per segment and hour
    ndjson = _wait(run, "changes", closed, pick=lambda rs: rs)
    over_sse: list[dict] = []
    while len(over_sse) < closed:
        line = run.sse.readline().decode().strip()
        if line.startswith("data: "):
            over_sse.append(json.loads(line[6:]))
    for got in (over_sse, ndjson[: len(over_sse)]):
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
            if ws < run.t0 + (HOURS - 1) * 3600:
                assert seq == [(False, ws + k * 600) for k in range(1, 6)] + [(True, ws + 3600)]


def test_emit_every_6_rows_per_station_over_the_hour_before(run: Run) -> None:
    df = run.df[run.df.segment.isin(["S05", "S14"])].sort_values(["station", "time"])
    roll = (
        df.assign(ts=pd.to_datetime(df.time, unit="s"))
        .set_index("ts")
        .groupby("station", sort=True)
        .speed.rolling("3600s", closed="right")
    )
    df = df.assign(want_avg=roll.mean().to_numpy(), want_n=roll.count().to_numpy())
    ends = df[(df.groupby("station").cumcount() + 1) % 6 == 0]
    want = {
        (st, float(t)): (a, n)
        for st, t, a, n in zip(ends.station, ends.time, ends.want_avg, ends.want_n, strict=True)
    }
    # Each station's n-th reading is out once the stream's time has passed it.
    last = run.t0 + (HOURS - 1) * 3600
    rows = _wait(
        run,
        "rhythm",
        sum(t < last for _, t in want),
        pick=lambda rs: [r for r in rs if r["window_end"] < last],
    )
    everything = list(run.rows["rhythm"].rows)
    got = {(r["station"], r["window_end"]): r for r in everything}
    assert len(got) == len(everything) and got.keys() <= want.keys()
    assert {k for k in want if k[1] < last} <= got.keys()
    for key, r in got.items():
        assert r["window_start"] == r["window_end"] - 3600
        assert r["n"] == want[key][1] and math.isclose(r["avg_speed"], want[key][0], rel_tol=1e-9)
    assert len(rows) == sum(t < last for _, t in want)


def test_sample_every_3_rows_pushed_to_the_motes_and_counted(run: Run) -> None:
    df = run.df
    segment = dict(zip(df.station, df.segment, strict=False))
    sensors = {s["id"]: s for s in run.gw.get("/sensors?limit=1000")["sensors"]}
    for sid, seg in segment.items():
        wanted = sensors[sid]["wanted"]
        # Only the motes whose every query samples may sample 3 times slower.
        rate = 1 / 300 if seg in FULL_RATE else 1 / 900
        assert wanted["sample_rate_hz"] == pytest.approx(rate), (sid, wanted)
    # Every reading the motes took reached the router: the query got it or sampled it out.
    qid = run.ids["sample"]
    eventually(
        lambda: (len(run.rows["sample"].rows), run.gw.metric("fjords_query_sampled_out_total")),
        until=lambda s: s[0] + s[1] == sum(run.taken.values()),
        timeout=120,
    )
    assert run.gw.get(f"/queries/{qid}")  # still registered
    got: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in run.rows["sample"].rows:
        got[r["station"]].append((float(r["time"]), float(r["speed"])))
    by_station = {
        st: list(zip(g.time.astype(float), g.speed.astype(float), strict=True))
        for st, g in df.sort_values("time").groupby("station")
    }
    for sid, readings in by_station.items():
        if segment[sid] in FULL_RATE:
            assert got[sid] == readings[2::3], sid  # each third reading, exactly
        else:
            # Every third reading until the slower rate is acked, then every reading the mote
            # took (each standing for three): real readings, three steps apart at least.
            assert set(got[sid]) <= set(readings), sid
            times = [t for t, _ in got[sid]]
            assert all(b - a >= 900 for a, b in itertools.pairwise(times)), sid


def test_explain_text_shows_the_levels_the_pruning_and_the_rhythm(tmp_path: Path) -> None:
    from gateway.cli_text import explain_text
    from gateway.config import Config
    from gateway.daemon import Gateway

    cfg = Config()
    cfg.state_dir = str(tmp_path / "state")
    cfg.http.port = 0
    gw = Gateway(cfg)
    text = {k: explain_text(sql, gw.explain(sql)) for k, sql in SQL.items()}
    assert "levels:     (segment, station), (segment), ()" in text["rollup"]
    assert "pruning:" not in text["rollup"]
    assert "levels:     (segment), (segment, station)" in text["drilldown"]
    assert "pruning:    top-down at the window close" in text["drilldown"]
    assert (
        "emit:       changes every 600 s of event time, final at the window's close"
        in (text["changes"])
    )
    assert "final, as_of" in text["changes"]
    assert (
        "emit:       every 6 rows of each station, the aggregate over (t - 3600 s, t]"
        in text["rhythm"]
    )
    assert "sample:     SAMPLE EVERY 3 ROWS: counted per sensor" in text["sample"]
    assert "sensors sample that much slower when all their queries allow it" in text["sample"]
