"""Windowed EMIT CHANGES EVERY d on Spark batch (`fjords-gateway replay --engine spark`): each
reading counted at the instants window_start + k*d after it, the Fjord's early rows and final
row exactly; what Spark cannot do (streaming, unwindowed, every n rows) refused with why."""

from __future__ import annotations

from itertools import pairwise

import pytest

from fjords.schema import Schema
from gateway.spark.compiler import SparkUnsupportedError, compile_query
from tests.fjords.test_differential import Data, assert_same_rows
from tests.gateway.test_spark_drilldown import _replay, fjord_rows
from tests.gateway.test_spark_drilldown import data as data  # the module's fixture

HOURLY = (
    "SELECT segment, COUNT(*) AS n, AVG(speed) AS a, MIN(speed) AS lo FROM traffic "
    "[RANGE 1 HOUR] GROUP BY segment EMIT CHANGES EVERY 10 MINUTES"
)
SLIDING = (
    "SELECT station, SUM(speed) AS s, COUNT(*) AS n FROM traffic [RANGE 1 HOUR SLIDE 30 MINUTES] "
    "WHERE segment = 'S02' GROUP BY station HAVING COUNT(*) > 3 EMIT CHANGES EVERY 15 MINUTES"
)
TRAFFIC = Schema(
    [("time", "float"), ("station", "str"), ("speed", "float"), ("segment", "str")], time="time"
)


@pytest.mark.parametrize(
    ("sql", "words"),
    [
        (HOURLY, "update mode outputs per trigger"),  # a stream: not a batch job
        (
            "SELECT segment, AVG(speed) FROM traffic GROUP BY segment EMIT CHANGES EVERY 1 DAY",
            "without a window",
        ),
        (HOURLY.replace("EVERY 10 MINUTES", "EVERY 6 ROWS"), "arrival order"),
        (HOURLY.replace(" EVERY 10 MINUTES", ""), "arrival order"),
    ],
)
def test_what_spark_cannot_do_is_refused_with_the_reason(sql: str, words: str) -> None:
    with pytest.raises(SparkUnsupportedError, match=words) as e:
        compile_query(sql, {"traffic": TRAFFIC})
    assert (e.value.line, e.value.column) == (1, sql.index("EMIT") + 1)  # type: ignore[attr-defined]


def test_a_batch_job_compiles_with_the_fjords_columns() -> None:
    q = compile_query(HOURLY, {"traffic": TRAFFIC}, batch=True)
    assert q.columns == ("segment", "n", "a", "lo", "window_start", "window_end", "final", "as_of")


@pytest.mark.needs_spark
def test_replay_on_spark_gives_the_fjords_early_rows(
    spark, data: Data, capsys: pytest.CaptureFixture[str]
) -> None:
    hourly, sliding = _replay(data, [HOURLY, SLIDING], capsys)
    for sql, rows in ((HOURLY, hourly), (SLIDING, sliding)):
        assert_same_rows(rows, fjord_rows(data, sql), sql)
    # five early rows per hour and segment, then the final one, the counts building up
    per = {}
    for r in hourly:
        per.setdefault((r["segment"], r["window_start"]), []).append(r)
    for rows in per.values():
        rows.sort(key=lambda r: r["as_of"])
        assert [r["final"] for r in rows] == [False] * 5 + [True]
        assert [r["as_of"] - rows[0]["window_start"] for r in rows] == [
            600.0 * k for k in range(1, 7)
        ]
        assert all(a["n"] < b["n"] for a, b in pairwise(rows))
