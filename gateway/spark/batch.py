"""Batch: the same compiled query over an archive or a trace file (history, replays)."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from gateway.spark.compiler import SparkQuery, compile_query
from gateway.spark.session import SparkConfig, get_session
from gateway.spark.sources import StaticTable, archive_schema, read_archive, read_trace

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def run_batch(
    spark: SparkSession,
    query: SparkQuery,
    stream: DataFrame,
    tables: Mapping[str, StaticTable] | None = None,
    *,
    right: DataFrame | None = None,
) -> DataFrame:
    """The query's full result over a batch DataFrame of its stream (and, for a join of two
    different streams, `right`, the second stream's)."""
    table_df = None
    if query.table is not None:
        if not tables or query.table not in tables:
            raise KeyError(f"query joins table {query.table!r}, which was not given")
        table_df = tables[query.table].dataframe(spark)
    return query.finish(query.stream_stage(stream, right=right), table_df)


def result_rows(df: DataFrame) -> list[dict[str, Any]]:
    """Collected rows as dicts in a stable order (windows by end, then the columns' values)."""
    rows = [r.asDict() for r in df.collect()]
    return sort_rows(rows)


def sort_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    def key(r: dict[str, Any]) -> tuple:
        # None sorts first; numbers and text never compare with each other (tagged).
        def tag(v: Any) -> tuple:
            if v is None:
                return (0, 0)
            if isinstance(v, (int, float)):
                return (1, v if not (isinstance(v, float) and math.isnan(v)) else -math.inf)
            return (2, str(v))

        return (tag(r.get("window_end")), tag(r.get("window_start")), *[tag(v) for v in r.values()])

    return sorted(rows, key=key)


def replay(
    readings: str | os.PathLike[str],
    queries: Sequence[str],
    *,
    stations: str | os.PathLike[str] | None = None,
    stream: str = "traffic",
    tables: Sequence[tuple[str, str]] = (),
    out: TextIO | None = None,
    config: SparkConfig | None = None,
) -> int:
    """Run a trace's queries on Spark and print NDJSON rows like `python -m fjords` (the rows
    of each query in window order; the Fjord interleaves queries as windows close)."""
    out = out or sys.stdout
    spark = get_session(config)
    df, schema = read_trace(spark, readings, stations)
    statics = {name: StaticTable(name, path) for name, path in tables}
    schemas = {name: t.schema for name, t in statics.items()}
    n = 0
    compiled = [compile_query(sql, {stream: schema}, schemas) for sql in queries]
    for i, q in enumerate(compiled):
        for row in result_rows(run_batch(spark, q, df, statics)):
            out.write(json.dumps({"query": i, **row}) + "\n")
            n += 1
    return n


def run_archive(
    spark: SparkSession,
    sql: str,
    archive: str | os.PathLike[str],
    *,
    stream: str = "traffic",
    tables: Mapping[str, StaticTable] | None = None,
) -> tuple[SparkQuery, DataFrame]:
    """A query over a whole archive directory as a batch job."""
    schema = archive_schema(spark, str(archive))
    tables = dict(tables or {})
    q = compile_query(sql, {stream: schema}, {n: t.schema for n, t in tables.items()})
    return q, run_batch(spark, q, read_archive(spark, str(archive), schema), tables)
