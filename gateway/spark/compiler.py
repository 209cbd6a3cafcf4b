"""Compile a query of the project's SQL dialect into Spark DataFrame operations.

The same text the Fjord runs is validated by the Fjord's own planner first (so names, errors and
result columns are the Fjord's), then translated in two stages that mirror the Fjord's plan for
Query 2 (windowed aggregate -> static-table join -> regroup):

  stage A  `stream_stage(df)`: filters on the stream, `window()` aligned to multiples of the
           SLIDE since the epoch, and the windowed partial aggregate keyed by every stream column
           needed later. Streaming-safe: the only stateful operator, with an optional watermark.
  stage B  `finish(partials, table)`: the equi-join with the static table, conditions on NOW
           (the window end), the regroup by GROUP BY, HAVING and the SELECT list. Stateless, so a
           streaming job runs it per micro-batch (`foreachBatch`), where the table can be reloaded
           when its file changes and every window of a batch is complete (append mode).

Partial states are (count, sum, min, max) per aggregate, like the Fjord's panes, so the regroup is
exact. Compilation needs no Spark session; DataFrame columns are only built inside the stages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fjords.catalog import Catalog, StreamInfo
from fjords.errors import ClauseError, QueryError
from fjords.expressions import coerce_literals, conjuncts, walk
from fjords.planner import WINDOW_COLUMNS, collect_aggregates, plan_query
from fjords.schema import Field, Schema
from fjords.sql import ast
from fjords.sql.parser import parse
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


@dataclass
class SparkQuery:
    """A compiled query: run `stream_stage` on the stream, then `finish` on its output."""

    sql: str | None
    query: ast.Query
    stream: str
    columns: tuple[str, ...]
    window: tuple[float, float] | None  # (range_s, slide_s) of a windowed query
    table: str | None
    time_column: str
    _scope: _Scope = field(repr=False)
    _pre: list[ast.Expr] = field(repr=False)
    _post: list[ast.Expr] = field(repr=False)
    _join: list[tuple[str, str]] = field(repr=False)  # (stream column, table column)
    _needed: list[str] = field(repr=False)  # stream columns carried through stage A
    _aggs: list[ast.Aggregate] = field(repr=False)
    _args: list[ast.Expr] = field(repr=False)

    @property
    def windowed(self) -> bool:
        return self.window is not None

    # -- stage A -----------------------------------------------------------------------------

    def stream_stage(self, df: DataFrame, *, watermark: str | None = None) -> DataFrame:
        """Filters and the windowed partial aggregate; `watermark` (e.g. '5 minutes') for streams."""
        from pyspark.sql import functions as F

        sc = self._scope
        now_col = F.col(self.time_column)
        for cond in self._pre:
            df = df.where(_compile(cond, lambda n: _stream_leaf(n, sc, now_col)))
        if not self.windowed:
            if self.table is None:
                return df.select(*self._select_plain(now_col))
            return df.select(*[F.col(n).alias(_s(n)) for n in sc.stream_names])
        rng, slide = self.window  # type: ignore[misc]
        df = df.withColumn(TS, F.timestamp_seconds(F.col(self.time_column)))
        if watermark is not None:
            df = df.withWatermark(TS, watermark)
        win = F.window(TS, _duration(rng), _duration(slide)).alias("__w")
        if self.table is None:
            keys = [
                _compile(k, lambda n: _stream_leaf(n, sc, now_col)).alias(f"__k{i}")
                for i, k in enumerate(self.query.group_by)
            ]
        else:
            keys = [F.col(n).alias(_s(n)) for n in self._needed]
        args = {
            f"__v{j}": _compile(a, lambda n: _stream_leaf(n, sc, now_col))
            for j, a in enumerate(self._args)
        }
        states = []
        for j in range(len(self._args)):
            v = F.col(f"__v{j}")
            states += [
                F.count(v).alias(f"__c{j}"),
                F.sum(v).alias(f"__s{j}"),
                F.min(v).alias(f"__m{j}"),
                F.max(v).alias(f"__x{j}"),
            ]
        df = df.select(
            TS, *[F.col(n) for n in sc.stream_names], *[c.alias(k) for k, c in args.items()]
        )
        out = df.groupBy(win, *keys).agg(F.count(F.lit(1)).alias("__rows"), *states)
        return out.select(
            (F.unix_micros(F.col("__w.start")) / 1e6).alias(WS),
            (F.unix_micros(F.col("__w.end")) / 1e6).alias(WE),
            *[c for c in out.columns if c != "__w"],
        )

    # -- stage B -----------------------------------------------------------------------------

    def finish(self, partials: DataFrame, table: DataFrame | None = None) -> DataFrame:
        """Join, regroup, HAVING and SELECT over stage A's output (a batch DataFrame)."""
        from pyspark.sql import functions as F

        if self.table is not None:
            if table is None:
                raise QueryError(f"query joins table {self.table!r}: pass its DataFrame")
            partials = self._join_table(partials, table)
        if not self.windowed:
            if self.table is None:
                return partials
            return partials.select(*self._select_joined())
        if self.table is not None:
            sc = self._scope
            keys = [
                _compile(k, lambda n: _joined_leaf(n, sc, F.col(WE))).alias(f"__k{i}")
                for i, k in enumerate(self.query.group_by)
            ]
            merged = []
            for j in range(len(self._args)):
                merged += [
                    F.sum(f"__c{j}").alias(f"__c{j}"),
                    F.sum(f"__s{j}").alias(f"__s{j}"),
                    F.min(f"__m{j}").alias(f"__m{j}"),
                    F.max(f"__x{j}").alias(f"__x{j}"),
                ]
            partials = partials.groupBy(WS, WE, *keys).agg(F.sum("__rows").alias("__rows"), *merged)
        return self._finalize(partials)

    # -- helpers -----------------------------------------------------------------------------

    def _join_table(self, left: DataFrame, table: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        sc = self._scope
        right = table.select(*[F.col(n).alias(_t(n)) for n in sc.table_names])
        if self._join:
            cond = None
            for s_name, t_name in self._join:
                c = F.col(_s(s_name)) == F.col(_t(t_name))
                cond = c if cond is None else cond & c
            joined = left.join(F.broadcast(right), on=cond, how="inner")
        else:
            joined = left.crossJoin(F.broadcast(right))
        now = F.col(WE) if self.windowed else F.col(_s(self.time_column))
        for cond in self._post:
            joined = joined.where(_compile(cond, lambda n: _joined_leaf(n, sc, now)))
        return joined

    def _select_plain(self, now_col: Column) -> list[Column]:
        from pyspark.sql import functions as F

        sc = self._scope
        out: list[Column] = []
        for n, item in enumerate(self.query.select):
            if isinstance(item, ast.Star):
                out += [F.col(c) for c in sc.stream_names]
                continue
            expr = _compile(item.expr, lambda x: _stream_leaf(x, sc, now_col))
            out.append(expr.alias(_name(item, n)))
        return out

    def _select_joined(self) -> list[Column]:
        from pyspark.sql import functions as F

        sc = self._scope
        now = F.col(_s(self.time_column))
        out: list[Column] = []
        for n, item in enumerate(self.query.select):
            if isinstance(item, ast.Star):
                if item.table in (None, sc.stream_alias):
                    out += [F.col(_s(c)).alias(c) for c in sc.stream_names]
                if item.table in (None, sc.table_alias):
                    out += [F.col(_t(c)).alias(c) for c in sc.table_names]
                continue
            expr = _compile(item.expr, lambda x: _joined_leaf(x, sc, now))
            out.append(expr.alias(_name(item, n)))
        return out

    def _finalize(self, grouped: DataFrame) -> DataFrame:
        from pyspark.sql import functions as F

        sc = self._scope
        values: dict[ast.Aggregate, Column] = {}
        for a in self._aggs:
            if a.arg is None:
                values[a] = F.col("__rows")
                continue
            j = self._args.index(a.arg)
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
        group_by = list(self.query.group_by)
        key_refs = [sc.resolve(k) if isinstance(k, ast.Column) else None for k in group_by]

        def leaf(node: ast.Expr) -> Column | None:
            if isinstance(node, ast.Aggregate):
                return values[node]
            if isinstance(node, ast.Now):
                return F.col(WE)
            if isinstance(node, ast.Column):
                if node.table is None and node.name in WINDOW_COLUMNS and not sc.known(node):
                    return F.col(WS if node.name == "window_start" else WE)
                ref = sc.resolve(node)
                if ref in key_refs:
                    return F.col(f"__k{key_refs.index(ref)}")
                raise QueryError(
                    f"column {node.name!r} must appear in GROUP BY or inside an aggregate"
                )
            for i, k in enumerate(group_by):
                if k == node:
                    return F.col(f"__k{i}")
            return None

        if self.query.having is not None:
            grouped = grouped.where(_compile(self.query.having, leaf))
        items = [
            _compile(item.expr, leaf).alias(name)  # type: ignore[union-attr]
            for item, name in zip(self.query.select, self.columns, strict=False)
        ]
        extra = [
            F.col(WS if c == "window_start" else WE).alias(c) for c in self.columns[len(items) :]
        ]
        return grouped.select(*items, *extra)


# -- compile -----------------------------------------------------------------------------------


def compile_query(
    sql: str | ast.Query,
    streams: Mapping[str, Schema],
    tables: Mapping[str, Schema] | None = None,
) -> SparkQuery:
    """Validate `sql` with the Fjord planner, then check and translate it for Spark.

    `streams` and `tables` give the schemas (Fjord types: int, float, str, bool) by name; a
    stream's schema must name its time column. Raises QueryError (SparkUnsupportedError for
    constructs Spark cannot run) with a message naming the problem.
    """
    query = parse(sql) if isinstance(sql, str) else sql
    tables = dict(tables or {})
    used_streams = [r for r in query.sources if r.name in streams]
    if len(used_streams) > 1:
        raise SparkUnsupportedError(
            "joins of two streams are not supported on Spark "
            f"({', '.join(r.name for r in used_streams)}); join a stream with static tables",
            used_streams[1].pos,
        )
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
    # The Fjord's checks, names and errors first, so both engines refuse alike; then Spark's own.
    plan = plan_query(query, catalog, queue_bound=16)
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
    scope = _Scope(query, streams, tables)
    if scope.time_column is None:
        raise SparkUnsupportedError(f"stream {scope.stream!r} has no time column")
    aggs = collect_aggregates(query)
    windowed = plan.windowed
    window = None
    if windowed:
        w = scope.window
        assert w is not None and w.range_s is not None
        slide = w.slide_s if w.slide_s is not None else query.emit_every_s
        window = (w.range_s, w.range_s if slide is None else slide)
        for secs in window:
            if abs(secs * 1e6 - round(secs * 1e6)) > 1e-3:
                raise SparkUnsupportedError(
                    f"window durations must be whole microseconds on Spark, got {secs} s"
                )
    where = [_coerce(c, scope) for c in conjuncts(query.where)]
    stream_only = [c for c in where if scope.sides(c) <= {"s"}]
    others = [c for c in where if not scope.sides(c) <= {"s"}]
    join: list[tuple[str, str]] = []
    post: list[ast.Expr] = []
    if scope.table is None:
        pre = stream_only + others  # NOW here is the sample's time, as in the Fjord
    else:
        pre = stream_only
        for e in others:
            if isinstance(e, ast.Compare) and e.op == "=":
                a, b = e.left, e.right
                if isinstance(a, ast.Column) and isinstance(b, ast.Column):
                    ra, rb = scope.resolve(a), scope.resolve(b)
                    if {ra[0], rb[0]} == {"s", "t"}:
                        sa, tb = (ra, rb) if ra[0] == "s" else (rb, ra)
                        join.append((sa[1], tb[1]))
                        continue
            post.append(e)
    for a in aggs:
        if a.arg is not None and "t" in scope.sides(a.arg):
            raise QueryError("aggregates over static-table columns are not supported")
    args: list[ast.Expr] = []
    for a in aggs:
        if a.arg is not None and a.arg not in args:
            args.append(a.arg)
    needed: list[str] = []
    if windowed and scope.table is not None:
        exprs: list[ast.Expr] = [*query.group_by, *post]
        exprs += [i.expr for i in query.select if isinstance(i, ast.SelectItem)]
        if query.having is not None:
            exprs.append(query.having)
        for e in exprs:
            for node in _walk_outside_aggregates(e):
                if isinstance(node, ast.Column) and scope.known(node):
                    side, name = scope.resolve(node)
                    if side == "s" and name not in needed:
                        needed.append(name)
        for s_name, _ in join:
            if s_name not in needed:
                needed.append(s_name)
    return SparkQuery(
        sql=sql if isinstance(sql, str) else None,
        query=query,
        stream=scope.stream,
        columns=tuple(plan.columns),
        window=window,
        table=scope.table,
        time_column=scope.time_column,
        _scope=scope,
        _pre=pre,
        _post=post,
        _join=join,
        _needed=needed,
        _aggs=aggs,
        _args=args,
    )


class _Scope:
    """Name resolution over one stream and at most one table: ('s'|'t', column name)."""

    def __init__(
        self, query: ast.Query, streams: Mapping[str, Schema], tables: Mapping[str, Schema]
    ) -> None:
        self.table: str | None = None
        self.table_alias = ""
        self.table_schema: Schema | None = None
        for ref in query.sources:
            if ref.name in streams:
                self.stream, self.stream_alias = ref.name, ref.alias or ref.name
                self.schema, self.window = streams[ref.name], ref.window
            else:
                self.table, self.table_alias = ref.name, ref.alias or ref.name
                self.table_schema = tables[ref.name]
        self.time_column = self.schema.time
        self.stream_names = list(self.schema.names)
        self.table_names = list(self.table_schema.names) if self.table_schema else []

    def resolve(self, col: ast.Column) -> tuple[str, str]:
        # The Fjord planner has already rejected unknown and ambiguous names.
        if col.table is not None:
            return ("s", col.name) if col.table == self.stream_alias else ("t", col.name)
        return ("s", col.name) if col.name in self.schema else ("t", col.name)

    def known(self, col: ast.Column) -> bool:
        if col.table is not None:
            return True
        ts = self.table_schema
        return col.name in self.schema or (ts is not None and col.name in ts)

    def type_of(self, col: ast.Column) -> str:
        side, name = self.resolve(col)
        schema = self.schema if side == "s" else self.table_schema
        assert schema is not None
        return schema.type_of(name)

    def sides(self, expr: ast.Expr) -> set[str]:
        out = set()
        for node in walk(expr):
            if isinstance(node, ast.Column) and self.known(node):
                out.add(self.resolve(node)[0])
            elif isinstance(node, ast.Now):
                out.add("now")
        return out


def _walk_outside_aggregates(expr: ast.Expr):  # noqa: ANN202 - generator of nodes
    if isinstance(expr, ast.Aggregate):
        return
    yield expr
    from fjords.expressions import children

    for c in children(expr):
        yield from _walk_outside_aggregates(c)


def _coerce(expr: ast.Expr, scope: _Scope) -> ast.Expr:
    return coerce_literals(expr, lambda col: scope.type_of(col) if scope.known(col) else None)


def _name(item: ast.SelectItem, n: int) -> str:
    # The Fjord planner's naming (fjords.planner._output_name); its columns are the reference.
    if item.alias:
        return item.alias
    e = item.expr
    if isinstance(e, ast.Column):
        return e.name
    if isinstance(e, ast.Aggregate):
        if e.arg is None:
            return e.func.lower()
        if isinstance(e.arg, ast.Column):
            return f"{e.func.lower()}_{e.arg.name}"
    return f"col{n}"


def _duration(seconds: float) -> str:
    return f"{round(seconds * 1e6)} microseconds"


def _stream_leaf(node: ast.Expr, sc: _Scope, now: Column) -> Column | None:
    from pyspark.sql import functions as F

    if isinstance(node, ast.Column):
        return F.col(sc.resolve(node)[1])
    if isinstance(node, ast.Now):
        return now
    return None


def _joined_leaf(node: ast.Expr, sc: _Scope, now: Column) -> Column | None:
    from pyspark.sql import functions as F

    if isinstance(node, ast.Column):
        if node.table is None and node.name in WINDOW_COLUMNS and not sc.known(node):
            return F.col(WS if node.name == "window_start" else WE)
        side, name = sc.resolve(node)
        return F.col(_s(name) if side == "s" else _t(name))
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
    "SparkUnsupportedError",
    "compile_query",
    "fjord_schema",
    "spark_schema",
    "spark_type",
]
