"""`python -m fjords` on the real METR-LA trace answers the issue's queries like pandas does."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pandas as pd
import pytest

from fjords.__main__ import main, run_file
from tests.support import ROOT, shared_file

Q1 = (
    "SELECT segment, AVG(speed) AS avg_speed FROM traffic [RANGE 15 MINUTES] "
    "WHERE segment IN ('S05','S14') GROUP BY segment"
)
Q_FILTER = "SELECT * FROM traffic WHERE speed < 30 AND station = '773869'"
Q_HAVING = (
    "SELECT station, MAX(speed) FROM traffic [RANGE 1 HOUR SLIDE 15 MINUTES] "
    "GROUP BY station HAVING MAX(speed) > 65"
)
Q2 = (
    "SELECT i.incident_id, i.description, s.segment, AVG(s.speed) AS avg_speed "
    "FROM traffic AS s [RANGE 30 MINUTES], incidents AS i "
    "WHERE i.segment = s.segment AND i.time >= NOW - 30 MINUTES AND i.time < NOW "
    "GROUP BY i.incident_id, i.description, s.segment HAVING AVG(s.speed) < 40"
)


@pytest.fixture(scope="module")
def metr_la() -> dict:
    readings = shared_file("data/metr-la/readings.csv")
    stations = shared_file("data/metr-la/stations.csv")
    incidents = shared_file("data/metr-la/incidents-sample.csv")
    out = io.StringIO()
    run_file(
        str(readings),
        [Q1, Q_FILTER, Q_HAVING, Q2],
        stations=str(stations),
        tables=[("incidents", str(incidents))],
        out=out,
    )
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    df = pd.read_csv(readings, dtype={"station": str}).merge(
        pd.read_csv(stations, dtype={"station": str}), on="station"
    )
    inc = pd.read_csv(incidents, dtype={"incident_id": str})
    return {"rows": rows, "df": df, "incidents": inc}


def _by_query(rows: list[dict], i: int) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "query"} for r in rows if r["query"] == i]


def _tumbling(df: pd.DataFrame, size: int) -> pd.DataFrame:
    return df.assign(
        window_start=(df.time // size) * size, window_end=(df.time // size) * size + size
    )


def test_query1_matches_pandas(metr_la: dict) -> None:
    df = metr_la["df"]
    d = _tumbling(df[df.segment.isin(["S05", "S14"])], 900)
    want = d.groupby(["segment", "window_start", "window_end"]).speed.mean().reset_index()
    got = pd.DataFrame(_by_query(metr_la["rows"], 0))
    assert list(got.columns) == ["segment", "avg_speed", "window_start", "window_end"]
    merged = want.merge(
        got, on=["segment", "window_start", "window_end"], how="outer", indicator=True
    )
    assert (merged._merge == "both").all()
    assert len(got) == len(want) == 2 * 2016 // 3
    assert (merged.speed - merged.avg_speed).abs().max() < 1e-6


def test_filter_query_matches_pandas(metr_la: dict) -> None:
    df = metr_la["df"]
    want = df[(df.speed < 30) & (df.station == "773869")]
    got = _by_query(metr_la["rows"], 1)
    assert len(got) == len(want) > 0
    assert [r["time"] for r in got] == want.time.tolist()
    assert set(got[0]) == {"time", "station", "speed", "latitude", "longitude", "segment"}


def test_sliding_having_query_matches_pandas(metr_la: dict) -> None:
    df = metr_la["df"]
    parts = []
    for off in range(0, 3600, 900):  # hour windows starting at every 15-minute boundary
        start = ((df.time - off) // 3600) * 3600 + off
        parts.append(df.assign(window_start=start, window_end=start + 3600))
    d = pd.concat(parts)
    agg = d.groupby(["station", "window_start", "window_end"]).speed.max().reset_index()
    want = agg[agg.speed > 65]
    got = pd.DataFrame(_by_query(metr_la["rows"], 2))
    assert list(got.columns) == ["station", "max_speed", "window_start", "window_end"]
    merged = want.merge(
        got, on=["station", "window_start", "window_end"], how="outer", indicator=True
    )
    assert (merged._merge == "both").all() and len(got) == len(want)
    assert (merged.speed == merged.max_speed).all()


def test_query2_matches_pandas(metr_la: dict) -> None:
    df, inc = metr_la["df"], metr_la["incidents"]
    d = _tumbling(df, 1800)
    seg = d.groupby(["segment", "window_start", "window_end"]).speed.mean().reset_index()
    j = seg.merge(inc, on="segment")
    j = j[(j.time >= j.window_end - 1800) & (j.time < j.window_end) & (j.speed < 40)]
    got = pd.DataFrame(_by_query(metr_la["rows"], 3))
    assert len(got) == len(j) > 0
    merged = j.merge(
        got, on=["incident_id", "description", "segment", "window_start", "window_end"]
    )
    assert len(merged) == len(j)
    assert (merged.speed - merged.avg_speed).abs().max() < 1e-6


def test_cli_errors_are_clear(tmp_path) -> None:
    csv = tmp_path / "r.csv"
    csv.write_text("time,station,speed\n1,a,3\n")
    assert (
        main(["--readings", str(tmp_path / "missing.csv"), "--query", "SELECT * FROM traffic"]) == 2
    )
    assert main(["--readings", str(csv), "--query", "SELEC * FROM traffic"]) == 2
    assert main(["--readings", str(csv), "--query", "SELECT nope FROM traffic"]) == 2


def test_cli_runs_as_a_module(tmp_path) -> None:
    csv = tmp_path / "r.csv"
    csv.write_text("time,station,speed\n0,a,3\n60,a,5\n120,a,7\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fjords",
            "--readings",
            str(csv),
            "--json",
            "--query",
            "SELECT station, AVG(speed) AS a FROM traffic [RANGE 2 MINUTES] GROUP BY station",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(x) for x in proc.stdout.splitlines()]
    assert lines == [
        {"query": 0, "station": "a", "a": 4.0, "window_start": 0.0, "window_end": 120.0},
        {"query": 0, "station": "a", "a": 7.0, "window_start": 120.0, "window_end": 240.0},
    ]


def test_cli_queries_keep_their_order_however_spelt(tmp_path, capsys) -> None:
    """`--query SQL`, `--query=SQL` and an abbreviation (`--que`) all count, in the order given:
    a row's "query" index is its query's position on the command line."""
    csv = tmp_path / "r.csv"
    csv.write_text("time,station,speed\n0,a,3\n60,b,5\n")
    q = "SELECT station FROM traffic WHERE speed = {}"
    for argv in (
        ["--query", q.format(5), "--readings", str(csv), f"--query={q.format(3)}"],
        ["--que", q.format(5), "--readings", str(csv), "--query", q.format(3)],
    ):
        assert main(argv) == 0
        rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert sorted((r["query"], r["station"]) for r in rows) == [(0, "b"), (1, "a")]
    with pytest.raises(SystemExit) as e:
        main(["--readings", str(csv)])
    assert e.value.code == 2
    assert "--query" in capsys.readouterr().err
