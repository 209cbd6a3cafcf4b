"""Compile a query of the project's SQL dialect into Spark DataFrame operations.

The same text the Fjord runs is analysed once by `fjords.compile.analysis` (so names, errors and
result columns are the Fjord's), checked for what Spark cannot run (`SparkUnsupportedError`),
then translated in two stages that mirror the Fjord's plan for Query 2 (windowed aggregate ->
static-table join -> regroup):

  stage A  `stream_stage(df)`: filters on the stream, `window()` aligned to multiples of the
           SLIDE since the epoch, and the windowed partial aggregate keyed by every stream column
           needed later. Streaming-safe: the only stateful operator, with an optional watermark.
  stage B  `finish(partials, table)`: the equi-join with the static table, conditions on NOW
           (the window end), the regroup by GROUP BY, HAVING and the SELECT list. Stateless, so a
           streaming job runs it per micro-batch (`foreachBatch`), where the table can be reloaded
           when its file changes and every window of a batch is complete (append mode).

A stream-stream join runs in stage A: each side filtered, an equi-join on the keys and the
tumbling `window()` both tuples fall in (in a streaming job each side has the watermark and the
window equality is the join's time constraint, so Spark drops old state), then the SELECT list
or the windowed partial aggregate over the joined rows.

Partial states are (count, sum, min, max) per aggregate, like the Fjord's panes, so the regroup is
exact. Compilation needs no Spark session; DataFrame columns are only built inside the stages.

Where each part lives: this module compiles and checks; the stages of one query are
gateway/spark/query_plan.py (`SparkQuery`), a UNION ALL's gateway/spark/union_plan.py
(`SparkUnion`), expressions gateway/spark/expressions.py, types gateway/spark/schemas.py.
Their public names are importable from here too (`__all__`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fjords.catalog import Catalog, Hierarchy, StreamInfo
from fjords.compile.analysis import BoundQuery, analyze, analyze_union
from fjords.compile.sql import ast
from fjords.compile.sql.parser import parse
from fjords.schema import Schema
from fjords.tables import Table
from gateway.spark.errors import SparkUnsupportedError
from gateway.spark.query_plan import SparkQuery
from gateway.spark.schemas import fjord_schema, spark_schema, spark_type
from gateway.spark.union_plan import SparkUnion

# a stream's sensor column and each sensor's static attributes (fjords.trace.Trace.attributes)
Sensors = tuple[str | None, Mapping[object, dict[str, object]]]


def compile_query(
    sql: str | ast.Query | ast.Union,
    streams: Mapping[str, Schema],
    tables: Mapping[str, Schema | Table] | None = None,
    *,
    bound: BoundQuery | None = None,
    sensors: Mapping[str, Sensors] | None = None,
    hierarchies: Mapping[str, Sequence[Hierarchy]] | None = None,
    batch: bool = False,
) -> SparkQuery:
    """Analyse `sql` (fjords.compile.analysis, as the Fjord does), then check it for Spark.

    `streams` and `tables` give the schemas (Fjord types: int, float, str, bool) by name; a
    stream's schema must name its time column. Raises QueryError (SparkUnsupportedError for
    constructs Spark cannot run) with a message naming the problem. `bound` is the query
    already analysed (a union's branch). `sensors` gives a stream's sensor column and each
    sensor's static attributes (a stations file); those, tables given with their rows and
    `hierarchies` (by stream) tell DRILLDOWN's levels, so the hierarchy checks are the Fjord's.
    `batch`: the query runs as a batch job (windowed EMIT CHANGES EVERY d runs there only). A
    UNION ALL compiles to a `SparkUnion`.
    """
    query = parse(sql) if isinstance(sql, str) else sql
    if isinstance(query, ast.Union):
        return compile_union(  # type: ignore[return-value]
            query,
            streams,
            tables,
            sql=sql if isinstance(sql, str) else None,
            sensors=sensors,
            hierarchies=hierarchies,
        )
    tables = dict(tables or {})
    _refuse_rows_windows(query.sources)
    # The one analysis both engines share: the same names, checks and errors as the Fjord.
    if bound is None:
        bound = analyze(query, _catalog(streams, tables, sensors, hierarchies))
    # The sensor clauses steer how the gateway's sensors sample (the proxies' demand); a Spark
    # job reads what was already recorded, so it cannot honour them: refused, never ignored.
    for clause, value in (
        ("SAMPLE PERIOD", query.sample_period_s),
        ("SAMPLE EVERY", query.sample_every_rows),
        ("LIFETIME", query.lifetime_s),
    ):
        if value is not None:
            raise SparkUnsupportedError(
                f"{clause} sets how the gateway's sensors sample, and a Spark job reads data "
                f"already recorded: run the query on the Fjord (the default engine) or remove "
                f"{clause}",
                query.pos_of(clause),
            )
    if query.emit_every_rows is not None:
        raise SparkUnsupportedError(
            "EMIT EVERY n ROWS counts each partition's readings in arrival order, which a Spark "
            "job does not keep: run the query on the Fjord (the default engine)",
            query.pos_of("EMIT EVERY ROWS"),
        )
    if query.priority is not None:  # refused like the sensor clauses, never ignored
        raise SparkUnsupportedError(
            "PRIORITY sets a query's share of the Fjord's scheduler, and Spark schedules its own "
            "jobs: run the query on the Fjord (the default engine) or remove PRIORITY",
            query.pos_of("PRIORITY"),
        )
    _check_changes(query, bound, batch)
    if bound.time_column is None:
        raise SparkUnsupportedError(f"stream {bound.stream!r} has no time column")
    compiled = SparkQuery(sql=sql if isinstance(sql, str) else None, bound=bound)
    for secs in compiled.window or ():
        if abs(secs * 1e6 - round(secs * 1e6)) > 1e-3:
            raise SparkUnsupportedError(
                f"window durations must be whole microseconds on Spark, got {secs} s"
            )
    return compiled


def compile_union(
    union: ast.Union,
    streams: Mapping[str, Schema],
    tables: Mapping[str, Schema | Table] | None = None,
    *,
    sql: str | None = None,
    sensors: Mapping[str, Sensors] | None = None,
    hierarchies: Mapping[str, Sequence[Hierarchy]] | None = None,
) -> SparkUnion:
    """Analyse the union once (fjords.compile.analysis.analyze_union, as the Fjord does) and compile
    each bound branch with the checks of `compile_query`."""
    tables = dict(tables or {})
    _refuse_rows_windows(union.sources)  # before analysis, as compile_query does
    bu = analyze_union(union, _catalog(streams, tables, sensors, hierarchies))
    branches = [compile_query(b.query, streams, tables, bound=b) for b in bu.branches]
    return SparkUnion(sql=sql, bound=bu, branches=branches)


def _check_changes(query: ast.Query, bound: BoundQuery, batch: bool) -> None:
    """EMIT CHANGES on Spark: a windowed EVERY d in a batch job only, where each reading is
    counted at the instants after it (`SparkQuery.stream_stage`); everything else refused."""
    c = query.changes
    if c is None:
        return
    at = query.pos_of("EMIT CHANGES")
    if not bound.windowed or bound.window is None:
        raise SparkUnsupportedError(
            "EMIT CHANGES without a window (online aggregation since the query began) runs on "
            "the Fjord only: run the query on the Fjord (the default engine) or add a window",
            at,
        )
    if c.every_s is None:
        raise SparkUnsupportedError(
            "EMIT CHANGES every row or EVERY n ROWS runs on the Fjord only (the default "
            "engine): it counts readings in arrival order, which a Spark job does not keep; "
            "give EVERY d (event time) for a Spark batch job",
            at,
        )
    if not batch:
        raise SparkUnsupportedError(
            "EMIT CHANGES on a stream runs on the Fjord only (the default engine), or on Spark "
            "as a batch job (replay --engine spark): Structured Streaming's update mode "
            "outputs per trigger, not at the event-time instants window_start + k*d",
            at,
        )


def _refuse_rows_windows(sources: tuple[ast.TableRef, ...]) -> None:
    """ROWS windows are refused before analysis: row counts have no event-time order across
    Spark's partitions."""
    for ref in sources:
        if ref.window is not None and ref.window.rows is not None:
            raise SparkUnsupportedError(
                "ROWS windows are not supported on Spark (row counts have no event-time order "
                "across partitions); use a time window such as [RANGE 15 MINUTES]",
                ref.window.pos,
            )


def _catalog(
    streams: Mapping[str, Schema],
    tables: Mapping[str, Schema | Table],
    sensors: Mapping[str, Sensors] | None = None,
    hierarchies: Mapping[str, Sequence[Hierarchy]] | None = None,
) -> Catalog:
    catalog = Catalog()
    for name, schema in streams.items():
        field, attrs = (sensors or {}).get(name, (None, {}))
        # sensor ids as the stations file types them
        catalog.add_stream(StreamInfo(name, schema, field, dict(attrs)))  # type: ignore[arg-type]
    for name, t in tables.items():
        catalog.add_table(t if isinstance(t, Table) else Table(name, t, []))
    for stream, hs in (hierarchies or {}).items():
        for h in hs if stream in streams else ():
            catalog.add_hierarchy(stream, h.levels, h.source)
    return catalog


__all__ = [
    "SparkQuery",
    "SparkUnion",
    "SparkUnsupportedError",
    "compile_query",
    "compile_union",
    "fjord_schema",
    "spark_schema",
    "spark_type",
]
