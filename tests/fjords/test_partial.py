"""Pre-aggregated readings (fjords.partial.Partial) give the same aggregates as the raw readings."""

from __future__ import annotations

import json
import math
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjords.engine import Engine
from fjords.partial import Partial
from fjords.runtime.fjord import Fjord
from fjords.schema import Field, Schema

SCHEMA = Schema(
    [Field("time", "float"), Field("station", "str"), Field("speed", "float")], time="time"
)
QUERIES = {
    "all": "SELECT station, COUNT(*) AS n, COUNT(speed) AS nv, SUM(speed) AS s, AVG(speed) AS a, "
    "MIN(speed) AS lo, MAX(speed) AS hi FROM traffic [RANGE 15 MINUTES] GROUP BY station",
    "sliding": "SELECT AVG(speed) AS a, MAX(speed) AS hi FROM traffic [RANGE 15 MINUTES SLIDE 5 MINUTES]",
    "count_star": "SELECT station, COUNT(*) AS n FROM traffic [RANGE 10 MINUTES] GROUP BY station",
    "two_args": "SELECT COUNT(*) AS n, AVG(speed) AS a, MIN(time) AS t FROM traffic [RANGE 5 MINUTES]",
}


def run(rows: list[tuple], queries: dict[str, str]) -> dict[str, list[tuple]]:
    fjord = Engine(Fjord())
    fjord.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    out: dict[str, list[tuple]] = {}
    for qid, sql in queries.items():
        rq = fjord.add_query(sql, query_id=qid)
        out[qid] = []
        rq.sink.add_callback(out[qid].append)
    for t in rows:
        fjord.fjord.push("traffic", t)
    fjord.fjord.end_of_stream()
    fjord.fjord.run_until_idle()
    return out


# Readings per station: (minute offset, speed); speeds are multiples of 1/8, so float sums are
# exact in any order and "equal" means bit-for-bit equal.
readings = st.dictionaries(
    st.sampled_from(["a", "b", "c"]),
    st.lists(
        st.tuples(st.integers(0, 59), st.integers(0, 800).map(lambda k: k / 8)),
        min_size=1,
        max_size=30,
    ),
    min_size=1,
)


def raw_and_partials(data: dict[str, list[tuple[int, float]]], w_min: int = 5):
    raw, partial = [], []
    t0 = 1_330_588_800.0
    for station, series in sorted(data.items()):
        series = sorted(series)
        windows: dict[int, list[float]] = {}
        for minute, v in series:
            raw.append((t0 + 60 * minute, station, v))
            windows.setdefault(minute // w_min, []).append(v)
        for k, vs in sorted(windows.items()):
            partial.append((t0 + 60 * w_min * k, station, Partial.of(vs)))
    return raw, partial


@settings(max_examples=40, deadline=None)
@given(readings)
def test_aggregates_over_partials_equal_raw(data: dict[str, list[tuple[int, float]]]) -> None:
    raw, partial = raw_and_partials(data)
    queries = {k: v for k, v in QUERIES.items() if k != "two_args"}
    assert run(partial, queries) == run(raw, queries)


def test_count_only_partials_feed_count_star() -> None:
    t0 = 1_330_588_800.0
    raw = [(t0 + s, "a", None) for s in (1, 5, 70, 400, 401)]
    part = [(t0, "a", Partial(3)), (t0 + 300, "a", Partial(2))]
    q = {"n": "SELECT station, COUNT(*) AS n FROM traffic [RANGE 10 MINUTES] GROUP BY station"}
    assert run(part, q) == run(raw, q)
    # An argument that is a counts-only partial counts rows but contributes no values.
    q2 = {
        "x": "SELECT COUNT(*) AS n, COUNT(speed) AS nv, AVG(speed) AS a FROM traffic [RANGE 10 MINUTES]"
    }
    assert [r[:3] for r in run(part, q2)["x"]] == [(5, 0, None)]


def test_mixed_raw_and_partial_in_one_window() -> None:
    """The switch from raw to aggregate happens mid-stream: both kinds share windows."""
    t0 = 1_330_588_800.0
    raw = [(t0 + 60 * m, "a", float(m)) for m in range(15)]
    mixed = raw[:5] + [
        (t0 + 300, "a", Partial.of([5.0, 6, 7, 8, 9])),
        (t0 + 600, "a", Partial.of([10.0, 11, 12, 13, 14])),
    ]
    assert run(mixed, QUERIES) == run(raw, QUERIES)


def test_partial_value_type() -> None:
    p = Partial.of([1.0, 2.0, 6.0])
    assert (p.count, p.sum, p.min, p.max) == (3, 9.0, 1.0, 6.0)
    assert p == 3.0 and p < 4 and p.__class__ is Partial  # it reads as its mean
    assert json.loads(json.dumps({"v": p})) == {"v": 3.0}
    assert pickle.loads(pickle.dumps(p)).max == 6.0
    with pytest.raises(AttributeError):
        p.count = 4  # type: ignore[misc]
    assert p.merge(Partial.of([0.5])) == Partial.of([1.0, 2.0, 6.0, 0.5])
    assert p.merge(Partial(0)) is p
    c = Partial(4)
    assert c.counts_only and math.isnan(c) and c.merge(Partial(1)).count == 5
    with pytest.raises(ValueError, match="counts-only"):
        c.merge(p)
    with pytest.raises(ValueError, match="together"):
        Partial(2, 3.0)
    with pytest.raises(ValueError, match="count"):
        Partial(-1)
