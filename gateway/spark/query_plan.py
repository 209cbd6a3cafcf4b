"""One compiled query on Spark (`SparkQuery`): the DataFrame operations of its two stages.

  stage A  `stream_stage(df)`: filters on the stream, `window()` aligned to multiples of the
           SLIDE since the epoch, and the windowed partial aggregate keyed by every stream column
           needed later. Streaming-safe: the only stateful operator, with an optional watermark.
           A stream-stream join runs here too (`_join_streams`).
  stage B  `finish(partials, table)`: the equi-join with the static table, conditions on NOW
           (the window end), the regroup by GROUP BY, HAVING and the SELECT list. Stateless, so a
           streaming job runs it per micro-batch (`foreachBatch`).

Partial states are (count, sum, min, max) per aggregate, like the Fjord's panes, so the regroup
is exact (`partial_states`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fjords.compile.analysis import RIGHT, STREAM, BoundQuery
from fjords.compile.sql import ast
from fjords.errors import QueryError
from gateway.spark.expressions import (
    TS,
    WE,
    WS,
    compile_expr,
    duration,
    joined_leaf,
    r_name,
    s_name,
    side_leaf,
    stream_leaf,
    t_name,
)

AS_OF = "__as_of"  # EMIT CHANGES EVERY d: the instant an early row counts up to (exclusive)

if TYPE_CHECKING:  # pyspark is imported lazily: compiling (and its errors) needs no JVM
    from pyspark.sql import Column, DataFrame


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
        """Filters and the windowed partial aggregate; `watermark` (e.g. '5 minutes') for streams
        (a `df` that has the event-time column `TS` already keeps its watermarks instead).
        A stream-stream join reads its second stream from `right` (default: `df`, a self-join)
        and joins here (see `_join_streams`)."""
        from pyspark.sql import functions as F

        b = self.bound
        if b.right is not None:
            return self._join_streams(df, right, watermark)
        now_col = F.col(self.time_column)
        leaf = lambda n: stream_leaf(n, b, now_col)  # noqa: E731
        for cond in b.stream_filters:
            df = df.where(compile_expr(cond, leaf))
        stream_names = list(b.schema.names)
        if not self.windowed:
            if b.table is None:
                return df.select(*self._select_plain(now_col))
            return df.select(*[F.col(n).alias(s_name(n)) for n in stream_names])
        rng, slide = self.window  # type: ignore[misc]
        if TS not in df.columns:  # else the sources made it, each with its own watermark
            df = df.withColumn(TS, F.timestamp_seconds(F.col(self.time_column)))
            if watermark is not None:
                df = df.withWatermark(TS, watermark)
        win = F.window(TS, duration(rng), duration(slide)).alias("__w")
        if b.table is None:
            keys = [compile_expr(k, leaf).alias(f"__k{i}") for i, k in enumerate(b.query.group_by)]
        else:
            keys = [F.col(r.name).alias(s_name(r.name)) for r in b.needed]
        args, states = partial_states(b, leaf)
        df = df.select(
            TS, *[F.col(n) for n in stream_names], *[c.alias(k) for k, c in args.items()]
        )
        every = b.query.changes.every_s if b.query.changes is not None else None
        if every is None:
            out = df.groupBy(win, *keys).agg(F.count(F.lit(1)).alias("__rows"), *states)
        else:
            df = self._instants(df.withColumn("__w", win), rng, every)
            out = df.groupBy("__w", AS_OF, *keys).agg(F.count(F.lit(1)).alias("__rows"), *states)
        return out.select(
            (F.unix_micros(F.col("__w.start")) / 1e6).alias(WS),
            (F.unix_micros(F.col("__w.end")) / 1e6).alias(WE),
            *[c for c in out.columns if c != "__w"],
        )

    def _instants(self, df: DataFrame, rng: float, every: float) -> DataFrame:
        """EMIT CHANGES EVERY d (batch): a reading at t in window [ws, we) counts in the rows
        as of each instant ws + k*d after t (k = 1..range/d), so grouping by the instant too
        gives each early row's aggregate, the last instant (the close) the final one."""
        from pyspark.sql import functions as F

        n = round(rng / every)
        ws = F.unix_micros(F.col("__w.start")) / 1e6
        df = df.withColumn("__k", F.explode(F.sequence(F.lit(1), F.lit(n))))
        df = df.withColumn(AS_OF, ws + F.col("__k") * F.lit(every))
        return df.where(F.col(AS_OF) > F.col(self.time_column)).drop("__k")

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
        left_leaf = lambda n: side_leaf(n, b, STREAM, plain=True)  # noqa: E731
        right_leaf = lambda n: side_leaf(n, b, RIGHT, plain=True)  # noqa: E731
        for cond in b.stream_filters:
            left = left.where(compile_expr(cond, left_leaf))
        for cond in side.filters:
            right = right.where(compile_expr(cond, right_leaf))
        dur = duration(b.window.range)
        sides = []
        for df, schema, name, ts, win in (
            (left, b.schema, s_name, TS, "__lw"),
            (right, side.schema, r_name, "__tsr", "__rw"),
        ):
            df = df.select(
                *[F.col(n).alias(name(n)) for n in schema.names],
                F.timestamp_seconds(F.col(schema.time)).alias(ts),  # type: ignore[arg-type]
            )
            if watermark is not None:
                df = df.withWatermark(ts, watermark)
            sides.append(df.withColumn(win, F.window(ts, dur)))
        on = F.col("__lw") == F.col("__rw")
        for lk, rk in b.join_keys:
            on = on & (F.col(s_name(lk.name)) == F.col(r_name(rk.name)))
        joined = sides[0].join(sides[1], on=on, how="inner")
        leaf = lambda n: side_leaf(n, b, None)  # noqa: E731
        for c in b.post_join:
            joined = joined.where(compile_expr(c, leaf))
        if not self.windowed:
            out: list[Column] = []
            names = iter(b.select_names)
            for item in b.query.select:
                if isinstance(item, ast.Star):
                    for alias, schema, name in (
                        (b.stream_alias, b.schema, s_name),
                        (side.alias, side.schema, r_name),
                    ):
                        if item.table in (None, alias):
                            out += [F.col(name(c)).alias(next(names)) for c in schema.names]
                    continue
                out.append(compile_expr(item.expr, leaf).alias(next(names)))
            return joined.select(*out)
        keys = [compile_expr(k, leaf).alias(f"__k{i}") for i, k in enumerate(b.query.group_by)]
        args, states = partial_states(b, leaf)
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
                compile_expr(k, lambda n: joined_leaf(n, b, F.col(WE))).alias(f"__k{i}")
                for i, k in enumerate(b.query.group_by)
            ]
            partials = partials.groupBy(WS, WE, *keys).agg(*merged_states(b))
        if b.query.grouping_sets:
            partials = self._grouping_sets(partials)
        return self._finalize(partials)

    def _grouping_sets(self, partials: DataFrame) -> DataFrame:
        """ROLLUP / GROUPING SETS: every level of a window merged from its finest groups'
        partial states (as the Fjord's RollupFinish), by Spark's GROUPING SETS over the window
        and the keys; a rolled-up key is NULL and its flag `__g{i}` (GROUPING()) is 1. Each
        window's groups are all in one micro-batch (append mode), so streaming is exact too."""
        from pyspark.sql import functions as F

        b = self.bound
        keys = [f"__k{i}" for i in range(len(b.query.group_by))]
        sets = [[WS, WE, *[keys[i] for i in level]] for level in b.query.grouping_sets]
        flags = [F.grouping(k).cast("long").alias(f"__g{i}") for i, k in enumerate(keys)]
        return partials.groupingSets(sets, WS, WE, *keys).agg(*merged_states(b), *flags)

    # -- helpers -----------------------------------------------------------------------------

    def _join_table(self, left: DataFrame, table: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        b = self.bound
        right = table.select(*[F.col(n).alias(t_name(n)) for n in b.table.schema.names])  # type: ignore[union-attr]
        if b.join_keys:
            (sk, tk), *rest = b.join_keys
            on = F.col(s_name(sk.name)) == F.col(t_name(tk.name))
            for sk, tk in rest:
                on = on & (F.col(s_name(sk.name)) == F.col(t_name(tk.name)))
            joined = left.join(F.broadcast(right), on=on, how="inner")
        else:
            joined = left.crossJoin(F.broadcast(right))
        now = F.col(WE) if self.windowed else F.col(s_name(self.time_column))
        for cond in b.post_join:
            joined = joined.where(compile_expr(cond, lambda n: joined_leaf(n, b, now)))
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
            expr = compile_expr(item.expr, lambda x: stream_leaf(x, b, now_col))
            out.append(expr.alias(next(names)))
        return out

    def _select_joined(self) -> list[Column]:
        from pyspark.sql import functions as F

        b = self.bound
        now = F.col(s_name(self.time_column))
        out: list[Column] = []
        names = iter(b.select_names)
        for item in b.query.select:
            if isinstance(item, ast.Star):
                if item.table in (None, b.stream_alias):
                    out += [F.col(s_name(c)).alias(next(names)) for c in b.schema.names]
                if item.table in (None, b.table_alias):
                    out += [F.col(t_name(c)).alias(next(names)) for c in b.table.schema.names]  # type: ignore[union-attr]
                continue
            expr = compile_expr(item.expr, lambda x: joined_leaf(x, b, now))
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
            if isinstance(node, ast.Func) and node.name == "GROUPING":
                return grouping(node.args[0])
            return None

        def grouping(arg: ast.Expr) -> Column:
            """GROUPING(col): 1 where the row's level rolls `col` up; a plain GROUP BY's is 0."""
            for i, k in enumerate(group_by):
                same = k == arg or (
                    isinstance(arg, ast.Column)
                    and isinstance(k, ast.Column)
                    and b.ref(arg) == b.ref(k)
                )
                if same:
                    return F.col(f"__g{i}") if b.query.grouping_sets else F.lit(0).cast("long")
            # analyze() refused it
            raise QueryError(f"GROUPING({ast.to_sql(arg)}): not a GROUP BY column")

        if b.query.drilldown is not None:
            grouped = self._drilldown(grouped, leaf)
        elif b.query.having is not None:
            grouped = grouped.where(compile_expr(b.query.having, leaf))
        items = [
            compile_expr(item.expr, leaf).alias(name)  # type: ignore[union-attr]
            for item, name in zip(b.query.select, b.columns, strict=False)
        ]
        slots = {
            "window_start": F.col(WS),
            "window_end": F.col(WE),
            "as_of": F.col(AS_OF),
            "final": F.col(AS_OF) == F.col(WE),
        }
        extra = [slots[c].alias(c) for c in b.columns[len(items) :]]
        hidden = [compile_expr(e, leaf).alias(f"__o{j}") for j, e in enumerate(b.order_exprs)]
        out = grouped.select(*items, *extra, *hidden)
        return self._per_window(out) if b.per_window else out

    def _drilldown(self, grouped: DataFrame, leaf: Callable) -> DataFrame:
        """A drill-down's pruning as the Fjord's (`RollupFinish._pruned`), top-down: the HAVING
        (each level's condition, told apart by the GROUPING flags) is a pass flag per row, and
        a level-d row is kept where it passes and a kept level-(d-1) row has its window and its
        d leading keys, by a semi-join per level. Keys match null-safe: a NULL key value is a
        value, as in the Fjord's tuples."""
        from pyspark.sql import functions as F

        b = self.bound
        n = len(b.query.group_by)
        having = b.query.having
        passing = (
            F.lit(True) if having is None else F.coalesce(compile_expr(having, leaf), F.lit(False))
        )
        rows = grouped.where(passing)
        kept: DataFrame | None = None
        levels: list[DataFrame] = []
        for depth in range(n):
            # level `depth` keys __k0..__k{depth}: its flag is 0, the next (if any) is 1
            at = F.col(f"__g{depth}") == 0
            if depth + 1 < n:
                at = at & (F.col(f"__g{depth + 1}") == 1)
            level = rows.where(at)
            if kept is not None:
                on = [WS, WE, *[f"__k{i}" for i in range(depth)]]
                parent = kept.select(*[F.col(c).alias(f"__p{c}") for c in on])
                cond = [F.col(c).eqNullSafe(F.col(f"__p{c}")) for c in on]
                level = level.join(parent, on=cond, how="left_semi")
            levels.append(level)
            kept = level
        out = levels[0]
        for level in levels[1:]:
            out = out.unionByName(level)
        return out

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


def merged_states(b: BoundQuery) -> list[Any]:
    """The partial states of `partial_states` merged over groups: counts and sums added, the
    least minimum, the greatest maximum, the union of the distinct sets."""
    from pyspark.sql import functions as F

    merged = [F.sum("__rows").alias("__rows")]
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
    return merged


def partial_states(b: BoundQuery, leaf: Callable) -> tuple[dict[str, Any], list[Any]]:
    """The aggregate arguments (`__v{j}`, `__dv{j}`) and the partial state columns of a window:
    count, sum, min and max of each argument, and for COUNT(DISTINCT x) the set of x (merged
    by union, counted at the end)."""
    from pyspark.sql import functions as F

    args = {f"__v{j}": compile_expr(a, leaf) for j, a in enumerate(b.agg_args)}
    args |= {f"__dv{j}": compile_expr(a, leaf) for j, a in enumerate(b.distinct_args)}
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
