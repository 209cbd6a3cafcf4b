"""`EMIT EVERY n ROWS [PARTITIONED BY col]` (CSQL's tuple frequency): at each partition's n-th,
2n-th, ... reading, of time t, the partition's aggregate over (t - r, t]; refused with where
when it cannot mean that."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from fjords.compile.sql import ast
from fjords.compile.sql.parser import parse
from fjords.engine import Engine
from fjords.errors import ClauseError, QueryError, QuerySyntaxError
from fjords.runtime.fjord import Fjord
from fjords.schema import Schema
from tests.fjords.test_sample_every import first_days, python_m_fjords

SCHEMA = Schema(
    [("time", "int"), ("station", "str"), ("speed", "float"), ("segment", "str")], time="time"
)
SEGMENT = {"a": "S1", "b": "S1", "c": "S2"}
# Out of step on purpose: c reads every 20 s, a and b every 30 s, b's speeds differ.
ROWS = sorted(
    [
        (t, st, float(10 + (t // 10 * 7 + i * 13) % 50), SEGMENT[st])
        for i, st in enumerate("ab")
        for t in range(0, 1800, 30)
    ]
    + [(t, "c", float(t % 70), "S2") for t in range(0, 1800, 20)]
)
BY_STATION = "SELECT station, AVG(speed) AS a, COUNT(*) AS n FROM traffic [RANGE 5 MINUTES]"


def test_emit_every_rows_parses_with_and_without_a_partition() -> None:
    q = parse(f"{BY_STATION} GROUP BY station EMIT EVERY 4 ROWS PARTITIONED BY station")
    assert q.emit_every_rows == 4
    assert q.emit_partition == ast.Column(None, "station")
    assert q.emit_partition.pos == (1, 129)
    q = parse("SELECT AVG(speed) FROM traffic [RANGE 1 HOUR] emit every 10 rows")
    assert (q.emit_every_rows, q.emit_partition, q.emit_every_s) == (10, None, None)
    assert q.pos_of("EMIT EVERY ROWS") == (1, 47)


@pytest.mark.parametrize(
    ("tail", "words", "pos"),
    [
        ("EMIT EVERY 0 ROWS", r"at least 1 \(got 0\)", (2, 13)),
        ("EMIT EVERY 1.5 ROWS", "whole number", (2, 13)),
        ("EMIT EVERY -6 ROWS", "got -6", (2, 13)),
        ("EMIT EVERY 1 MINUTE EMIT EVERY 6 ROWS", "keep one", (2, 22)),
    ],
)
def test_a_bad_count_is_refused_at_it(tail: str, words: str, pos: tuple[int, int]) -> None:
    with pytest.raises(QuerySyntaxError, match=words) as e:
        parse(f"SELECT AVG(speed) FROM traffic [RANGE 1 HOUR]\n {tail}")
    assert (e.value.line, e.value.column) == pos


def _engine() -> Engine:
    e = Engine(Fjord())
    e.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    return e


@pytest.mark.parametrize(
    ("sql", "words", "pos"),
    [
        (
            "SELECT COUNT(*) FROM traffic [ROWS 10]\n EMIT EVERY 3 ROWS",
            "needs a time window",
            (1, 31),
        ),
        ("SELECT COUNT(*) FROM traffic\n EMIT EVERY 3 ROWS", "needs a time window", (2, 2)),
        (
            "SELECT COUNT(*) FROM traffic [RANGE 1 HOUR SLIDE 5 MINUTES]\n EMIT EVERY 3 ROWS",
            "SLIDE",
            (1, 31),
        ),
        (
            "SELECT station, COUNT(*) FROM traffic [RANGE 1 HOUR] GROUP BY station\n"
            " EMIT EVERY 3 ROWS PARTITIONED BY lane",
            "has no such column",
            (2, 35),
        ),
        ("SELECT station FROM traffic\n EMIT EVERY 3 ROWS", "no aggregate", (2, 2)),
        (
            "SELECT COUNT(DISTINCT station) FROM traffic [RANGE 1 HOUR]\n EMIT EVERY 3 ROWS",
            "DISTINCT",
            (1, 8),
        ),
        (
            "SELECT COUNT(*) AS n FROM traffic [RANGE 1 HOUR] UNION ALL "
            "SELECT COUNT(*) AS n FROM traffic [RANGE 1 HOUR]\n EMIT EVERY 3 ROWS",
            "UNION ALL",
            (2, 2),
        ),
    ],
)
def test_emit_every_rows_where_it_cannot_apply_is_refused_at_the_clause(
    sql: str, words: str, pos: tuple[int, int]
) -> None:
    e = _engine()
    with pytest.raises(QueryError, match=words) as err:
        e.add_query(sql)
    assert isinstance(err.value, (ClauseError, QuerySyntaxError))
    assert (err.value.line, err.value.column) == pos
    assert e.fjord.queries == {}


def _run(sql: str) -> list[dict]:
    e = _engine()
    rq = e.add_query(sql, query_id="q")
    out: list[tuple] = []
    rq.sink.add_batch_callback(out.extend)
    for r in ROWS:
        e.fjord.push("traffic", r)
        e.fjord.run_until_idle()
    e.fjord.end_of_stream()
    e.fjord.run_until_idle()
    return [dict(zip(rq.columns, r, strict=True)) for r in out]


def _brute(rows: list[tuple], every: int, part, group, r: float, having=None) -> list[dict]:
    """Every partition's n-th readings, each with its groups over (t - r, t], in time order."""
    seen: Counter = Counter()
    out = []
    for row in rows:
        p = part(row)
        seen[p] += 1
        if seen[p] % every:
            continue
        t = row[0]
        inside = [x for x in rows if t - r < x[0] <= t and part(x) == p]
        groups: dict = {}
        for x in inside:
            groups.setdefault(group(x), []).append(x[2])
        for g, speeds in groups.items():
            item = {"key": g, "a": sum(speeds) / len(speeds), "n": len(speeds), "end": float(t)}
            if having is None or having(item):
                out.append(item)
    return out


def _shape(rows: list[dict], key: str) -> list[dict]:
    return [
        {"key": r[key], "a": pytest.approx(r["a"]), "n": r["n"], "end": r["window_end"]}
        for r in rows
    ]


def test_each_stations_nth_reading_gives_its_aggregate_over_the_range_before_it() -> None:
    got = _run(f"{BY_STATION} GROUP BY station EMIT EVERY 4 ROWS PARTITIONED BY station")
    assert all(r["window_start"] == r["window_end"] - 300 for r in got)
    want = _brute(ROWS, 4, lambda x: x[1], lambda x: x[1], 300)
    assert sorted(_shape(got, "station"), key=lambda d: (d["end"], d["key"])) == sorted(
        want, key=lambda d: (d["end"], d["key"])
    )
    assert len(got) == 60 // 4 * 2 + 90 // 4


def test_a_partition_wider_than_the_groups_and_having() -> None:
    got = _run(
        "SELECT station, AVG(speed) AS a, COUNT(*) AS n FROM traffic [RANGE 2 MINUTES] "
        "GROUP BY station HAVING COUNT(*) > 3 EMIT EVERY 5 ROWS PARTITIONED BY segment"
    )
    want = _brute(ROWS, 5, lambda x: x[3], lambda x: x[1], 120, lambda d: d["n"] > 3)
    assert want and _shape(got, "station") == want


def test_without_a_partition_the_whole_input_counts() -> None:
    got = _run(
        "SELECT segment AS k, AVG(speed) AS a, COUNT(*) AS n FROM traffic [RANGE 1 MINUTE] "
        "WHERE speed > 20 GROUP BY segment EMIT EVERY 7 ROWS"
    )
    rows = [r for r in ROWS if r[2] > 20]
    want = _brute(rows, 7, lambda x: None, lambda x: x[3], 60)
    assert want and _shape(got, "k") == want


def test_explain_shows_the_rhythm() -> None:
    plan = _engine().explain(
        f"{BY_STATION} GROUP BY station EMIT EVERY 4 ROWS PARTITIONED BY station"
    )
    assert plan["shape"] == (
        "windowed aggregate every 4 rows partitioned by station, over (t - range, t]"
    )
    (agg,) = [op for op in plan["operators"] if op["operator"] == "row_rhythm_aggregate"]
    assert agg["emit_every_rows"] == 4 and agg["range"] == 300


def test_emit_every_6_rows_per_station_over_metr_la_matches_brute_force(tmp_path: Path) -> None:
    readings = first_days(tmp_path, 2)
    got = pd.DataFrame(
        python_m_fjords(
            readings,
            "SELECT station, AVG(speed) AS avg_speed, COUNT(*) AS n FROM traffic [RANGE 1 HOUR] "
            "GROUP BY station EMIT EVERY 6 ROWS PARTITIONED BY station",
        )
    )
    df = pd.read_csv(readings, dtype={"station": str}).sort_values(["station", "time"])
    # Each reading's hour (t - 3600, t] of its station, by pandas' own window (closed right).
    roll = (
        df.assign(ts=pd.to_datetime(df.time, unit="s"))
        .set_index("ts")
        .groupby("station", sort=True)
        .speed.rolling("3600s", closed="right")
    )
    df = df.assign(want_avg=roll.mean().to_numpy(), want_n=roll.count().to_numpy())
    nth = df.groupby("station").cumcount() + 1
    ends = df[nth % 6 == 0]
    want = ends.rename(columns={"time": "window_end"})[
        ["station", "window_end", "want_avg", "want_n"]
    ]
    assert len(got) == len(ends) == len(want) == len(df) // 6
    merged = got.merge(want, on=["station", "window_end"], how="outer", indicator=True)
    assert (merged._merge == "both").all()
    assert (merged.n == merged.want_n).all()
    assert (merged.avg_speed - merged.want_avg).abs().max() < 1e-9
    assert (merged.window_start == merged.window_end - 3600).all()
    # Out in time order: each station's 6th reading comes before any station's 12th.
    assert got.window_end.is_monotonic_increasing


def test_outputs_are_sliced_across_transitions_and_state_is_bounded() -> None:
    """A watermark releasing many outputs emits a limited number per transition (the rest
    next time, still in order); panes beyond every pending window are dropped."""
    from fjords.limits import Limits

    sql = f"{BY_STATION} GROUP BY station EMIT EVERY 1 ROWS PARTITIONED BY station"
    e = Engine(Fjord(limits=Limits(max_windows_per_transition=3)))
    e.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    rq = e.add_query(sql, query_id="q")
    out: list[tuple] = []
    rq.sink.add_batch_callback(out.extend)
    (agg,) = [op for op in rq.operators if op.kind == "row_rhythm_aggregate"]
    held = []
    for r in ROWS:
        e.fjord.push("traffic", r)
        e.fjord.run_until_idle()
        held.append(agg._states)  # type: ignore[attr-defined]
    e.fjord.end_of_stream()
    e.fjord.run_until_idle()
    # (t - 300, t] of 3 stations reading every 20-30 s, and the times not yet passed
    assert max(held) <= 3 * 20 and agg._states == 0  # type: ignore[attr-defined]
    want = _brute(ROWS, 1, lambda x: x[1], lambda x: x[1], 300)
    got = [dict(zip(rq.columns, r, strict=True)) for r in out]
    assert sorted(_shape(got, "station"), key=lambda d: (d["end"], d["key"])) == sorted(
        want, key=lambda d: (d["end"], d["key"])
    )


def test_a_watermark_releasing_many_outputs_emits_them_a_few_per_transition() -> None:
    from fjords.limits import Limits

    sql = f"{BY_STATION} GROUP BY station EMIT EVERY 2 ROWS PARTITIONED BY station"
    e = Engine(Fjord(limits=Limits(max_windows_per_transition=3)))
    e.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    rq = e.add_query(sql, query_id="q")
    out: list[tuple] = []
    rq.sink.add_batch_callback(out.extend)
    for r in ROWS:
        e.fjord.push("traffic", r)
    e.fjord.end_of_stream()
    (agg,) = [op for op in rq.operators if op.kind == "row_rhythm_aggregate"]
    steps = e.fjord.run_until_idle()
    want = _brute(ROWS, 2, lambda x: x[1], lambda x: x[1], 300)
    got = [dict(zip(rq.columns, r, strict=True)) for r in out]
    assert _shape(got, "station") == sorted(want, key=lambda d: d["end"])
    assert agg.transitions >= len(want) // 3 and steps > 0
