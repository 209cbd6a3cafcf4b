"""Turn a parsed query into operators folded into the running Fjord (paper section 3.3).

The query's simple filters on its sensor stream go into that stream's shared router (predicate
index); what remains is the query's own short pipeline:

  filter/project        router -> [Project] -> Sink
  windowed aggregate    router -> WindowAggregate -> Sink
  stream x table        router -> IndexJoin(<- PullQueue <- TableScan) -> [Project] -> Sink
  windowed agg x table  router -> WindowAggregate(partial, by join key) -> IndexJoin -> GroupMerge -> Sink

The last shape is how the paper's Query 2 runs: aggregating by the join key before joining keeps
the join to a few partial rows per window, and the partials regroup exactly (COUNT, SUM, AVG, MIN
and MAX all merge). NOW in a windowed query is the end of the window being emitted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fjords.catalog import Catalog, StreamInfo
from fjords.errors import ClauseError, QueryError, QueryPlanError, UnknownNameError
from fjords.expressions import (
    as_predicate,
    children,
    coerce_literals,
    compile_expr,
    conjuncts,
    walk,
)
from fjords.limits import DEFAULT_LIMITS, Limits
from fjords.operators.aggregate import AggSpec, Finish, GroupMerge, WindowAggregate
from fjords.operators.base import Operator
from fjords.operators.joins import IndexJoin
from fjords.operators.scan import TableScan
from fjords.operators.simple import Project
from fjords.operators.sink import Sink
from fjords.predicate_index import Atom
from fjords.queues import PullQueue, PushQueue
from fjords.schema import Schema
from fjords.sql import ast
from fjords.sqltext import expr as sql_text
from fjords.tables import Table
from fjords.typecheck import TypeChecker

WINDOW_COLUMNS = ("window_start", "window_end")
MAX_DURATION_S = 1e12  # about 31,700 years: past it, milliseconds stop being exact integers


@dataclass
class Demand:
    """What a query needs from its sensors: the proxies turn this into programs and sample rates."""

    stream: str
    sample_period_s: float | None
    lifetime_s: float | None
    fields: tuple[str, ...]
    atoms: tuple[tuple[str, str, object], ...]  # (field, op, constant) every result satisfies
    filtered_only_by_atoms: bool  # no other condition on the stream (a pushed-down filter is exact)
    aggregates: tuple[tuple[str, str | None], ...]  # (func, field or None for COUNT(*))
    window: tuple[float, float] | None  # (range_s, slide_s) of a time window
    group_by: tuple[str, ...]


@dataclass
class Plan:
    stream: str
    columns: tuple[str, ...]
    operators: list[Operator]
    sink: Sink
    atoms: list[Atom]
    residual: Callable[[tuple], bool] | None
    target: PushQueue
    needs_progress: bool
    demand: Demand
    shape: str
    windowed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class _Scope:
    """Name resolution over the query's sources."""

    def __init__(self, query: ast.Query, catalog: Catalog) -> None:
        self.stream: StreamInfo | None = None
        self.stream_alias = ""
        self.window: ast.Window | None = None
        self.tables: list[tuple[str, Table]] = []
        for ref in query.sources:
            if ref.name not in catalog.streams and ref.name not in catalog.tables:
                known = sorted([*catalog.streams, *catalog.tables])
                raise UnknownNameError("stream or table", ref.name, known, ref.pos)
            obj = catalog.lookup(ref.name)
            alias = ref.alias or ref.name
            if isinstance(obj, StreamInfo):
                if self.stream is not None:
                    raise QueryError(
                        f"joining two streams ({self.stream.name}, {obj.name}) is not supported in SQL; "
                        "use the ZipperJoin or SymmetricHashJoin operator"
                    )
                self.stream, self.stream_alias, self.window = obj, alias, ref.window
            else:
                if ref.window is not None:
                    raise ClauseError(
                        f"a window applies to a stream; {ref.name!r} is a static table",
                        ref.window.pos,
                    )
                self.tables.append((alias, obj))
        if self.stream is None:
            raise QueryError("a continuous query needs a sensor stream in FROM")
        if len(self.tables) > 1:
            raise QueryError("joining more than one static table per query is not supported yet")
        self.table_alias, self.table = self.tables[0] if self.tables else ("", None)

    @property
    def schema(self) -> Schema:
        assert self.stream is not None
        return self.stream.schema

    def resolve(self, col: ast.Column) -> tuple[str, int]:
        """('s', index) for a stream column, ('t', index) for a table column."""
        s = self.schema
        if col.table is not None:
            if col.table == self.stream_alias:
                if col.name not in s:
                    raise UnknownNameError(
                        "column", col.name, s.names, col.pos, f" in stream {self.stream_alias!r}"
                    )
                return ("s", s.index(col.name))
            if self.table is not None and col.table == self.table_alias:
                ts = self.table.schema
                if col.name not in ts:
                    raise UnknownNameError(
                        "column", col.name, ts.names, col.pos, f" in table {self.table_alias!r}"
                    )
                return ("t", ts.index(col.name))
            raise UnknownNameError(
                "table or alias", col.table, self.aliases, col.pos, f" in {col.table}.{col.name}"
            )
        in_s = col.name in s
        in_t = self.table is not None and col.name in self.table.schema
        if in_s and in_t:
            raise QueryPlanError(
                f"column {col.name!r} is ambiguous: qualify it with {self.stream_alias!r} or {self.table_alias!r}",
                *(col.pos or (None, None)),
            )
        if in_s:
            return ("s", s.index(col.name))
        if in_t:
            return ("t", self.table.schema.index(col.name))  # type: ignore[union-attr]
        raise UnknownNameError("column", col.name, self.column_names, col.pos)

    @property
    def aliases(self) -> list[str]:
        return [a for a in (self.stream_alias, self.table_alias) if a]

    @property
    def column_names(self) -> list[str]:
        """Every column a bare name can mean, stream first, each once."""
        names = list(self.schema.names)
        if self.table is not None:
            names += [n for n in self.table.schema.names if n not in names]
        return names

    def type_of(self, ref: tuple[str, int]) -> str:
        side, i = ref
        schema = self.schema if side == "s" else self.table.schema  # type: ignore[union-attr]
        return schema.fields[i].type

    def name_of(self, ref: tuple[str, int]) -> str:
        side, i = ref
        schema = self.schema if side == "s" else self.table.schema  # type: ignore[union-attr]
        return schema.names[i]

    def sides(self, expr: ast.Expr) -> set[str]:
        out = set()
        for node in walk(expr):
            if isinstance(node, ast.Column):
                out.add(self.resolve(node)[0])
            elif isinstance(node, ast.Now):
                out.add("now")
        return out


def plan_query(
    query: ast.Query,
    catalog: Catalog,
    *,
    queue_bound: int,
    start_time: float = -math.inf,
    limits: Limits = DEFAULT_LIMITS,
) -> Plan:
    """Plan without side effects: nothing is installed until the Fjord adds the plan."""
    scope = _Scope(query, catalog)
    _check_columns(query, scope)
    _check_in_lists(query, limits)
    aggs = collect_aggregates(query)
    for a in aggs:
        if a.func in ("SUM", "AVG") and isinstance(a.arg, ast.Column):
            if scope.type_of(scope.resolve(a.arg)) in ("str", "bool"):
                raise QueryError(
                    f"{a.func}({a.arg.name}) needs numbers; {a.arg.name} is text (COUNT, MIN and MAX work on text)"
                )
    windowed = bool(aggs or query.group_by)
    check_clauses(query, windowed, scope.window)
    _check_options(query)
    where = [_coerce(c, scope) for c in conjuncts(query.where)]
    _type_check(query, scope, where)
    if scope.window is not None:
        _window(scope.window, query.emit_every_s, limits)
    stream_only = [c for c in where if scope.sides(c) <= {"s"}]
    others = [c for c in where if not scope.sides(c) <= {"s"}]
    if scope.table is None and any("t" in scope.sides(c) for c in others):
        raise QueryError("condition refers to an unknown table")
    atoms, residual_exprs = _split_atoms(stream_only, scope)
    s = scope.schema
    stream_resolver = _stream_resolver(scope, now_index=s.time_index)
    if others and scope.table is None:
        # Stream-only conditions involving NOW (the sample time here) are simply residual.
        residual_exprs, others = residual_exprs + others, []
    residual = _all_of([as_predicate(compile_expr(e, stream_resolver)) for e in residual_exprs])

    target = PushQueue(queue_bound, name="query-input")
    sink_q = PushQueue(queue_bound, name="results")
    sink = Sink(sink_q, name="sink")
    demand = _demand(query, scope, atoms, residual_exprs, others, aggs)

    if windowed:
        if scope.window is None:
            raise QueryError(
                "aggregates over a stream need a window: add [RANGE 15 MINUTES] or [ROWS 100] after the stream"
            )
        rng, slide, rows = _window(scope.window, query.emit_every_s, limits)
        if scope.table is None:
            agg_op, finish, columns = _plan_aggregate(
                query, scope, aggs, target, rng, slide, rows, start_time, queue_bound, sink_q
            )
            agg_op.limits = limits
            ops: list[Operator] = [finish, sink]
            shape = "windowed aggregate"
            # Queries with the same filter, groups, aggregates and window share one aggregate.
            extra = {
                "aggregate": agg_op,
                "finish_input": finish.inputs[0],
                "share_key": (
                    s_name(scope),
                    tuple(sorted(_canonical(c, scope) for c in where)),
                    tuple(
                        repr(scope.resolve(g)) if isinstance(g, ast.Column) else repr(g)
                        for g in query.group_by
                    ),
                    tuple(repr(_resolved(a, scope)) for a in aggs),
                    (rng, slide, rows),
                ),
            }
        else:
            extra = {}
            ops, columns = _plan_aggregate_join(
                query,
                scope,
                aggs,
                others,
                target,
                sink_q,
                rng,
                slide,
                rows,
                start_time,
                queue_bound,
            )
            ops[0].limits = limits  # the partial WindowAggregate
            ops.append(sink)
            shape = "windowed aggregate joined with a static table"
        return Plan(
            s_name(scope),
            columns,
            ops,
            sink,
            atoms,
            residual,
            target,
            True,
            demand,
            shape,
            windowed=True,
            extra=extra,
        )

    if scope.table is not None:
        ops, columns = _plan_join(query, scope, others, target, sink_q, queue_bound)
        ops.append(sink)
        return Plan(
            s_name(scope),
            columns,
            ops,
            sink,
            atoms,
            residual,
            target,
            False,
            demand,
            "stream joined with a static table",
        )

    columns, projection = _select_list(query, scope, stream_resolver, s)
    if projection is None:
        # SELECT *: the router delivers straight to the sink; nothing is copied.
        return Plan(
            s_name(scope), columns, [sink], sink, atoms, residual, sink_q, False, demand, "filter"
        )
    fns, positions = projection
    proj = Project(fns, target, sink_q, positions=positions, name="project")
    return Plan(
        s_name(scope),
        columns,
        [proj, sink],
        sink,
        atoms,
        residual,
        target,
        False,
        demand,
        "filter + project",
    )


def _all_of(preds: list[Callable[[tuple], bool]]) -> Callable[[tuple], bool] | None:
    """One predicate for a conjunction (None when there is nothing to check)."""
    if not preds:
        return None
    if len(preds) == 1:
        return preds[0]
    ps = tuple(preds)
    return lambda t: all(p(t) for p in ps)


def _type_check(query: ast.Query, scope: _Scope, where: list[ast.Expr]) -> None:
    """Every expression typed from the schemas (fjords.typecheck), WHERE after literal casts."""

    def column_type(col: ast.Column) -> str:
        if col.table is None and col.name in WINDOW_COLUMNS:
            try:
                return scope.type_of(scope.resolve(col))
            except QueryError:
                return "float"
        return scope.type_of(scope.resolve(col))

    TypeChecker(column_type).check_query(
        [i.expr for i in query.select if isinstance(i, ast.SelectItem)],
        where,
        query.group_by,
        query.having,
    )


def _duration_text(seconds: float) -> str:
    for unit, size in (("DAY", 86400.0), ("HOUR", 3600.0), ("MINUTE", 60.0), ("SECOND", 1.0)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"{n} {unit}{'S' if n != 1 else ''}"
    return f"{seconds:g} SECONDS"


def check_clauses(query: ast.Query, windowed: bool, window: ast.Window | None) -> None:
    """Every clause must change the result or be refused: a clause that would be silently
    ignored (HAVING without groups, a window or EMIT EVERY on a query without aggregates) or
    would silently skip samples (a SLIDE longer than the RANGE) is an error at the clause.
    Shared by both engines (the Spark compiler plans with the Fjord planner first)."""
    if query.having is not None and not windowed:
        raise ClauseError(
            "HAVING filters groups, but this query has no GROUP BY and no aggregate; "
            "use WHERE to filter rows",
            query.pos_of("HAVING"),
        )
    if query.emit_every_s is not None:
        if not windowed:
            raise ClauseError(
                "EMIT EVERY sets how often an aggregate's window is output, but this query has "
                "no aggregate or GROUP BY: each row is output as it arrives; remove EMIT EVERY",
                query.pos_of("EMIT EVERY"),
            )
        if window is None:
            raise ClauseError(
                "EMIT EVERY needs a window on the stream, e.g. [RANGE 15 MINUTES]",
                query.pos_of("EMIT EVERY"),
            )
        if window.rows is not None:
            raise ClauseError(
                "EMIT EVERY applies to time windows; use [ROWS n SLIDE m]",
                query.pos_of("EMIT EVERY"),
            )
    if window is None:
        return
    if not windowed:
        shown = (
            f"[ROWS {window.rows}]"
            if window.rows is not None
            else f"[RANGE {_duration_text(window.range_s or 0.0)}]"
        )
        raise ClauseError(
            f"the window {shown} changes nothing: this query has no aggregate or GROUP BY, so "
            "each row is output as it arrives; remove the window, or aggregate over it "
            "(e.g. SELECT station, AVG(speed) ... GROUP BY station)",
            window.pos,
        )
    if window.rows is not None:
        if window.rows_slide is not None and window.rows_slide > window.rows:
            raise ClauseError(
                f"SLIDE {window.rows_slide} is larger than ROWS {window.rows}: the rows between "
                "windows would be ignored; use a SLIDE of at most the window size",
                window.pos,
            )
        return
    rng = window.range_s
    slide, what, pos = window.slide_s, "SLIDE", window.pos
    if query.emit_every_s is not None and slide is None:
        slide, what, pos = query.emit_every_s, "EMIT EVERY", query.pos_of("EMIT EVERY")
    if rng is not None and slide is not None and slide > rng:
        raise ClauseError(
            f"{what} {_duration_text(slide)} is longer than RANGE {_duration_text(rng)}: the "
            f"samples between windows would be ignored; use a {what} of at most the RANGE, "
            "or a longer RANGE",
            pos,
        )


def _check_options(query: ast.Query) -> None:
    """SAMPLE PERIOD and LIFETIME reach the proxies' cost model: positive, finite, sane."""
    for name, seconds, least in (
        ("SAMPLE PERIOD", query.sample_period_s, 0.001),
        ("LIFETIME", query.lifetime_s, 1.0),
    ):
        if seconds is None:
            continue
        if seconds < least:
            raise ClauseError(
                f"{name} must be at least {least:g} seconds (got {seconds:g})", query.pos_of(name)
            )
        if seconds > MAX_DURATION_S:
            raise ClauseError(
                f"{name} {seconds:g} seconds is too large (at most {MAX_DURATION_S:g})",
                query.pos_of(name),
            )


def _check_in_lists(query: ast.Query, limits: Limits) -> None:
    exprs = [i.expr for i in query.select if isinstance(i, ast.SelectItem)]
    exprs += [e for e in (query.where, query.having) if e is not None]
    for e in exprs:
        for node in walk(e):
            if isinstance(node, ast.InList):
                limits.check("max_in_list", len(node.values), "IN list length")


def s_name(scope: _Scope) -> str:
    assert scope.stream is not None
    return scope.stream.name


# -- helpers -------------------------------------------------------------------------------


def _check_columns(query: ast.Query, scope: _Scope) -> None:
    exprs: list[ast.Expr] = [i.expr for i in query.select if isinstance(i, ast.SelectItem)]
    exprs += list(query.group_by)
    for e in [*exprs, query.where, query.having]:
        if e is None:
            continue
        for node in walk(e):
            if isinstance(node, ast.Column) and not (
                node.table is None and node.name in WINDOW_COLUMNS
            ):
                scope.resolve(node)
    for item in query.select:
        if isinstance(item, ast.Star) and item.table not in (
            None,
            scope.stream_alias,
            scope.table_alias,
        ):
            raise QueryError(f"unknown table or alias {item.table!r} in {item.table}.*")
    if query.where is not None:
        for n in walk(query.where):
            if isinstance(n, ast.Aggregate):
                raise QueryPlanError(
                    "aggregates are not allowed in WHERE; use HAVING", *(n.pos or (None, None))
                )


def collect_aggregates(query: ast.Query) -> list[ast.Aggregate]:
    """The distinct aggregate calls of SELECT and HAVING (shared by both engines)."""
    found: list[ast.Aggregate] = []
    exprs = [i.expr for i in query.select if isinstance(i, ast.SelectItem)]
    if query.having is not None:
        exprs.append(query.having)
    for e in exprs:
        for node in walk(e):
            if isinstance(node, ast.Aggregate) and node not in found:
                if node.arg is not None and any(
                    isinstance(n, ast.Aggregate) for n in walk(node.arg)
                ):
                    raise QueryError("aggregates cannot be nested")
                found.append(node)
    return found


def _coerce(expr: ast.Expr, scope: _Scope) -> ast.Expr:
    def column_type(col: ast.Column) -> str | None:
        if col.table is None and col.name in WINDOW_COLUMNS:
            return None
        return scope.type_of(scope.resolve(col))

    return coerce_literals(expr, column_type)


_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "="}


def _split_atoms(exprs: list[ast.Expr], scope: _Scope) -> tuple[list[Atom], list[ast.Expr]]:
    atoms: list[Atom] = []
    rest: list[ast.Expr] = []
    for e in exprs:
        match e:
            case ast.Compare(op=op, left=ast.Column() as c, right=ast.Literal(value=v)) if (
                op in _FLIP and v is not None
            ):
                atoms.append(Atom(scope.resolve(c)[1], op, v))
            case ast.Compare(op=op, left=ast.Literal(value=v), right=ast.Column() as c) if (
                op in _FLIP and v is not None
            ):
                atoms.append(Atom(scope.resolve(c)[1], _FLIP[op], v))
            case ast.InList(expr=ast.Column() as c, values=vals, negated=False) if all(
                isinstance(x, ast.Literal) and x.value is not None for x in vals
            ):
                atoms.append(Atom(scope.resolve(c)[1], "in", frozenset(x.value for x in vals)))  # type: ignore[union-attr]
            case ast.Between(
                expr=ast.Column() as c,
                low=ast.Literal(value=lo),
                high=ast.Literal(value=hi),
                negated=False,
            ) if lo is not None and hi is not None:
                i = scope.resolve(c)[1]
                atoms += [Atom(i, ">=", lo), Atom(i, "<=", hi)]
            case _:
                rest.append(e)
    return atoms, rest


def _stream_resolver(scope: _Scope, now_index: int | None) -> Callable[[ast.Expr], Any]:
    def resolve(node: ast.Expr) -> Any:
        if isinstance(node, ast.Column):
            side, i = scope.resolve(node)
            if side != "s":
                raise QueryError(f"column {node.name!r} of a table is not available here")
            return i
        if isinstance(node, ast.Now):
            if now_index is None:
                raise QueryError("NOW needs a stream with a time column")
            return now_index
        return None

    return resolve


def _output_name(item: ast.SelectItem, n: int) -> str:
    if item.alias:
        return item.alias
    e = item.expr
    if isinstance(e, ast.Column):
        return e.name
    if isinstance(e, ast.Aggregate):
        if e.arg is None:
            return f"{e.func.lower()}"
        if isinstance(e.arg, ast.Column):
            return f"{e.func.lower()}_{e.arg.name}"
    return f"col{n}"


def _select_list(
    query: ast.Query, scope: _Scope, resolver: Callable, schema: Schema
) -> tuple[tuple[str, ...], tuple[list, list[int] | None] | None]:
    """Result names and (column functions, their positions when all are plain columns)."""
    items = query.select
    if (
        len(items) == 1
        and isinstance(items[0], ast.Star)
        and items[0].table in (None, scope.stream_alias)
    ):
        return schema.names, None
    names: list[str] = []
    fns: list[Callable] = []
    positions: list[int | None] = []
    for n, item in enumerate(items):
        if isinstance(item, ast.Star):
            for i, name in enumerate(schema.names):
                names.append(name)
                fns.append(lambda t, i=i: t[i])
                positions.append(i)
            continue
        names.append(_output_name(item, n))
        fns.append(compile_expr(item.expr, resolver))
        hit = resolver(item.expr) if isinstance(item.expr, ast.Column) else None
        positions.append(hit if isinstance(hit, int) else None)
    _check_unique(names)
    plain = None if any(p is None for p in positions) else [p for p in positions if p is not None]
    return tuple(names), (fns, plain)


def _check_unique(names: list[str]) -> None:
    seen = set()
    for n in names:
        if n in seen:
            raise QueryError(f"two result columns are named {n!r}; give one an alias with AS")
        seen.add(n)


def _window(
    w: ast.Window, emit_every: float | None, limits: Limits = DEFAULT_LIMITS
) -> tuple[float, float, bool]:
    if w.rows is not None:
        if emit_every is not None:
            raise QueryError("EMIT EVERY applies to time windows; use [ROWS n SLIDE m]")
        if w.rows < 1 or (w.rows_slide is not None and w.rows_slide < 1):
            raise QueryError("ROWS windows need positive sizes")
        limits.check("max_rows_window", w.rows, "ROWS window size")
        step = w.rows_slide or w.rows
        limits.check("max_windows_per_pane", -(-w.rows // step), "ROWS windows holding each row")
        return float(w.rows), float(step), True
    range_s, slide = _time_window(w, emit_every)
    for name, seconds in (("RANGE", range_s), ("SLIDE", slide)):
        if seconds > MAX_DURATION_S:
            raise QueryError(
                f"{name} {seconds:g} seconds is too large (at most {MAX_DURATION_S:g})"
            )
    range_ms, slide_ms = round(range_s * 1000), round(slide * 1000)
    if range_ms < 1:
        raise QueryError(f"RANGE must be at least 1 millisecond (got {range_s:g} seconds)")
    if slide_ms < 1:
        raise QueryError(f"SLIDE must be at least 1 millisecond (got {slide:g} seconds)")
    pane = math.gcd(range_ms, slide_ms)
    limits.check(
        "max_panes_per_window",
        range_ms // pane,
        f"RANGE {range_s:g} s with SLIDE {slide:g} s cuts each window into panes",
    )
    limits.check(
        "max_windows_per_pane",
        -(-range_ms // slide_ms),
        f"RANGE {range_s:g} s with SLIDE {slide:g} s: windows holding each sample",
    )
    return range_s, slide, False


def _time_window(w: ast.Window, emit_every: float | None) -> tuple[float, float]:
    if w.range_s is None or w.range_s <= 0:
        raise QueryError("a window needs a positive RANGE")
    slide = w.slide_s
    if emit_every is not None:
        if slide is not None:
            raise QueryError(
                "give either SLIDE or EMIT EVERY, not both (EMIT EVERY sets how often the window is output)"
            )
        slide = emit_every
    slide = w.range_s if slide is None else slide
    if slide <= 0:
        raise QueryError("SLIDE must be positive")
    if not (math.isfinite(w.range_s) and math.isfinite(slide)):
        raise QueryError("RANGE and SLIDE must be finite durations")
    return w.range_s, slide


class _AggContext:
    """Compiles the SELECT list and HAVING over a finished group row: keys + aggregates + (ws, we)."""

    def __init__(
        self, query: ast.Query, scope: _Scope, aggs: list[ast.Aggregate], key_exprs: list[ast.Expr]
    ) -> None:
        self.scope = scope
        self.aggs = aggs
        self.key_exprs = key_exprs
        self.key_refs = [scope.resolve(k) if isinstance(k, ast.Column) else None for k in key_exprs]
        self.nk = len(key_exprs)
        self.na = len(aggs)

    def resolve(self, node: ast.Expr) -> Any:
        ws, we = self.nk + self.na, self.nk + self.na + 1
        if isinstance(node, ast.Aggregate):
            return self.nk + self.aggs.index(node)
        if isinstance(node, ast.Now):
            return we
        if isinstance(node, ast.Column):
            if (
                node.table is None
                and node.name in WINDOW_COLUMNS
                and not self._is_real_column(node)
            ):
                return ws if node.name == "window_start" else we
            ref = self.scope.resolve(node)
            if ref in self.key_refs:
                return self.key_refs.index(ref)
            raise QueryPlanError(
                f"column {node.name!r} must appear in GROUP BY or inside an aggregate",
                *(node.pos or (None, None)),
            )
        for i, k in enumerate(self.key_exprs):
            if k == node:
                return i
        return None

    def _is_real_column(self, node: ast.Column) -> bool:
        try:
            self.scope.resolve(node)
            return True
        except QueryError:
            return False

    def finalize(self, query: ast.Query) -> tuple[tuple[str, ...], Callable[[tuple], tuple | None]]:
        names: list[str] = []
        fns: list[Callable] = []
        for n, item in enumerate(query.select):
            if isinstance(item, ast.Star):
                raise QueryError(
                    "SELECT * cannot be combined with GROUP BY or aggregates; name the columns"
                )
            names.append(_output_name(item, n))
            fns.append(compile_expr(item.expr, self.resolve))
        _check_unique(names)
        ws, we = self.nk + self.na, self.nk + self.na + 1
        extra = [c for c in WINDOW_COLUMNS if c not in names]
        extra_idx = [ws if c == "window_start" else we for c in extra]
        having = (
            as_predicate(compile_expr(query.having, self.resolve))
            if query.having is not None
            else None
        )
        fns_t = tuple(fns)
        idx_t = tuple(extra_idx)

        def finalize(row: tuple) -> tuple | None:
            if having is not None and not having(row):
                return None
            return tuple(f(row) for f in fns_t) + tuple(row[i] for i in idx_t)

        return (*names, *extra), finalize


def _agg_slots(
    aggs: list[ast.Aggregate], compile_arg: Callable[[ast.Expr], Callable]
) -> tuple[list, list[AggSpec]]:
    args: list[ast.Expr] = []
    specs: list[AggSpec] = []
    for a in aggs:
        if a.arg is None:
            specs.append(AggSpec(a.func, None, sql_text(a)))
            continue
        if a.arg not in args:
            args.append(a.arg)
        specs.append(AggSpec(a.func, args.index(a.arg), sql_text(a)))
    return [compile_arg(a) for a in args], specs


def _key_fn(fns: list[Callable]) -> Callable[[tuple], tuple]:
    if not fns:
        return lambda t: ()
    if len(fns) == 1:
        f = fns[0]
        return lambda t: (f(t),)
    ft = tuple(fns)
    return lambda t: tuple(f(t) for f in ft)


def _plan_aggregate(query, scope, aggs, target, rng, slide, rows, start_time, queue_bound, sink_q):  # noqa: ANN001, ANN202
    """The aggregate (which may be shared) and this query's Finish (HAVING, SELECT)."""
    s = scope.schema
    resolver = _stream_resolver(scope, s.time_index)
    key_exprs = list(query.group_by)
    for k in key_exprs:
        if any(isinstance(n, ast.Aggregate) for n in walk(k)):
            raise QueryError("GROUP BY cannot contain aggregates")
    key_fn = _key_fn([compile_expr(k, resolver) for k in key_exprs])
    arg_fns, specs = _agg_slots(aggs, lambda e: compile_expr(e, resolver))
    ctx = _AggContext(query, scope, aggs, key_exprs)
    columns, finalize = ctx.finalize(query)
    op = WindowAggregate(
        target,
        PushQueue(queue_bound, name="window rows"),
        key_fn=key_fn,
        arg_fns=arg_fns,
        specs=specs,
        time_index=s.time_index,
        range_s=rng,
        slide_s=slide,
        rows=rows,
        start_time=start_time,
        name="window_aggregate",
    )
    finish = Finish(
        PushQueue(queue_bound, name="finish"),
        sink_q,
        finalize=finalize,
        start_time=start_time,
        name="having+select",
    )
    return op, finish, columns


def _canonical(expr: ast.Expr, scope: _Scope) -> str:
    """An expression's text with columns resolved (`t.speed` and `speed` read the same)."""
    if isinstance(expr, ast.Column):
        if expr.table is None and expr.name in WINDOW_COLUMNS:
            return expr.name
        side, i = scope.resolve(expr)
        return f"${side}{i}"
    kids = children(expr)
    if not kids:
        return repr(expr)
    inner = ",".join(_canonical(k, scope) for k in kids)
    # The node's own fields besides its children: an operator, a negation, a function name.
    own = "".join(str(getattr(expr, f, "")) for f in ("op", "negated", "func"))
    return f"{type(expr).__name__}{own}({inner})"


def _resolved(a: ast.Aggregate, scope: _Scope) -> tuple:
    """An aggregate with its column resolved, so `s.speed` and `speed` share."""
    if isinstance(a.arg, ast.Column):
        return (a.func, scope.resolve(a.arg))
    return (a.func, a.arg)


def _join_keys(
    others: list[ast.Expr], scope: _Scope
) -> tuple[list[tuple[str, int]], list[tuple[str, int]], list[ast.Expr]]:
    skeys, tkeys, rest = [], [], []
    for e in others:
        if (
            isinstance(e, ast.Compare)
            and e.op == "="
            and isinstance(e.left, ast.Column)
            and isinstance(e.right, ast.Column)
        ):
            a, b = scope.resolve(e.left), scope.resolve(e.right)
            if {a[0], b[0]} == {"s", "t"}:
                sa, tb = (a, b) if a[0] == "s" else (b, a)
                skeys.append(sa)
                tkeys.append(tb)
                continue
        rest.append(e)
    return skeys, tkeys, rest


def _table_pull(scope: _Scope, queue_bound: int) -> tuple[TableScan, PullQueue]:
    scan = TableScan(scope.table)  # type: ignore[arg-type]
    return scan, PullQueue(scan, bound=queue_bound, name=f"pull:{scope.table.name}")  # type: ignore[union-attr]


def _plan_join(query, scope, others, target, sink_q, queue_bound):  # noqa: ANN001, ANN202
    s, t = scope.schema, scope.table.schema
    width = len(s)
    skeys, tkeys, rest = _join_keys(others, scope)

    def resolve(node: ast.Expr) -> Any:
        if isinstance(node, ast.Column):
            side, i = scope.resolve(node)
            return i if side == "s" else width + i
        if isinstance(node, ast.Now):
            return s.time_index
        return None

    residual = _all_of([as_predicate(compile_expr(e, resolve)) for e in rest])
    scan, pull = _table_pull(scope, queue_bound)
    joined = PushQueue(queue_bound, name="joined")
    join = IndexJoin(
        target,
        pull,
        joined,
        stream_key=_key_fn([lambda r, i=i: r[i] for _, i in skeys]),
        table_key=_key_fn([lambda r, i=i: r[i] for _, i in tkeys]),
        table_width=len(t),
        residual=residual,
        name=f"index_join:{scope.table.name}",
    )
    names: list[str] = []
    fns: list[Callable] = []
    for n, item in enumerate(query.select):
        if isinstance(item, ast.Star):
            sides = (
                [("s", s), ("t", t)]
                if item.table is None
                else [("s", s)]
                if item.table == scope.stream_alias
                else [("t", t)]
            )
            for side, schema in sides:
                off = 0 if side == "s" else width
                for i, name in enumerate(schema.names):
                    names.append(name)
                    fns.append(lambda r, j=off + i: r[j])
            continue
        names.append(_output_name(item, n))
        fns.append(compile_expr(item.expr, resolve))
    _check_unique(names)
    proj = Project(fns, joined, sink_q, name="project")
    return [join, scan, proj], tuple(names)


def _plan_aggregate_join(
    query, scope, aggs, others, target, sink_q, rng, slide, rows, start_time, queue_bound
):  # noqa: ANN001, ANN202, E501
    s = scope.schema
    skeys, tkeys, rest = _join_keys(others, scope)
    for a in aggs:
        if a.arg is not None and "t" in scope.sides(a.arg):
            raise QueryError(
                "aggregates over static-table columns are not supported; aggregate stream columns"
            )
    # Partial rows are keyed by every stream column needed after the join.
    needed: list[tuple[str, int]] = []
    for e in [*query.group_by, *rest]:
        for node in walk(e):
            if isinstance(node, ast.Column):
                ref = scope.resolve(node)
                if ref[0] == "s" and ref not in needed:
                    needed.append(ref)
    for item in query.select:
        if isinstance(item, ast.SelectItem):
            for node in walk(item.expr):
                if isinstance(node, ast.Aggregate):
                    continue
                if isinstance(node, ast.Column) and not (
                    node.table is None and node.name in WINDOW_COLUMNS
                ):
                    ref = scope.resolve(node)
                    if ref[0] == "s" and ref not in needed and _outside_aggregate(item.expr, node):
                        needed.append(ref)
    for ref in skeys:
        if ref not in needed:
            needed.append(ref)
    m = len(needed)
    stream_resolver = _stream_resolver(scope, s.time_index)
    partial_key = _key_fn([lambda t, i=i: t[i] for _, i in needed])
    arg_fns, specs = _agg_slots(aggs, lambda e: compile_expr(e, stream_resolver))
    partial_q = PushQueue(queue_bound, name="partials")
    agg = WindowAggregate(
        target,
        partial_q,
        key_fn=partial_key,
        arg_fns=arg_fns,
        specs=specs,
        time_index=s.time_index,
        range_s=rng,
        slide_s=slide,
        rows=rows,
        partial=True,
        start_time=start_time,
        name="window_aggregate(partial)",
    )
    off = m + 3  # partial row: needed stream columns, window_start, window_end, state

    def resolve(node: ast.Expr) -> Any:
        if isinstance(node, ast.Column):
            if node.table is None and node.name in WINDOW_COLUMNS:
                try:
                    scope.resolve(node)
                except QueryError:
                    return m if node.name == "window_start" else m + 1
            side, i = scope.resolve(node)
            if side == "t":
                return off + i
            return needed.index((side, i))
        if isinstance(node, ast.Now):
            return m + 1
        return None

    residual = _all_of([as_predicate(compile_expr(e, resolve)) for e in rest])
    scan, pull = _table_pull(scope, queue_bound)
    joined = PushQueue(queue_bound, name="joined")
    join = IndexJoin(
        partial_q,
        pull,
        joined,
        stream_key=_key_fn([lambda r, j=j: r[j] for j in [needed.index(ref) for ref in skeys]]),
        table_key=_key_fn([lambda r, i=i: r[i] for _, i in tkeys]),
        table_width=len(scope.table.schema),
        residual=residual,
        name=f"index_join:{scope.table.name}",
    )
    key_exprs = list(query.group_by)
    merge_key = _key_fn([compile_expr(k, resolve) for k in key_exprs])
    ctx = _AggContext(query, scope, aggs, key_exprs)
    columns, finalize = ctx.finalize(query)
    merge = GroupMerge(
        joined,
        sink_q,
        key_fn=merge_key,
        ws_index=m,
        we_index=m + 1,
        state_index=m + 2,
        specs=specs,
        finalize=finalize,
        name="group_merge",
    )
    return [agg, join, scan, merge], columns


def _outside_aggregate(expr: ast.Expr, target: ast.Expr) -> bool:
    def visit(e: ast.Expr, inside: bool) -> bool:
        if e is target:
            return not inside
        now_inside = inside or isinstance(e, ast.Aggregate)
        return any(visit(c, now_inside) for c in children(e))

    return visit(expr, False)


def _demand(query, scope, atoms, residual_exprs, others, aggs) -> Demand:  # noqa: ANN001
    s = scope.schema
    used: list[str] = []
    for item in query.select:
        if isinstance(item, ast.Star):
            used = list(s.names)
            break
    exprs = [i.expr for i in query.select if isinstance(i, ast.SelectItem)]
    exprs += [e for e in (query.where, query.having) if e is not None]
    exprs += list(query.group_by)
    for e in exprs:
        for node in walk(e):
            if isinstance(node, ast.Column):
                try:
                    side, i = scope.resolve(node)
                except QueryError:
                    continue
                if side == "s" and s.names[i] not in used:
                    used.append(s.names[i])
    window = None
    if scope.window is not None and scope.window.range_s is not None:
        rng, slide, _ = _window(scope.window, query.emit_every_s)
        window = (rng, slide)
    group_by = tuple(
        scope.name_of(scope.resolve(g)) for g in query.group_by if isinstance(g, ast.Column)
    )
    agg_list = []
    for a in aggs:
        if a.arg is None:
            agg_list.append((a.func, None))
        elif isinstance(a.arg, ast.Column):
            agg_list.append((a.func, scope.name_of(scope.resolve(a.arg))))
        else:
            agg_list.append((a.func, "<expr>"))
    return Demand(
        stream=s_name(scope),
        sample_period_s=query.sample_period_s,
        lifetime_s=query.lifetime_s,
        fields=tuple(used),
        atoms=tuple((s.names[a.field], a.op, a.value) for a in atoms),
        filtered_only_by_atoms=not residual_exprs
        and not any("s" in scope.sides(o) for o in others),
        aggregates=tuple(agg_list),
        window=window,
        group_by=group_by,
    )
