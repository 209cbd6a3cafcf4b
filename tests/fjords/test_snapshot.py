"""Snapshot queries (fjords.snapshot): the same dialect answered once over a stream's history,
from per-sensor cells and from every reading alike, and exactly as brute force says."""

from __future__ import annotations

import math
import random

import pytest

from fjords.engine import Engine
from fjords.errors import ClauseError, LimitExceeded, QueryError
from fjords.limits import Limits
from fjords.runtime.fjord import Fjord
from fjords.runtime.history import History
from fjords.schema import Field, Schema
from fjords.snapshot import Historical, Snapshots
from fjords.tables import Table

SCHEMA = Schema(
    [
        Field("time", "float"),
        Field("station", "str"),
        Field("speed", "float"),
        Field("latitude", "float"),
        Field("segment", "str"),
    ],
    time="time",
)


def setup(rows: list[tuple], *, limits: Limits | None = None, bucket_s: float = 60.0):
    fjord = Fjord(limits=limits) if limits is not None else Fjord()
    fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    fjord.add_table(
        "segments",
        Table(
            "segments",
            Schema([Field("segment", "str"), Field("name", "str")], time=None),
            [("S0", "north"), ("S1", "south"), ("S2", "east")],
        ),
    )
    engine = Engine(fjord)
    h = History(
        "traffic",
        SCHEMA,
        static=("station", "latitude", "segment"),
        bucket_s=bucket_s,
        keep_s=86400.0,
    )
    fjord.streams["traffic"].router.add("__history__", [], None, h.add_many, late=h.add)
    for i in range(0, len(rows), 1000):
        fjord.streams["traffic"].queue.put_many(rows[i : i + 1000])
        fjord.run_until_idle()
    return engine, Snapshots(engine, {"traffic": h}), Snapshots(engine, {"traffic": h}, cells=False)


def fleet(
    n_stations: int = 20, seconds: int = 7200, period: int = 10, seed: int = 7
) -> list[tuple]:
    rnd = random.Random(seed)
    out = []
    for t in range(0, seconds, period):
        for s in range(n_stations):
            v = None if rnd.random() < 0.03 else round(rnd.uniform(5, 75), 2)
            out.append((1e9 + t + s / 100, f"st{s}", v, 34.0 + s / 10, f"S{s % 3}"))
    return out


ROWS = fleet()
QUERIES = [
    "SELECT segment, COUNT(*) AS n, COUNT(speed) AS c, SUM(speed) AS s, AVG(speed) AS a, "
    "MIN(speed) AS lo, MAX(speed) AS hi FROM traffic [RANGE 30 MINUTES] GROUP BY segment",
    "SELECT station, AVG(speed) AS a FROM traffic WHERE segment = 'S1' AND time >= 1000000100.5 "
    "AND time < 1000003000 GROUP BY station HAVING AVG(speed) > 30 ORDER BY a DESC LIMIT 3",
    "SELECT COUNT(*) AS n FROM traffic [RANGE 1 HOUR] WHERE latitude > 34.5",
    "SELECT CASE WHEN segment = 'S0' THEN 'zero' ELSE 'other' END AS k, MAX(speed) AS m "
    "FROM traffic GROUP BY CASE WHEN segment = 'S0' THEN 'zero' ELSE 'other' END",
    "SELECT DISTINCT segment FROM traffic [RANGE 10 MINUTES]",
    "SELECT s.segment, AVG(speed) AS a, name FROM traffic [RANGE 1 HOUR] AS s, segments AS g "
    "WHERE s.segment = g.segment GROUP BY s.segment, name",
]


@pytest.mark.parametrize("sql", QUERIES)
def test_cells_and_readings_give_the_same_answer(sql: str) -> None:
    _, cells, readings = setup(ROWS)
    a, b = cells.answer(sql), readings.answer(sql)
    assert (a.start, a.end, a.columns) == (b.start, b.end, b.columns)
    assert len(a.rows) == len(b.rows) > 0
    for x, y in zip(a.rows, b.rows, strict=True):
        for u, v in zip(x, y, strict=True):
            assert u == v or (isinstance(u, float) and math.isclose(u, v, rel_tol=1e-12)), (x, y)
    assert b.path == "readings"


def test_which_queries_are_answered_from_cells() -> None:
    _, cells, _ = setup(ROWS)
    assert cells.answer(QUERIES[0]).path == "cells"
    assert cells.answer(QUERIES[1]).path == "cells"
    for sql in (
        "SELECT AVG(speed + 1) AS a FROM traffic [RANGE 1 HOUR]",  # not a bare column
        "SELECT COUNT(*) AS n FROM traffic [RANGE 1 HOUR] WHERE speed > 30",  # reads the measure
        "SELECT MAX(time) AS t FROM traffic [RANGE 1 HOUR]",  # the time column
        QUERIES[5],  # a table join
    ):
        assert cells.answer(sql).path == "readings", sql


def test_a_range_is_the_last_range_before_the_watermark_exactly() -> None:
    engine, cells, _ = setup(ROWS)
    wm = engine.fjord.streams["traffic"].router.progress.watermark
    r = cells.answer("SELECT segment, COUNT(*) AS n, AVG(speed) AS a FROM traffic [RANGE 30 MINUTES] "
                     "GROUP BY segment")  # fmt: skip
    assert (r.start, r.end) == (wm - 1800, wm)
    assert r.complete
    for seg, n, avg, ws, we in r.rows:
        assert (ws, we) == (r.start, r.end)
        mine = [x for x in ROWS if wm - 1800 <= x[0] < wm and x[4] == seg]
        assert n == len(mine)
        vals = [x[2] for x in mine if x[2] is not None]
        assert math.isclose(avg, sum(vals) / len(vals), rel_tol=1e-12)
    assert r.sources == {"memory": sum(1 for x in ROWS if wm - 1800 <= x[0] < wm)}


def test_partial_includes_readings_past_the_watermark_and_says_so() -> None:
    _, cells, _ = setup(ROWS)
    newest = max(x[0] for x in ROWS)
    complete = cells.answer("SELECT COUNT(*) AS n FROM traffic")
    partial = cells.answer("SELECT COUNT(*) AS n FROM traffic", partial=True)
    assert partial.rows == [(len(ROWS),)]
    assert partial.end > newest and not partial.complete
    assert complete.rows[0][0] == sum(1 for x in ROWS if x[0] < complete.end)


def test_rows_without_aggregates_are_filtered_ordered_and_limited() -> None:
    _, cells, _ = setup(ROWS)
    r = cells.answer(
        "SELECT station, speed FROM traffic WHERE segment = 'S2' AND speed > 70 "
        "ORDER BY speed DESC, station LIMIT 4"
    )
    want = sorted(
        (
            (x[1], x[2])
            for x in ROWS
            if r.start <= x[0] < r.end and x[4] == "S2" and x[2] is not None and x[2] > 70
        ),
        key=lambda p: (-p[1], p[0]),
    )
    assert r.rows == want[:4] and len(r.rows) == 4


@pytest.mark.parametrize(
    "sql, says",
    [
        ("SELECT COUNT(*) FROM traffic [RANGE 1 HOUR] EMIT EVERY 1 MINUTE", "EMIT EVERY"),
        ("SELECT station FROM traffic SAMPLE PERIOD 10 SECONDS", "SAMPLE PERIOD"),
        ("SELECT station FROM traffic LIFETIME 3 DAYS", "LIFETIME"),
        ("SELECT station FROM traffic PRIORITY 5", "PRIORITY"),
        ("SELECT COUNT(*) FROM traffic [ROWS 10]", "ROWS"),
        ("SELECT COUNT(*) FROM traffic [RANGE 1 HOUR SLIDE 1 MINUTE]", "SLIDE"),
        ("SELECT COUNT(*) FROM traffic WHERE time > 2000000000", "after the stream's data"),
        ("SELECT station FROM traffic ORDER BY speed + 1", "ORDER BY"),
        ("SELECT name FROM segments", "one stream"),
    ],
)
def test_what_a_snapshot_cannot_honour_is_refused(sql: str, says: str) -> None:
    _, cells, _ = setup(ROWS[:100])
    with pytest.raises(QueryError, match=says):
        cells.answer(sql)


def test_a_refused_clause_says_where_it_is() -> None:
    _, cells, _ = setup(ROWS[:100])
    with pytest.raises(ClauseError) as e:
        cells.answer("SELECT COUNT(*) FROM traffic [RANGE 1 HOUR]\nEMIT EVERY 1 MINUTE")
    assert e.value.to_dict()["line"] == 2


def test_reading_too_many_readings_one_by_one_is_refused_by_the_limits() -> None:
    _, cells, _ = setup(ROWS, limits=Limits(max_snapshot_readings=1000))
    cells.answer("SELECT AVG(speed) AS a FROM traffic")  # from cells: any number of readings
    with pytest.raises(LimitExceeded, match="max_snapshot_readings"):
        cells.answer("SELECT AVG(speed * 2) AS a FROM traffic")


def test_an_empty_history_answers_nothing_and_a_stream_without_one_is_an_error() -> None:
    engine, cells, _ = setup([])
    r = cells.answer("SELECT COUNT(*) AS n FROM traffic [RANGE 1 HOUR]")
    assert r.rows == [] and r.complete
    with pytest.raises(ClauseError, match="keeps no history"):
        Snapshots(engine, {}).answer("SELECT COUNT(*) AS n FROM traffic")


class ListSource:
    """A historical source holding every reading the stream took (as the archive does)."""

    def __init__(self) -> None:
        self.rows: list[tuple] = []
        self.asked: list[tuple[float, float, float]] = []

    def readings(self, stream, start, end, before, fields) -> Historical:
        self.asked.append((start, end, before))
        mine = [r for r in self.rows if start <= r[0] < min(end, before)]
        return Historical(len(mine), lambda: list(mine), True)


def evicting(rows: list[tuple], keep_s: float, *, limits: Limits | None = None):
    """Snapshots over a history keeping `keep_s` (fed in batches: it evicts as it goes), with
    a ListSource as the historical part, cells and readings."""
    engine, _, _ = setup([], limits=limits)
    h = History("traffic", SCHEMA, static=("station", "latitude", "segment"), keep_s=keep_s)
    src = ListSource()
    router = engine.fjord.streams["traffic"].router
    router.add("__small__", [], None, h.add_many, late=h.add)
    router.add("__source__", [], None, src.rows.extend, late=src.rows.append)
    for i in range(0, len(rows), 200):
        engine.fjord.streams["traffic"].queue.put_many(rows[i : i + 200])
        engine.fjord.run_until_idle()
    return (
        h,
        src,
        Snapshots(engine, {"traffic": h}, historical=src),
        Snapshots(engine, {"traffic": h}, historical=src, cells=False),
    )


@pytest.mark.parametrize("sql", QUERIES)
def test_history_and_historical_source_merge_at_complete_from_exactly(sql: str) -> None:
    _, _, reference = setup(ROWS)  # a history holding everything
    h, _, cells, readings = evicting(ROWS, keep_s=1200.0)
    assert h.complete_from > min(r[0] for r in ROWS)
    want = reference.answer(sql)
    for snap in (cells, readings):
        got = snap.answer(sql)
        assert got.complete
        assert (got.start, got.end, got.columns) == (want.start, want.end, want.columns)
        assert len(got.rows) == len(want.rows) > 0
        for x, y in zip(got.rows, want.rows, strict=True):
            for u, v in zip(x, y, strict=True):
                assert u == v or (isinstance(u, float) and math.isclose(u, v, rel_tol=1e-12))
        assert sum(got.sources.values()) == want.sources["memory"] or got.path == "cells"


def test_a_reading_exactly_at_complete_from_is_counted_once() -> None:
    h, src, cells, readings = evicting(ROWS, keep_s=1200.0)
    b = h.complete_from
    assert b == math.floor(b)  # a bucket edge: evicted bucket by bucket
    assert h.count(b, b + 1) > 0 and any(r[0] == b for r in ROWS)  # readings on B, held
    # Late readings on B and just before it: the history refuses them (older than keep_s),
    # which moves B just past the one on it; the source has them.
    extra = [(b, "st0", 10.0, 34.0, "S0"), (math.nextafter(b, -math.inf), "st1", 20.0, 34.1, "S1")]
    engine = cells.engine
    engine.fjord.streams["traffic"].queue.put_many(extra)
    engine.fjord.run_until_idle()
    assert src.rows[-2:] == extra
    b = h.complete_from
    assert b == math.nextafter(extra[0][0], math.inf)
    lo, hi = math.floor(b) - 60, math.floor(b) + 60
    sql = f"SELECT COUNT(*) AS n, SUM(speed) AS s FROM traffic WHERE time >= {lo} AND time < {hi}"
    every = [r for r in ROWS + extra if lo <= r[0] < hi]
    for snap in (cells, readings):
        got = snap.answer(sql)
        assert got.rows == [(len(every), pytest.approx(sum(r[2] or 0 for r in every)))]
        assert got.sources["archive"] == len([r for r in every if r[0] < b])
        assert got.sources["memory"] == len(every) - got.sources["archive"]
    assert src.asked[-1] == (lo, hi, b)


def test_the_readings_limit_counts_the_historical_part_too() -> None:
    limits = Limits(max_snapshot_readings=500)
    _, _, cells, readings = evicting(ROWS, keep_s=1200.0, limits=limits)
    sql = "SELECT segment, SUM(speed) AS s FROM traffic GROUP BY segment"
    for snap in (cells, readings):
        with pytest.raises(LimitExceeded, match="max_snapshot_readings"):
            snap.answer(sql)
