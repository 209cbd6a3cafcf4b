"""Generated queries (from the dialect's pieces: the traffic stream's columns, literals of every
kind, operators, aggregates, windows) are planned and run over a short stream: only the project's
own errors (FjordsError) may come out, and nothing fails at run time but a run-time limit."""

from __future__ import annotations

import math
import os

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fjords.engine import Engine
from fjords.errors import FjordsError
from fjords.runtime.fjord import Fjord
from fjords.schema import Field, Schema

SCHEMA = Schema(
    [
        Field("time", "float"),
        Field("station", "str"),
        Field("speed", "float"),
        Field("latitude", "float"),
        Field("longitude", "float"),
        Field("segment", "str"),
    ],
    time="time",
)
COLUMNS = list(SCHEMA.names)
UNITS = ["MILLISECONDS", "SECONDS", "MINUTES", "HOURS", "DAYS", "WEEKS"]
ROWS = [
    (
        1_000_000.0 + 20 * k + j,
        f"st{j}",
        None if k % 7 == 0 else 10.0 + k % 50,
        34.0,
        -118.0,
        f"S{j % 3}",
    )
    for k in range(40)
    for j in range(4)
]

numbers = st.one_of(
    st.integers(-(10**6), 10**6).map(str),
    st.integers(0, 10**30).map(str),
    st.floats(0, 1e300, allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["0", "0.0", "1e308", "1e-308", ".5", "7."]),
)
strings = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8).map(
    lambda s: "'" + s.replace("'", "''") + "'"
)
literals = st.one_of(
    numbers,
    strings,
    st.sampled_from(["TRUE", "FALSE", "NULL", "NOW"]),
    st.tuples(numbers, st.sampled_from(UNITS)).map(" ".join),
)
columns = st.sampled_from(COLUMNS + ["window_start", "window_end"])
leaves = st.one_of(columns, literals)


def _extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.tuples(inner, st.sampled_from(["+", "-", "*", "/"]), inner).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        ),
        inner.map(lambda e: f"- {e}"),
        st.tuples(inner, st.sampled_from(["=", "!=", "<", "<=", ">", ">=", "<>"]), inner).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        ),
        st.tuples(inner, st.lists(inner, min_size=1, max_size=4), st.booleans()).map(
            lambda t: f"({t[0]} {'NOT ' if t[2] else ''}IN ({', '.join(t[1])}))"
        ),
        st.tuples(inner, inner, inner).map(lambda t: f"({t[0]} BETWEEN {t[1]} AND {t[2]})"),
        st.tuples(inner, st.booleans()).map(lambda t: f"({t[0]} IS {'NOT ' if t[1] else ''}NULL)"),
        st.tuples(inner, st.sampled_from(["AND", "OR"]), inner).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        ),
        inner.map(lambda e: f"(NOT {e})"),
    )


# Mostly well-typed pieces too, so that many queries plan and really run.
numeric = st.recursive(
    st.one_of(st.sampled_from(["speed", "latitude", "time", "window_end"]), numbers),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["+", "-", "*", "/"]), inner).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        ),
        inner.map(lambda e: f"- {e}"),
    ),
    max_leaves=5,
)
conditions = st.one_of(
    st.tuples(numeric, st.sampled_from(["=", "<", ">=", "<>"]), numeric).map(" ".join),
    st.lists(strings, min_size=1, max_size=3).map(lambda v: f"segment IN ({', '.join(v)})"),
    st.tuples(numeric, numeric).map(lambda t: f"speed BETWEEN {t[0]} AND {t[1]}"),
    st.sampled_from(["station > 'st1'", "speed IS NULL", "NOT (segment = 'S1')"]),
)
exprs = st.one_of(st.recursive(leaves, _extend, max_leaves=6), numeric, conditions)
aggregates = st.one_of(
    st.just("COUNT(*)"),
    st.tuples(st.sampled_from(["COUNT", "SUM", "AVG", "MIN", "MAX"]), exprs).map(
        lambda t: f"{t[0]}({t[1]})"
    ),
)
agg_exprs = st.one_of(
    aggregates,
    st.tuples(aggregates, st.sampled_from(["+", "-", "*", "/", ">", "="]), exprs).map(
        lambda t: f"{t[0]} {t[1]} {t[2]}"
    ),
)
durations = st.tuples(
    st.sampled_from(["1", "5", "0.5", "1e308", "0.0001", "90", "0"]), st.sampled_from(UNITS)
).map(" ".join)
windows = st.one_of(
    st.just(""),
    durations.map(lambda d: f"[RANGE {d}]"),
    st.tuples(durations, durations).map(lambda t: f"[RANGE {t[0]} SLIDE {t[1]}]"),
    st.tuples(st.integers(0, 10**12), st.integers(0, 10**12)).map(
        lambda t: f"[ROWS {t[0]} SLIDE {t[1]}]"
    ),
    st.integers(0, 200).map(lambda n: f"[ROWS {n}]"),
)


@st.composite
def queries(draw: st.DrawFn) -> str:
    window = draw(windows)
    if draw(st.booleans()):  # aggregate shape
        group = draw(st.one_of(st.just(""), columns.map(lambda c: f" GROUP BY {c}")))
        items = draw(st.lists(agg_exprs, min_size=1, max_size=3))
        if group:
            items.insert(0, group.split()[-1])
        having = draw(st.one_of(st.just(""), agg_exprs.map(lambda e: f" HAVING {e}")))
    else:
        group = having = ""
        items = draw(st.lists(st.one_of(st.just("*"), exprs), min_size=1, max_size=3))
    select = ", ".join(f"{e} AS c{i}" if e != "*" else e for i, e in enumerate(items))
    where = draw(st.one_of(st.just(""), exprs.map(lambda e: f" WHERE {e}")))
    return f"SELECT {select} FROM traffic {window}{where}{group}{having}"


@settings(
    max_examples=int(os.environ.get("FJORDS_HYPOTHESIS_EXAMPLES", "400")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(queries())
def test_generated_queries_raise_only_the_projects_errors(sql: str) -> None:
    f = Engine(Fjord())
    f.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    try:
        f.add_query(sql, query_id="q")
    except FjordsError as e:
        event(f"refused: {type(e).__name__}")
        return
    event("planned")
    f.fjord.push_many("traffic", ROWS)
    f.fjord.run_until_idle()
    f.fjord.end_of_stream()
    f.fjord.run_until_idle()
    if "q" in f.fjord.failed:
        reason = f.fjord.failed["q"].error or ""
        # Only a run-time limit may stop a query that planned: kinds, sizes of numbers and the
        # plan-time limits must have been refused when planned.
        assert "LimitExceeded" in reason, (sql, reason)
        event("failed at run time")
    assert not math.isnan(f.fjord.stats()["scheduler"]["busy_seconds"])
