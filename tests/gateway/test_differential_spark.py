"""The Spark half of the differential test (tests/fjords/test_differential.py): the same corpus
on Spark batch over the same METR-LA subsample, against the same oracle. Queries Spark refuses
(ROWS windows, the sensor and scheduler clauses) must be refused with a SparkUnsupportedError."""

from __future__ import annotations

import pytest

from gateway.spark.batch import result_rows, run_batch
from gateway.spark.compiler import SparkUnsupportedError, compile_query
from gateway.spark.sources import StaticTable, read_trace
from tests.fjords.test_differential import (
    CORPUS,
    Case,
    Data,
    assert_order,
    assert_same_rows,
    build_data,
)

pytestmark = pytest.mark.needs_spark


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Data:
    return build_data(tmp_path_factory.mktemp("metr-la-sample"))


@pytest.fixture(scope="module")
def trace(spark, data: Data):
    """The subsample as Spark reads a trace (typed like the Fjord reads it), cached once."""
    df, schema = read_trace(spark, data.readings, data.stations)
    df = df.cache()
    df.count()
    tables = {name: StaticTable(name, path) for name, path in data.tables}
    yield df, schema, tables
    df.unpersist()


def spark_rows(spark, trace, sql: str) -> list[dict]:
    df, schema, tables = trace
    q = compile_query(sql, {"traffic": schema}, {n: t.schema for n, t in tables.items()})
    return result_rows(run_batch(spark, q, df, tables), q)


@pytest.mark.parametrize("case", [c.param() for c in CORPUS])
def test_spark_matches_the_oracle(spark, trace, data: Data, case: Case) -> None:
    if not case.spark:
        with pytest.raises(SparkUnsupportedError):
            spark_rows(spark, trace, case.sql)
        return
    got = spark_rows(spark, trace, case.sql)
    assert_same_rows(got, case.oracle(data), f"{case.id} on Spark")
    # ORDER BY's order within each window (Spark's union rows come in no particular order)
    assert_order(got, case, f"{case.id} on Spark", time_order=False)
