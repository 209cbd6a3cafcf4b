"""`EMIT CHANGES` through `python -m fjords` over the real METR-LA trace, exactly equal to a
brute-force computation over readings.csv: an open hour's early rows every 10 minutes (then the final row,
today's), online aggregation at each day boundary, and early rows every n rows of a window."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.support import ROOT, shared_file

SEGMENTS = ("S02", "S11")
WHERE = "WHERE segment IN ('S02','S11')"
SELECT = "SELECT segment, AVG(speed) AS avg_speed, COUNT(*) AS n FROM traffic"
Q_EARLY = f"{SELECT} [RANGE 1 HOUR] {WHERE} GROUP BY segment EMIT CHANGES EVERY 10 MINUTES"
Q_PLAIN = f"{SELECT} [RANGE 1 HOUR] {WHERE} GROUP BY segment"
Q_ONLINE = f"{SELECT} GROUP BY segment EMIT CHANGES EVERY 1 DAY"
Q_ROWS = f"{SELECT} [RANGE 1 HOUR] {WHERE} GROUP BY segment EMIT CHANGES EVERY 10 ROWS"
QUERIES = (Q_EARLY, Q_PLAIN, Q_ONLINE, Q_ROWS)
HOUR, DAY, EVERY = 3600, 86400, 600


@pytest.fixture(scope="module")
def run() -> dict:
    readings = shared_file("data/metr-la/readings.csv")
    stations = shared_file("data/metr-la/stations.csv")
    argv = [sys.executable, "-m", "fjords", "--trace", str(readings), "--stations", str(stations)]
    for q in QUERIES:
        argv += ["--query", q]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    by_query: dict[int, list[dict]] = defaultdict(list)
    for line in done.stdout.splitlines():
        row = json.loads(line)
        by_query[row.pop("query")].append(row)
    return {"rows": by_query, "readings": _readings(readings, stations)}


def _readings(readings: Path, stations: Path) -> list[tuple[int, str, float]]:
    """(time, segment, speed) in the file's order (the order the CLI replays it in)."""
    with stations.open() as f:
        segment = {r["station"]: r["segment"] for r in csv.DictReader(f)}
    with readings.open() as f:
        return [
            (int(r["time"]), segment[r["station"]], float(r["speed"])) for r in csv.DictReader(f)
        ]


def _agg(values: list[float]) -> tuple[float, int]:
    """The mean as a reading-by-reading sum makes it (no compensated `sum`): the trace is
    replayed in time order, so the Fjord adds the same floats in the same order."""
    total = 0.0
    for v in values:
        total += v
    return total / len(values), len(values)


def _close(got: dict, avg: float, n: int) -> bool:
    return got["n"] == n and got["avg_speed"] == avg  # exactly


def test_early_rows_every_10_minutes_then_todays_final_row(run: dict) -> None:
    rows = run["rows"][0]
    mine = [r for r in run["readings"] if r[1] in SEGMENTS]
    windows = sorted({t // HOUR * HOUR for t, _, _ in mine})
    assert len(windows) == 168  # seven days of hours
    # five early rows per hour and segment, at window_start + k * 10 minutes, then the final
    per: dict[tuple[float, str], list[dict]] = defaultdict(list)
    for r in rows:
        assert r["window_end"] == r["window_start"] + HOUR
        per[(r["window_start"], r["segment"])].append(r)
    assert set(per) == {(float(ws), s) for ws in windows for s in SEGMENTS}
    for (ws, _), rs in per.items():
        assert [(r["final"], r["as_of"] - ws) for r in rs] == [
            (False, 600),
            (False, 1200),
            (False, 1800),
            (False, 2400),
            (False, 3000),
            (True, 3600),
        ]
    # each: the readings of its window and segment before as_of, brute force
    values: dict[tuple[int, str, int], list[float]] = defaultdict(list)
    for t, seg, speed in mine:
        ws = t // HOUR * HOUR
        for k in range((t - ws) // EVERY + 1, HOUR // EVERY + 1):
            values[(ws, seg, ws + k * EVERY)].append(speed)
    assert len(rows) == len(values) == 168 * 2 * 6
    for r in rows:
        avg, n = _agg(values[(int(r["window_start"]), r["segment"], int(r["as_of"]))])
        assert _close(r, avg, n), r
    # the final rows are today's rows (the same query without EMIT CHANGES)
    final = [
        {k: v for k, v in r.items() if k not in ("final", "as_of")} for r in rows if r["final"]
    ]
    today = run["rows"][1]
    assert len(final) == len(today)
    key = lambda r: (r["window_start"], r["segment"])  # noqa: E731
    assert sorted(final, key=key) == sorted(today, key=key)  # bit for bit
    assert all("final" not in r and "as_of" not in r for r in today)


def test_online_aggregation_at_each_day_boundary(run: dict) -> None:
    """No window: the running aggregate since the start, at each epoch-aligned midnight (UTC),
    never final; the last at the first midnight after the last reading."""
    rows = run["rows"][2]
    readings = run["readings"]
    first, last = readings[0][0] // DAY, readings[-1][0] // DAY
    instants = [(d + 1) * DAY for d in range(first, last + 1)]
    assert sorted({r["as_of"] for r in rows}) == instants
    assert all(set(r) == {"segment", "avg_speed", "n", "final", "as_of"} for r in rows)
    assert not any(r["final"] for r in rows)
    got = {(r["as_of"], r["segment"]): r for r in rows}
    assert len(got) == len(rows)
    want: dict[tuple[int, str], list[float]] = defaultdict(list)
    for t, seg, speed in readings:
        for x in instants:
            if t < x:
                want[(x, seg)].append(speed)
    assert got.keys() == want.keys()
    for k, vs in want.items():
        assert _close(got[k], *_agg(vs)), k


def test_early_rows_every_10_rows_of_a_window(run: dict) -> None:
    """A window's 10th, 20th ... reading (of any group, as they arrive) outputs its groups so
    far, as_of that reading's time; its final row at the close."""
    rows = run["rows"][3]
    want: list[tuple] = []
    finals: list[tuple] = []
    window: dict[str, list[float]] = {}
    count, ws = 0, None
    for t, seg, speed in [r for r in run["readings"] if r[1] in SEGMENTS]:
        if t // HOUR * HOUR != ws:
            if ws is not None:
                finals += [(ws, s, False, *_agg(v)) for s, v in window.items()]
            ws, window, count = t // HOUR * HOUR, {}, 0
        window.setdefault(seg, []).append(speed)
        count += 1
        if count % 10 == 0:
            want += [(ws, s, t, *_agg(v)) for s, v in window.items()]
    finals += [(ws, s, False, *_agg(v)) for s, v in window.items()]
    early = [r for r in rows if not r["final"]]
    assert len(early) == len(want) > 168
    for r, (ws, seg, as_of, avg, n) in zip(early, want, strict=True):
        assert (r["window_start"], r["segment"], r["as_of"]) == (ws, seg, as_of)
        assert _close(r, avg, n), r
    final = sorted((r for r in rows if r["final"]), key=lambda r: (r["window_start"], r["segment"]))
    assert len(final) == len(finals) == 168 * 2
    for r, (ws, seg, _, avg, n) in zip(final, sorted(finals), strict=True):
        assert (r["window_start"], r["segment"], r["as_of"]) == (ws, seg, ws + HOUR)
        assert _close(r, avg, n), r
