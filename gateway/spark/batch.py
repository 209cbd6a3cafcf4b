"""Batch: the same compiled query over an archive or a trace file (history, replays)."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from fjords.schema import Schema
from fjords.trace import Trace
from gateway.spark.compiler import compile_query
from gateway.spark.errors import SparkUnsupportedError
from gateway.spark.query_plan import SparkQuery
from gateway.spark.session import SparkConfig, get_session
from gateway.spark.sources import (
    Refusals,
    StaticTable,
    declared_stream_schema,
    fleet_sources,
    read_archive,
    read_trace,
    roots_of,
)
from gateway.spark.union_plan import SparkUnion

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
    if isinstance(query, SparkUnion):  # each branch with its own table, over the one stream

        def table(name: str) -> DataFrame:
            if not tables or name not in tables:
                raise KeyError(f"query joins table {name!r}, which was not given")
            return tables[name].dataframe(spark)

        if len({b.stream for b in query.branches}) > 1:
            raise SparkUnsupportedError(
                "this UNION ALL reads several streams, and a Spark batch job reads one: run it "
                "on the Fjord (the default engine)"
            )
        return query.run({query.stream: stream}, table)
    table_df = None
    if query.table is not None:
        if not tables or query.table not in tables:
            raise KeyError(f"query joins table {query.table!r}, which was not given")
        table_df = tables[query.table].dataframe(spark)
    return query.finish(query.stream_stage(stream, right=right), table_df)


def result_rows(
    df: DataFrame, query: SparkQuery | SparkUnion | None = None
) -> list[dict[str, Any]]:
    """Collected rows as dicts in a stable order: windows by end; within a window, a query
    with ORDER BY (`query`) keeps its order (the DataFrame is sorted by window, then its ORDER
    BY keys), any other by the columns' values."""
    rows = [r.asDict() for r in df.collect()]
    bound = getattr(query, "bound", None)
    return sort_rows(rows, keep_window_order=bool(getattr(bound, "order", ())))


def _tag(v: Any) -> tuple:
    # None sorts first; numbers and text never compare with each other (tagged).
    if v is None:
        return (0, 0)
    if isinstance(v, (int, float)):
        return (1, v if not (isinstance(v, float) and math.isnan(v)) else -math.inf)
    return (2, str(v))


def sort_rows(
    rows: Iterable[dict[str, Any]], *, keep_window_order: bool = False
) -> list[dict[str, Any]]:
    """Rows by window (end, then start); then by their values, unless `keep_window_order`
    (a stable sort by window only: ORDER BY's order within each window stays)."""
    if keep_window_order:
        return sorted(rows, key=lambda r: (_tag(r.get("window_end")), _tag(r.get("window_start"))))

    def key(r: dict[str, Any]) -> tuple:
        return (
            _tag(r.get("window_end")),
            _tag(r.get("window_start")),
            *[_tag(v) for v in r.values()],
        )

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
    # the stations' attributes, for the Fjord's hierarchy checks (DRILLDOWN)
    known = Trace(readings, stations) if stations is not None else None
    sensors = {stream: (known.sensor_field, known.attributes)} if known is not None else None
    compiled = [
        compile_query(sql, {stream: schema}, schemas, sensors=sensors, batch=True)
        for sql in queries
    ]
    for i, q in enumerate(compiled):
        for row in result_rows(run_batch(spark, q, df, statics), q):
            out.write(json.dumps({"query": i, **row}) + "\n")
            n += 1
    return n


def run_archive(
    spark: SparkSession,
    sql: str,
    archive: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    stream: str = "traffic",
    tables: Mapping[str, StaticTable] | None = None,
    gateways: Sequence[str] | None = None,
    declared: Schema | None = None,
    refusals: Refusals | None = None,
) -> tuple[SparkQuery, DataFrame]:
    """A query over a fleet's archive (one root or several; every gateway, or `gateways`) as
    a batch job, each segment judged by its footer against the stream's declared schema
    (`declared`, or the built-in or newest segment's): refused ones go to `refusals`."""
    roots = roots_of(archive)
    schema = declared_stream_schema(roots, stream, declared)
    sources = fleet_sources(roots, stream, gateways)
    tables = dict(tables or {})
    q = compile_query(sql, {stream: schema}, {n: t.schema for n, t in tables.items()})
    df = read_archive(
        spark, sources, schema, refusals if refusals is not None else Refusals(stream)
    )
    return q, run_batch(spark, q, df, tables)
