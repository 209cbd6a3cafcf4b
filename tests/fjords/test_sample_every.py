"""`SAMPLE EVERY n ROWS`: each sensor's n-th, 2n-th, ... reading, counted from the first the
query sees; refused with where when it cannot mean that."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from fjords.compile.sql.parser import parse
from fjords.engine import Engine
from fjords.errors import ClauseError, QueryError, QuerySyntaxError
from fjords.runtime.fjord import Fjord
from fjords.schema import Schema
from tests.support import ROOT, shared_file

SCHEMA = Schema([("time", "int"), ("station", "str"), ("speed", "float")], time="time")


def python_m_fjords(readings: object, sql: str) -> list[dict]:
    """`python -m fjords --trace readings --query sql`, its rows."""
    proc = subprocess.run(
        [sys.executable, "-m", "fjords", "--trace", str(readings), "--query", sql],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


def first_days(folder: Path, days: int) -> Path:
    """The first `days` days of METR-LA's readings (the trace is in time order) in `folder`:
    real readings of every station, at a fraction of the week's cost."""
    out = folder / f"readings-{days}d.csv"
    with shared_file("data/metr-la/readings.csv").open() as src, out.open("w") as dst:
        dst.write(src.readline())
        end = None
        for line in src:
            t = int(line.split(",", 1)[0])
            end = t + days * 86_400 if end is None else end
            if t >= end:
                break
            dst.write(line)
    return out


def test_sample_every_parses_to_the_query() -> None:
    q = parse("SELECT * FROM traffic SAMPLE EVERY 3 ROWS")
    assert q.sample_every_rows == 3
    assert q.pos_of("SAMPLE EVERY") == (1, 23)
    assert parse("SELECT * FROM traffic sample every +1 rows").sample_every_rows == 1


@pytest.mark.parametrize(
    ("tail", "words", "pos"),
    [
        ("SAMPLE EVERY 0 ROWS", r"at least 1 \(got 0\)", (2, 15)),
        ("SAMPLE EVERY 2.5 ROWS", "whole number", (2, 15)),
        ("SAMPLE EVERY -3 ROWS", "got -3", (2, 15)),
        ("SAMPLE EVERY 1e3 ROWS", "whole number", (2, 15)),
    ],
)
def test_a_count_that_is_not_a_whole_number_of_at_least_one_is_refused_at_it(
    tail: str, words: str, pos: tuple[int, int]
) -> None:
    with pytest.raises(QuerySyntaxError, match=words) as e:
        parse(f"SELECT * FROM traffic\n {tail}")
    assert (e.value.line, e.value.column) == pos


def _engine() -> Engine:
    e = Engine(Fjord())
    e.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    return e


@pytest.mark.parametrize(
    ("sql", "words", "pos"),
    [
        (
            "SELECT * FROM traffic\n SAMPLE PERIOD 1 MINUTE SAMPLE EVERY 2 ROWS",
            "both set the sample rate",
            (2, 25),
        ),
        (
            "SELECT a.station FROM traffic AS a [RANGE 5 MINUTES], traffic AS b [RANGE 5 MINUTES] "
            "WHERE a.station = b.station SAMPLE EVERY 2 ROWS",
            "join of two streams",
            (1, 114),
        ),
        (
            "SELECT * FROM traffic UNION ALL SELECT * FROM traffic SAMPLE EVERY 2 ROWS",
            "UNION ALL",
            (1, 55),
        ),
    ],
)
def test_sample_every_where_it_cannot_apply_is_refused_at_the_clause(
    sql: str, words: str, pos: tuple[int, int]
) -> None:
    e = _engine()
    with pytest.raises(QueryError, match=words) as err:
        e.add_query(sql)
    assert isinstance(err.value, (ClauseError, QuerySyntaxError))
    assert (err.value.line, err.value.column) == pos
    assert e.fjord.queries == {}


def test_every_nth_reading_per_sensor_counted_before_the_filter_and_reported() -> None:
    """The count runs over the sensor's readings (as a slower mote would sample), then WHERE;
    the readings left out are in the query's stats as sampled out, not as losses."""
    e = _engine()
    rq = e.add_query(
        "SELECT time, station, speed FROM traffic WHERE speed > 2 SAMPLE EVERY 3 ROWS",
        query_id="q",
    )
    plain = e.add_query("SELECT time, station FROM traffic", query_id="p")
    out: list[tuple] = []
    rq.sink.add_batch_callback(out.extend)
    rows = [(t, st, float(t % 5)) for t in range(30) for st in ("a", "b")]
    for r in rows:
        e.fjord.push("traffic", r)
    e.fjord.end_of_stream()
    e.fjord.run_until_idle()
    seen: Counter[str] = Counter()
    want = []
    for r in rows:
        seen[r[1]] += 1
        if seen[r[1]] % 3 == 0 and r[2] > 2:
            want.append(r)
    assert out == want
    stats = e.fjord.stats()["queries"]
    assert stats["q"]["sampled_out"] == 40
    assert "sampled_out" not in stats["p"]
    assert plain.sink.rows == 60
    assert "SAMPLE EVERY 3 ROWS" in json.dumps(e.explain(rq.sql or ""))
    from gateway.metrics import render

    text = render(e.fjord, list, dict).decode()
    assert 'fjords_query_sampled_out_total{query="q"} 40.0' in text


def test_a_sampled_aggregate_counts_only_its_readings_and_shares_with_no_one() -> None:
    e = _engine()
    agg = "SELECT station, COUNT(*) AS n FROM traffic [RANGE 10 SECONDS] GROUP BY station"
    sampled = e.add_query(f"{agg} SAMPLE EVERY 2 ROWS", query_id="s")
    whole = e.add_query(agg, query_id="w")
    got: dict[str, list[tuple]] = {"s": [], "w": []}
    sampled.sink.add_batch_callback(got["s"].extend)
    whole.sink.add_batch_callback(got["w"].extend)
    for t in range(20):
        e.fjord.push("traffic", (t, "a", 1.0))
    e.fjord.end_of_stream()
    e.fjord.run_until_idle()
    assert [r[1] for r in got["w"]] == [10, 10]
    assert [r[1] for r in got["s"]] == [5, 5]
    assert e.fjord.stats()["queries"]["s"]["sampled_out"] == 10


def test_sample_every_3_rows_over_metr_la_is_every_third_reading_per_station(
    tmp_path: Path,
) -> None:
    readings = first_days(tmp_path, 2)
    got = pd.DataFrame(
        python_m_fjords(
            readings,
            "SELECT time, station, speed FROM traffic WHERE speed < 40 SAMPLE EVERY 3 ROWS",
        )
    )
    df = pd.read_csv(readings, dtype={"station": str})
    nth = df.groupby("station", sort=False).cumcount() + 1
    want = df[(nth % 3 == 0) & (df.speed < 40)]
    assert len(want) > 1000
    got = got.drop(columns="query")
    assert got.to_dict("records") == want.to_dict("records")


def test_with_since_the_history_is_sampled_and_the_live_count_goes_on_from_it() -> None:
    from fjords.runtime.history import History

    e = _engine()
    e.fjord.keep_history("traffic", History("traffic", SCHEMA, keep_s=86_400.0))
    rows = [(t, st, float(t)) for t in range(40) for st in ("a", "b")]
    q = e.fjord.streams["traffic"].queue
    q.put_many(rows[:30])
    e.fjord.run_until_idle()
    out: list[tuple] = []
    p = e.prepare("SELECT time, station FROM traffic SAMPLE EVERY 4 ROWS", query_id="s", since=0)
    p.plan.sink.add_batch_callback(out.extend)
    e.add_query(p)
    q.put_many(rows[30:])
    e.fjord.end_of_stream()
    e.fjord.run_until_idle()
    # Each station's 4th, 8th, ... reading since time 0, across the history and the live part.
    assert out == [(t, st) for t, st, _ in rows if (t + 1) % 4 == 0]
