"""A stream's transient segment (fjords.runtime.history): what it keeps, what it evicts and
counts, and that its cells and readings agree with a brute-force computation."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from fjords.partial import Partial
from fjords.runtime.history import History
from fjords.schema import Field, Schema

SCHEMA = Schema(
    [
        Field("time", "float"),
        Field("station", "str"),
        Field("speed", "float"),
        Field("latitude", "float"),
        Field("segment", "str"),
        Field("cars", "int"),
    ],
    time="time",
)
STATIC = ("station", "latitude", "segment")


def readings(n: int, *, seed: int = 1, span: float = 3600.0, stations: int = 12) -> list[tuple]:
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        s = rnd.randrange(stations)
        speed = None if rnd.random() < 0.05 else round(rnd.uniform(0, 80), 3)
        out.append((rnd.uniform(0, span), f"st{s}", speed, 34.0 + s, f"S{s % 3}", rnd.randrange(9)))
    return out


def history(**kw) -> History:
    return History("traffic", SCHEMA, static=STATIC, **kw)


def test_readings_come_back_as_they_went_in_in_time_order() -> None:
    rows = readings(5000)
    h = history(bucket_s=60.0)
    for i in range(0, len(rows), 333):  # any order, in batches
        h.add_many(rows[i : i + 333])
    assert h.tuples(-math.inf, math.inf) == sorted(rows, key=lambda r: r[0])
    assert h.tuples(100.0, 1000.0) == sorted(
        (r for r in rows if 100.0 <= r[0] < 1000.0), key=lambda r: r[0]
    )
    assert h.stats()["rows"] == 5000
    assert h.stats()["keys"] == 12


@pytest.mark.parametrize("bucket_s", [7.0, 60.0, 900.0])
def test_cells_over_any_range_equal_brute_force(bucket_s: float) -> None:
    rows = readings(20_000, seed=2)
    h = history(bucket_s=bucket_s)
    h.add_many(rows)
    h.add_many(readings(500, seed=3))  # a tail of late arrivals over compacted buckets
    rows += readings(500, seed=3)
    rnd = random.Random(4)
    m = h.measure_names.index("speed")
    for _ in range(30):
        t0 = rnd.uniform(-10, 3600)
        t1 = t0 + rnd.uniform(0, 2000)
        cells = h.cells(t0, t1)
        for k, key in enumerate(h.keys):
            mine = [r for r in rows if t0 <= r[0] < t1 and (r[1], r[3], r[4]) == key]
            vals = [r[2] for r in mine if r[2] is not None]
            assert cells.rows[k] == len(mine)
            assert cells.count[m, k] == len(vals)
            assert math.isclose(cells.sum[m, k], sum(vals), rel_tol=1e-12, abs_tol=1e-9)
            if vals:
                assert (cells.min[m, k], cells.max[m, k]) == (min(vals), max(vals))
            else:
                assert np.isnan(cells.min[m, k])


def test_what_ages_out_of_keep_s_goes_and_completeness_says_from_when() -> None:
    h = history(keep_s=600.0, bucket_s=60.0)
    for start in range(0, 2000, 100):  # as a stream hands them over, a batch at a time
        h.add_many([(float(t), "a", 1.0, 1.0, "S", 1) for t in range(start, start + 100, 10)])
    st = h.stats()
    assert st["oldest"] >= 2000 - 10 - 600 - 60
    assert st["evicted"] > 0 and st["evicted_early"] == 0
    assert h.complete_from <= st["oldest"]
    assert h.tuples(h.complete_from, math.inf) == [
        (float(t), "a", 1.0, 1.0, "S", 1) for t in range(0, 2000, 10) if t >= h.complete_from
    ]
    h.add_many([(5.0, "a", 1.0, 1.0, "S", 1)])  # far behind what is kept: refused, counted
    assert h.stats()["too_old"] == 1


def test_max_rows_evicts_the_oldest_early_counted_and_logged_once(caplog) -> None:
    h = history(max_rows=1000, bucket_s=10.0)
    for t in range(0, 3000, 100):
        h.add_many([(t + i / 10, "a", 1.0, 1.0, "S", 1) for i in range(100)])
    st = h.stats()
    assert st["rows"] <= 1000
    assert st["evicted_early"] == 3000 - st["rows"]
    assert sum("max_rows" in r.message for r in caplog.records) == 1
    assert h.complete_from > 0


def test_missing_values_nulls_and_integers_keep_their_kind() -> None:
    h = history()
    h.add_many([(1.0, "a", None, 1.0, "S", 3), (2.0, "a", 5.5, 1.0, "S", 4)])
    assert h.tuples(0, 10) == [(1.0, "a", None, 1.0, "S", 3), (2.0, "a", 5.5, 1.0, "S", 4)]
    assert [type(r[5]) for r in h.tuples(0, 10)] == [int, int]


def test_a_motes_pre_aggregated_window_is_not_a_reading(caplog) -> None:
    h = history()
    h.add_many([(1.0, "a", Partial(3, 6.0, 1.0, 3.0), 1.0, "S", 1), (2.0, "a", 2.0, 1.0, "S", 1)])
    assert h.stats()["aggregated"] == 1
    assert h.tuples(0, 10) == [(2.0, "a", 2.0, 1.0, "S", 1)]
    assert h.complete_from > 1.0  # a snapshot from before it is not complete
    assert any("pre-aggregated" in r.message for r in caplog.records)


def test_memory_per_reading_of_a_dense_stream() -> None:
    """1 Hz readings of 100 sensors: time, key and two measures (speed, cars) per reading."""
    h = history(bucket_s=60.0)
    h.add_many(
        [(t + s / 1000, f"st{s}", 50.0, 34.0, "S", 1) for t in range(1200) for s in range(100)]
    )
    per = h.nbytes() / h.stats()["rows"]
    assert per <= 8 + 4 + 8 + 8 + 4  # the columns, and cells that add a few bytes a reading


def test_a_stream_whose_columns_are_neither_numeric_nor_static_is_refused() -> None:
    schema = Schema([Field("time", "float"), Field("v", "str")], time="time")
    History("plain", schema)  # text is static by default
    with pytest.raises(ValueError, match="numeric or static"):
        History("plain", schema, static=())
