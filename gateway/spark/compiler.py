"""Compile a query of the project's SQL dialect into Spark DataFrame operations.

The same text the Fjord runs is analysed once by `fjords.compile.analysis` (so names, errors and
result columns are the Fjord's), then translated in two stages that mirror the Fjord's plan for
Query 2 (windowed aggregate -> static-table join -> regroup):

  stage A  `stream_stage(df)`: filters on the stream, `window()` aligned to multiples of the
           SLIDE since the epoch, and the windowed partial aggregate keyed by every stream column
           needed later. Streaming-safe: the only stateful operator, with an optional watermark.
  stage B  `finish(partials, table)`: the equi-join with the static table, conditions on NOW
           (the window end), the regroup by GROUP BY, HAVING and the SELECT list. Stateless, so a
           streaming job runs it per micro-batch (`foreachBatch`), where the table can be reloaded
           when its file changes and every window of a batch is complete (append mode).

A stream-stream join runs in stage A (`_join_streams`): each side filtered, an equi-join on the
keys and the tumbling `window()` both tuples fall in (in a streaming job each side has the
watermark and the window equality is the join's time constraint, so Spark drops old state), then
the SELECT list or the windowed partial aggregate over the joined rows.

Partial states are (count, sum, min, max) per aggregate, like the Fjord's panes, so the regroup is
exact. Compilation needs no Spark session; DataFrame columns are only built inside the stages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fjords.catalog import Catalog, StreamInfo
from fjords.compile.analysis import RIGHT, STREAM, BoundQuery, BoundUnion, analyze, analyze_union
from fjords.compile.sql import ast
from fjords.compile.sql.parser import parse
from fjords.errors import ClauseError, QueryError
from fjords.schema import Field, Schema
from fjords.tables import Table

if TYPE_CHECKING:  # pyspark is imported lazily: compiling (and its errors) needs no JVM
    from pyspark.sql import Column, DataFrame


class SparkUnsupportedError(ClauseError):
    """A valid query that Spark cannot run; the message names the construct (and where it is,
    when the construct has a position)."""


TS = "__ts"  # event time as a Spark timestamp (window() and the watermark need one)
WS, WE = "__ws", "__we"  # window start/end, epoch seconds (double), like the Fjord's rows


def _s(name: str) -> str:
    return f"s__{name}"


def _t(name: str) -> str:
    return f"t__{name}"


def _r(name: str) -> str:
    return f"r__{name}"  # the second stream of a stream-stream join


@dataclass
class SparkQuery:
    """A compiled query: run `stream_stage` on the stream, then `finish` on its output."""

    sql: str | None
    bound: BoundQuery

    @property
    def query(self) -> ast.Query:
        return self.bound.query

    @property
    def stream(self) -> str:
        return self.bound.stream

    @property
    def columns(self) -> tuple[str, ...]:
        return self.bound.columns

    @property
    def window(self) -> tuple[float, float] | None:
        """(range_s, slide_s) of a windowed query."""
        w = self.bound.window
        return (w.range, w.slide) if self.bound.windowed and w is not None else None

    @property
    def right_stream(self) -> str | None:
        """The second stream of a stream-stream join (None without one)."""
        return self.bound.right.stream if self.bound.right is not None else None

    @property
    def table(self) -> str | None:
        return self.bound.table.name if self.bound.table is not None else None

    @property
    def time_column(self) -> str:
        return self.bound.time_column  # type: ignore[return-value]  # checked by compile_query

    @property
    def windowed(self) -> bool:
        return self.bound.windowed

    # -- stage A -----------------------------------------------------------------------------

    def stream_stage(
        self, df: DataFrame, *, watermark: str | None = None, right: DataFrame | None = None
    ) -> DataFrame:
        """Filters and the windowed partial aggregate; `watermark` (e.g. '5 minutes') for streams.
        A stream-stream join reads its second stream from `right` (default: `df`, a self-join)
        and joins here (see `_join_streams`)."""
        from pyspark.sql import functions as F

        b = self.bound
        if b.right is not None:
            return self._join_streams(df, right, watermark)
        now_col = F.col(self.time_column)
        leaf = lambda n: _stream_leaf(n, b, now_col)  # noqa: E731
        for cond in b.stream_filters:
            df = df.where(_compile(cond, leaf))
        stream_names = list(b.schema.names)
        if not self.windowed:
            if b.table is None:
                return df.select(*self._select_plain(now_col))
            return df.select(*[F.col(n).alias(_s(n)) for n in stream_names])
        rng, slide = self.window  # type: ignore[misc]
        df = df.withColumn(TS, F.timestamp_seconds(F.col(self.time_column)))
        if watermark is not None:
            df = df.withWatermark(TS, watermark)
        win = F.window(TS, _duration(rng), _duration(slide)).alias("__w")
        if b.table is None:
            keys = [_compile(k, leaf).alias(f"__k{i}") for i, k in enumerate(b.query.group_by)]
        else:
            keys = [F.col(r.name).alias(_s(r.name)) for r in b.needed]
        args, states = _partial_states(b, leaf)
        df = df.select(
            TS, *[F.col(n) for n in stream_names], *[c.alias(k) for k, c in args.items()]
        )
        out = df.groupBy(win, *keys).agg(F.count(F.lit(1)).alias("__rows"), *states)
        return out.select(
            (F.unix_micros(F.col("__w.start")) / 1e6).alias(WS),
            (F.unix_micros(F.col("__w.end")) / 1e6).alias(WE),
            *[c for c in out.columns if c != "__w"],
        )

    def _join_streams(
        self, left: DataFrame, right: DataFrame | None, watermark: str | None
    ) -> DataFrame:
        """A stream-stream join as the Fjord's (fjords.compile.planner `_plan_stream_join`): each
        side's filters, then an equi-join on the join keys and the tumbling window both tuples
        fall in (`window()`, aligned like the Fjord's), the conditions across both, and either
        the SELECT list (no aggregates) or the windowed partial aggregate over the joined rows
        (the join's window is the aggregate's), which `finish` completes.

        Streaming (`watermark`): each side gets the watermark, and the window equality is the
        time constraint Structured Streaming needs to drop old join state."""
        from pyspark.sql import functions as F

        b = self.bound
        side = b.right
        assert side is not None and b.window is not None
        if right is None:
            if side.stream != b.stream:
                raise QueryError(f"query joins stream {side.stream!r}: pass its DataFrame")
            right = left
        left_leaf = lambda n: _side_leaf(n, b, STREAM, plain=True)  # noqa: E731
        right_leaf = lambda n: _side_leaf(n, b, RIGHT, plain=True)  # noqa: E731
        for cond in b.stream_filters:
            left = left.where(_compile(cond, left_leaf))
        for cond in side.filters:
            right = right.where(_compile(cond, right_leaf))
        dur = _duration(b.window.range)
        sides = []
        for df, schema, name, ts, win in (
            (left, b.schema, _s, TS, "__lw"),
            (right, side.schema, _r, "__tsr", "__rw"),
        ):
            df = df.select(
                *[F.col(n).alias(name(n)) for n in schema.names],
                F.timestamp_seconds(F.col(schema.time)).alias(ts),  # type: ignore[arg-type]
            )
            if watermark is not None:
                df = df.withWatermark(ts, watermark)
            sides.append(df.withColumn(win, F.window(ts, dur)))
        cond = F.col("__lw") == F.col("__rw")
        for lk, rk in b.join_keys:
            cond = cond & (F.col(_s(lk.name)) == F.col(_r(rk.name)))
        joined = sides[0].join(sides[1], on=cond, how="inner")
        leaf = lambda n: _side_leaf(n, b, None)  # noqa: E731
        for c in b.post_join:
            joined = joined.where(_compile(c, leaf))
        if not self.windowed:
            out: list[Column] = []
            names = iter(b.select_names)
            for item in b.query.select:
                if isinstance(item, ast.Star):
                    for alias, schema, name in (
                        (b.stream_alias, b.schema, _s),
                        (side.alias, side.schema, _r),
                    ):
                        if item.table in (None, alias):
                            out += [F.col(name(c)).alias(next(names)) for c in schema.names]
                    continue
                out.append(_compile(item.expr, leaf).alias(next(names)))
            return joined.select(*out)
        keys = [_compile(k, leaf).alias(f"__k{i}") for i, k in enumerate(b.query.group_by)]
        args, states = _partial_states(b, leaf)
        kept = [c for c in joined.columns if c not in ("__rw",)]
        joined = joined.select(*kept, *[c.alias(k) for k, c in args.items()])
        out_df = joined.groupBy(F.col("__lw").alias("__w"), *keys).agg(
            F.count(F.lit(1)).alias("__rows"), *states
        )
        return out_df.select(
            (F.unix_micros(F.col("__w.start")) / 1e6).alias(WS),
            (F.unix_micros(F.col("__w.end")) / 1e6).alias(WE),
            *[c for c in out_df.columns if c != "__w"],
        )

    # -- stage B -----------------------------------------------------------------------------

    def finish(self, partials: DataFrame, table: DataFrame | None = None) -> DataFrame:
        """Join, regroup, HAVING and SELECT over stage A's output (a batch DataFrame)."""
        from pyspark.sql import functions as F

        b = self.bound
        if b.table is not None:
            if table is None:
                raise QueryError(f"query joins table {self.table!r}: pass its DataFrame")
            partials = self._join_table(partials, table)
        if not self.windowed:
            if b.table is None:
                return partials
            return partials.select(*self._select_joined())
        if b.table is not None:
            keys = [
                _compile(k, lambda n: _joined_leaf(n, b, F.col(WE))).alias(f"__k{i}")
                for i, k in enumerate(b.query.group_by)
            ]
            merged = []
            for j in range(len(b.agg_args)):
                merged += [
                    F.sum(f"__c{j}").alias(f"__c{j}"),
                    F.sum(f"__s{j}").alias(f"__s{j}"),
                    F.min(f"__m{j}").alias(f"__m{j}"),
                    F.max(f"__x{j}").alias(f"__x{j}"),
                ]
            merged += [
                F.array_distinct(F.flatten(F.collect_list(f"__d{j}"))).alias(f"__d{j}")
                for j in range(len(b.distinct_args))
            ]
            partials = partials.groupBy(WS, WE, *keys).agg(F.sum("__rows").alias("__rows"), *merged)
        return self._finalize(partials)

    # -- helpers -----------------------------------------------------------------------------

    def _join_table(self, left: DataFrame, table: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        b = self.bound
        right = table.select(*[F.col(n).alias(_t(n)) for n in b.table.schema.names])  # type: ignore[union-attr]
        if b.join_keys:
            cond = None
            for sk, tk in b.join_keys:
                c = F.col(_s(sk.name)) == F.col(_t(tk.name))
                cond = c if cond is None else cond & c
            joined = left.join(F.broadcast(right), on=cond, how="inner")
        else:
            joined = left.crossJoin(F.broadcast(right))
        now = F.col(WE) if self.windowed else F.col(_s(self.time_column))
        for cond in b.post_join:
            joined = joined.where(_compile(cond, lambda n: _joined_leaf(n, b, now)))
        return joined

    def _select_plain(self, now_col: Column) -> list[Column]:
        from pyspark.sql import functions as F

        b = self.bound
        out: list[Column] = []
        names = iter(b.select_names)
        for item in b.query.select:
            if isinstance(item, ast.Star):
                out += [F.col(c) for c in b.schema.names]
                for _ in b.schema.names:
                    next(names)
                continue
            expr = _compile(item.expr, lambda x: _stream_leaf(x, b, now_col))
            out.append(expr.alias(next(names)))
        return out

    def _select_joined(self) -> list[Column]:
        from pyspark.sql import functions as F

        b = self.bound
        now = F.col(_s(self.time_column))
        out: list[Column] = []
        names = iter(b.select_names)
        for item in b.query.select:
            if isinstance(item, ast.Star):
                if item.table in (None, b.stream_alias):
                    out += [F.col(_s(c)).alias(next(names)) for c in b.schema.names]
                if item.table in (None, b.table_alias):
                    out += [F.col(_t(c)).alias(next(names)) for c in b.table.schema.names]  # type: ignore[union-attr]
                continue
            expr = _compile(item.expr, lambda x: _joined_leaf(x, b, now))
            out.append(expr.alias(next(names)))
        return out

    def _finalize(self, grouped: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        b = self.bound
        args, dargs = list(b.agg_args), list(b.distinct_args)
        values: dict[ast.Aggregate, Column] = {}
        for a in b.aggregates:
            if a.distinct:
                values[a] = F.size(F.col(f"__d{dargs.index(a.arg)}"))  # type: ignore[arg-type]
                continue
            if a.arg is None:
                values[a] = F.col("__rows")
                continue
            j = args.index(a.arg)
            n = F.col(f"__c{j}")
            if a.func == "COUNT":
                values[a] = n
            elif a.func == "SUM":
                values[a] = F.when(n > 0, F.col(f"__s{j}"))
            elif a.func == "AVG":
                values[a] = F.when(n > 0, F.col(f"__s{j}") / n)
            elif a.func == "MIN":
                values[a] = F.col(f"__m{j}")
            else:
                values[a] = F.col(f"__x{j}")
        group_by = list(b.query.group_by)
        key_refs = [b.ref(k) if isinstance(k, ast.Column) else None for k in group_by]

        def leaf(node: ast.Expr) -> Column | None:
            if isinstance(node, ast.Aggregate):
                return values[node]
            if isinstance(node, ast.Now):
                return F.col(WE)
            if isinstance(node, ast.Column):
                slot = b.window_slot(node)
                if slot is not None:
                    return F.col(WS if slot == "window_start" else WE)
                # analyze() checked that every other column is a GROUP BY key
                return F.col(f"__k{key_refs.index(b.ref(node))}")
            for i, k in enumerate(group_by):
                if k == node:
                    return F.col(f"__k{i}")
            return None

        if b.query.having is not None:
            grouped = grouped.where(_compile(b.query.having, leaf))
        items = [
            _compile(item.expr, leaf).alias(name)  # type: ignore[union-attr]
            for item, name in zip(b.query.select, b.columns, strict=False)
        ]
        extra = [F.col(WS if c == "window_start" else WE).alias(c) for c in b.columns[len(items) :]]
        hidden = [_compile(e, leaf).alias(f"__o{j}") for j, e in enumerate(b.order_exprs)]
        out = grouped.select(*items, *extra, *hidden)
        return self._per_window(out) if b.per_window else out

    def _per_window(self, rows: DataFrame) -> DataFrame:
        """DISTINCT rows, ORDER BY and LIMIT within each window, as fjords.runtime.operators.topk:
        ascending puts NULLs first, descending last; ties go by the result columns."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        b = self.bound
        names = [*b.columns, *[f"__o{j}" for j in range(len(b.order_exprs))]]
        if b.distinct_rows:
            rows = rows.dropDuplicates(list(b.columns))
        keys = [
            F.col(names[i]).desc_nulls_last() if desc else F.col(names[i]).asc_nulls_first()
            for i, desc in b.order
        ]
        order = [*keys, *[F.col(c).asc_nulls_first() for c in b.columns]]
        if b.limit is not None:
            w = Window.partitionBy("window_start", "window_end").orderBy(*order)
            rows = rows.withColumn("__rank", F.row_number().over(w))
            rows = rows.where(F.col("__rank") <= b.limit)
        if keys:  # collected in this order: batch's result_rows keeps it within each window
            rows = rows.orderBy("window_end", "window_start", *order)
        return rows.select(*b.columns)


# -- compile -----------------------------------------------------------------------------------


def _partial_states(b: BoundQuery, leaf: Callable) -> tuple[dict[str, Any], list[Any]]:
    """The aggregate arguments (`__v{j}`, `__dv{j}`) and the partial state columns of a window:
    count, sum, min and max of each argument, and for COUNT(DISTINCT x) the set of x (merged
    by union, counted at the end)."""
    from pyspark.sql import functions as F

    args = {f"__v{j}": _compile(a, leaf) for j, a in enumerate(b.agg_args)}
    args |= {f"__dv{j}": _compile(a, leaf) for j, a in enumerate(b.distinct_args)}
    states = []
    for j in range(len(b.agg_args)):
        v = F.col(f"__v{j}")
        states += [
            F.count(v).alias(f"__c{j}"),
            F.sum(v).alias(f"__s{j}"),
            F.min(v).alias(f"__m{j}"),
            F.max(v).alias(f"__x{j}"),
        ]
    states += [
        F.collect_set(F.col(f"__dv{j}")).alias(f"__d{j}") for j in range(len(b.distinct_args))
    ]
    return args, states


def compile_query(
    sql: str | ast.Query | ast.Union,
    streams: Mapping[str, Schema],
    tables: Mapping[str, Schema] | None = None,
    *,
    bound: BoundQuery | None = None,
) -> SparkQuery:
    """Analyse `sql` (fjords.compile.analysis, as the Fjord does), then check it for Spark.

    `streams` and `tables` give the schemas (Fjord types: int, float, str, bool) by name; a
    stream's schema must name its time column. Raises QueryError (SparkUnsupportedError for
    constructs Spark cannot run) with a message naming the problem. `bound` is the query
    already analysed (a union's branch). A UNION ALL compiles to a `SparkUnion`.
    """
    query = parse(sql) if isinstance(sql, str) else sql
    if isinstance(query, ast.Union):
        return compile_union(  # type: ignore[return-value]
            query, streams, tables, sql=sql if isinstance(sql, str) else None
        )
    tables = dict(tables or {})
    for ref in query.sources:
        if ref.window is not None and ref.window.rows is not None:
            raise SparkUnsupportedError(
                "ROWS windows are not supported on Spark (row counts have no event-time order "
                "across partitions); use a time window such as [RANGE 15 MINUTES]",
                ref.window.pos,
            )
    catalog = Catalog()
    for name, schema in streams.items():
        catalog.add_stream(StreamInfo(name, schema))
    for name, schema in tables.items():
        catalog.add_table(Table(name, schema, []))
    # The one analysis both engines share: the same names, checks and errors as the Fjord.
    bound = analyze(query, catalog) if bound is None else bound
    # The sensor clauses steer how the gateway's sensors sample (the proxies' demand); a Spark
    # job reads what was already recorded, so it cannot honour them: refused, never ignored.
    for clause, value in (("SAMPLE PERIOD", query.sample_period_s), ("LIFETIME", query.lifetime_s)):
        if value is not None:
            raise SparkUnsupportedError(
                f"{clause} sets how the gateway's sensors sample, and a Spark job reads data "
                f"already recorded: run the query on the Fjord (the default engine) or remove "
                f"{clause}",
                query.pos_of(clause),
            )
    if query.priority is not None:  # refused like the sensor clauses, never ignored
        raise SparkUnsupportedError(
            "PRIORITY sets a query's share of the Fjord's scheduler, and Spark schedules its own "
            "jobs: run the query on the Fjord (the default engine) or remove PRIORITY",
            query.pos_of("PRIORITY"),
        )
    if bound.time_column is None:
        raise SparkUnsupportedError(f"stream {bound.stream!r} has no time column")
    compiled = SparkQuery(sql=sql if isinstance(sql, str) else None, bound=bound)
    for secs in compiled.window or ():
        if abs(secs * 1e6 - round(secs * 1e6)) > 1e-3:
            raise SparkUnsupportedError(
                f"window durations must be whole microseconds on Spark, got {secs} s"
            )
    return compiled


def _catalog(streams: Mapping[str, Schema], tables: Mapping[str, Schema]) -> Catalog:
    catalog = Catalog()
    for name, schema in streams.items():
        catalog.add_stream(StreamInfo(name, schema))
    for name, schema in tables.items():
        catalog.add_table(Table(name, schema, []))
    return catalog


@dataclass
class SparkUnion:
    """A UNION ALL on Spark: each bound branch compiled as a query of its own, their result
    DataFrames cut to the union's columns, named and typed as the union's, and `union`ed.

    Batch (`run`) takes any branches; streaming (`stream_stage`/`finish`, as StreamingJob
    drives a query) takes row-by-row branches without a table join, which stay one stateless
    streaming DataFrame. Rows come in no particular order (the Fjord's come in time order)."""

    sql: str | None
    bound: BoundUnion
    branches: list[SparkQuery]

    @property
    def columns(self) -> tuple[str, ...]:
        return self.bound.columns

    @property
    def stream(self) -> str:
        return self.branches[0].stream

    @property
    def windowed(self) -> bool:
        return self.bound.windowed

    @property
    def window(self) -> tuple[float, float] | None:
        return self.branches[0].window

    @property
    def table(self) -> str | None:
        """None: a streaming union joins no table (`run` fetches each branch's own)."""
        return None

    @property
    def query(self) -> ast.Union:
        return self.bound.union

    def _cut(self, df: DataFrame) -> DataFrame:
        """A branch's result as the union's row: its leading columns, renamed and cast."""
        from pyspark.sql import functions as F

        cols = []
        for i, name in enumerate(self.columns):
            kind = self.bound.types[i] if i < len(self.bound.types) else "float"
            c = F.col(f"`{df.columns[i]}`")
            cols.append((c if kind == "null" else c.cast(spark_type(kind))).alias(name))
        return df.select(*cols)

    def run(self, streams: Mapping[str, DataFrame], table: Callable[[str], DataFrame]) -> DataFrame:
        """The union over batch DataFrames: `streams` by name, `table(name)` a table's."""
        out = None
        for q in self.branches:
            t = table(q.table) if q.table is not None else None
            df = self._cut(q.finish(q.stream_stage(streams[q.stream]), t))
            out = df if out is None else out.union(df)
        return out  # type: ignore[return-value]

    def _streamable(self) -> None:
        if self.windowed or any(q.table is not None for q in self.branches):
            raise SparkUnsupportedError(
                "a UNION ALL of windowed aggregates or of table joins runs on Spark as a batch "
                "job only (spark batch / replay --engine spark); run it on the Fjord (the "
                "default engine) to stream it",
                self.bound.union.union_pos[0] if self.bound.union.union_pos else None,
            )
        if len(set(q.stream for q in self.branches)) > 1:
            raise SparkUnsupportedError(
                "a Spark job reads one stream's archive; this UNION ALL reads several: run it "
                "on the Fjord (the default engine)",
                self.bound.union.union_pos[0] if self.bound.union.union_pos else None,
            )

    def stream_stage(self, df: DataFrame, *, watermark: str | None = None) -> DataFrame:
        """Streaming (or a one-stream batch): the branches' filters and projections, unioned."""
        self._streamable()
        out = None
        for q in self.branches:
            part = self._cut(q.stream_stage(df, watermark=watermark))
            out = part if out is None else out.union(part)
        return out  # type: ignore[return-value]

    def finish(self, partials: DataFrame, table: DataFrame | None = None) -> DataFrame:
        return partials


def compile_union(
    union: ast.Union,
    streams: Mapping[str, Schema],
    tables: Mapping[str, Schema] | None = None,
    *,
    sql: str | None = None,
) -> SparkUnion:
    """Analyse the union once (fjords.compile.analysis.analyze_union, as the Fjord does) and compile
    each bound branch with the checks of `compile_query`."""
    tables = dict(tables or {})
    for ref in union.sources:  # refused before analysis, as compile_query does
        if ref.window is not None and ref.window.rows is not None:
            raise SparkUnsupportedError(
                "ROWS windows are not supported on Spark (row counts have no event-time order "
                "across partitions); use a time window such as [RANGE 15 MINUTES]",
                ref.window.pos,
            )
    bu = analyze_union(union, _catalog(streams, tables))
    branches = [compile_query(b.query, streams, tables, bound=b) for b in bu.branches]
    return SparkUnion(sql=sql, bound=bu, branches=branches)


def _duration(seconds: float) -> str:
    return f"{round(seconds * 1e6)} microseconds"


def _stream_leaf(node: ast.Expr, b: BoundQuery, now: Column) -> Column | None:
    from pyspark.sql import functions as F

    if isinstance(node, ast.Column):
        r = b.ref(node)
        if r is None or r.side != STREAM:
            raise QueryError(f"column {node.name!r} of a table is not available here")
        return F.col(r.name)
    if isinstance(node, ast.Now):
        return now
    return None


def _side_leaf(
    node: ast.Expr, b: BoundQuery, side: str | None, *, plain: bool = False
) -> Column | None:
    """Columns of a stream-stream join: of one side (`side`), before the join under their own
    names (`plain`), or of either side after it (prefixed `s__` / `r__`)."""
    from pyspark.sql import functions as F

    if isinstance(node, ast.Column):
        r = b.ref(node)
        if r is None or (side is not None and r.side != side):
            raise QueryError(f"column {node.name!r} is not available here")
        if plain:
            return F.col(r.name)
        return F.col(_s(r.name) if r.side == STREAM else _r(r.name))
    return None


def _joined_leaf(node: ast.Expr, b: BoundQuery, now: Column) -> Column | None:
    from pyspark.sql import functions as F

    if isinstance(node, ast.Column):
        slot = b.window_slot(node)
        if slot is not None:
            return F.col(WS if slot == "window_start" else WE)
        r = b.ref(node)
        assert r is not None
        return F.col(_s(r.name) if r.side == STREAM else _t(r.name))
    if isinstance(node, ast.Now):
        return now
    return None


def _compile(expr: ast.Expr, leaf: Callable[[ast.Expr], Any]) -> Column:
    """An expression as a Spark Column; NULL logic is SQL's, as in the Fjord's closures."""
    from pyspark.sql import functions as F

    hit = leaf(expr)
    if hit is not None:
        return hit
    rec = lambda e: _compile(e, leaf)  # noqa: E731
    match expr:
        case ast.Literal(value=v):
            return F.lit(v)
        case ast.Interval(seconds=s):
            return F.lit(s)
        case ast.Neg(operand=o):
            return -rec(o)
        case ast.BinaryOp(op=op, left=a, right=b):
            x, y = rec(a), rec(b)
            if op == "+":
                return x + y
            if op == "-":
                return x - y
            if op == "*":
                return x * y
            # Division by zero is NULL in the Fjord; never an error, whatever spark.sql.ansi says.
            return F.when(y != 0, x.cast("double") / y)
        case ast.Compare(op=op, left=a, right=b):
            x, y = rec(a), rec(b)
            return {
                "=": x == y,
                "!=": x != y,
                "<": x < y,
                "<=": x <= y,
                ">": x > y,
                ">=": x >= y,
            }[op]
        case ast.InList(expr=e, values=vals, negated=neg):
            c = rec(e).isin(*[rec(v) for v in vals])
            return ~c if neg else c
        case ast.Between(expr=e, low=lo, high=hi, negated=neg):
            x = rec(e)
            c = (x >= rec(lo)) & (x <= rec(hi))
            return ~c if neg else c
        case ast.IsNull(expr=e, negated=neg):
            return rec(e).isNotNull() if neg else rec(e).isNull()
        case ast.And(items=items):
            out = rec(items[0])
            for i in items[1:]:
                out = out & rec(i)
            return out
        case ast.Or(items=items):
            out = rec(items[0])
            for i in items[1:]:
                out = out | rec(i)
            return out
        case ast.Not(operand=o):
            return ~rec(o)
        case ast.Func(name=name, args=args):
            cols = [rec(a) for a in args]
            if name == "FLOAT":  # internal: an integer among floats (fjords.compile.analysis)
                return cols[0].cast("double")
            if name == "ABS":
                return F.abs(cols[0])
            if name == "ROUND":
                # HALF_UP, as the Fjord's round_half_up; the digits are a literal (typecheck)
                digits = args[1].value if len(args) > 1 else 0  # type: ignore[union-attr]
                return F.round(cols[0], digits)  # type: ignore[arg-type]
            if name == "COALESCE":
                return F.coalesce(*cols)
            return (F.least if name == "LEAST" else F.greatest)(*cols)
        case ast.Case(whens=whens, otherwise=o):
            out = None
            for cond, value in whens:
                c = rec(cond)
                if isinstance(cond, ast.Literal) and cond.value is None:
                    c = c.cast("boolean")  # WHEN NULL: never true (Spark wants a typed NULL)
                out = F.when(c, rec(value)) if out is None else out.when(c, rec(value))
            return out.otherwise(rec(o)) if o is not None else out  # type: ignore[union-attr]
        case ast.Column():
            raise QueryError(f"unknown column {expr.name!r}")
        case ast.Now():
            raise QueryError("NOW is not available here")
        case ast.Aggregate():
            raise QueryError(f"aggregate {expr.func} is not allowed here")
    raise SparkUnsupportedError(f"cannot translate expression {expr!r} to Spark")


def spark_type(kind: str) -> Any:
    """The Spark SQL type of a Fjord field type."""
    from pyspark.sql import types as T

    return {
        "int": T.LongType(),
        "float": T.DoubleType(),
        "str": T.StringType(),
        "bool": T.BooleanType(),
    }[kind]


def spark_schema(schema: Schema) -> Any:
    """A Spark StructType for a Fjord schema."""
    from pyspark.sql import types as T

    return T.StructType([T.StructField(f.name, spark_type(f.type), True) for f in schema.fields])


def fjord_schema(struct: Any, time: str | None = "time") -> Schema:
    """A Fjord schema for a Spark StructType (or anything with .fields of name/dataType)."""
    fields = []
    for f in struct.fields:
        t = f.dataType.typeName()
        kind = (
            "int"
            if t in ("long", "integer", "short", "byte")
            else "float"
            if t in ("double", "float", "decimal")
            else "bool"
            if t == "boolean"
            else "str"
        )
        fields.append(Field(f.name, kind))
    names = [f.name for f in fields]
    return Schema(fields, time=time if time in names else None)


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
