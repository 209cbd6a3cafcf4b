"""Turn a parsed query into operators folded into the running Fjord (paper section 3.3).

Names, types and clauses are settled once by `fjords.compile.analysis.analyze` (shared with the Spark
compiler); this module only builds operators from the bound query. The query's simple filters
on its sensor stream go into that stream's shared router (predicate index); what remains is the
query's own short pipeline:

  filter/project        router -> [Project] -> Sink
  windowed aggregate    router -> WindowAggregate -> Sink
  stream x table        router -> IndexJoin(<- PullQueue <- TableScan) -> [Project] -> Sink
  windowed agg x table  router -> WindowAggregate(partial, by join key) -> IndexJoin -> GroupMerge -> Sink
  COUNT(DISTINCT x)     router -> WindowAggregate(partial, by groups + x) -> DistinctMerge -> Sink
  stream x stream       router(a), router(b) -> SymmetricHashJoin -> Project | WindowAggregate ...
  DISTINCT/ORDER/LIMIT  ... -> Finish (or the merge) -> WindowTop -> Sink  (per window)

The last shape is how the paper's Query 2 runs: aggregating by the join key before joining keeps
the join to a few partial rows per window, and the partials regroup exactly (COUNT, SUM, AVG, MIN
and MAX all merge). NOW in a windowed query is the end of the window being emitted.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from fjords.catalog import Catalog
from fjords.compile.analysis import (
    RIGHT,
    STREAM,
    BoundQuery,
    BoundUnion,
    analyze,
    analyze_union,
)
from fjords.compile.expressions import as_predicate, children, compile_expr, conjuncts, walk
from fjords.compile.sql import ast
from fjords.compile.sql.text import expr as sql_text
from fjords.demand import Demand
from fjords.errors import QueryError
from fjords.limits import DEFAULT_LIMITS, Limits
from fjords.runtime.operators.aggregate import AggSpec, Finish, GroupMerge, WindowAggregate
from fjords.runtime.operators.base import Operator
from fjords.runtime.operators.distinct import COUNT_DISTINCT, DistinctMerge
from fjords.runtime.operators.joins import IndexJoin, SymmetricHashJoin, ZipperMerge
from fjords.runtime.operators.scan import TableScan
from fjords.runtime.operators.simple import Project
from fjords.runtime.operators.sink import Sink
from fjords.runtime.operators.topk import WindowTop
from fjords.runtime.predicate_index import Atom
from fjords.runtime.queues import PullQueue, PushQueue, Queue

__all__ = ["Plan", "Route", "UnionPlan", "plan_query", "plan_union"]


@dataclass(slots=True)
class Plan:
    """A query's operators and how the Fjord folds them in (slots: one per installed query)."""

    stream: str
    columns: tuple[str, ...]
    operators: list[Operator]
    sink: Sink
    atoms: tuple[Atom, ...] | list[Atom]
    residual: Callable[[tuple], bool] | None
    target: PushQueue
    needs_progress: bool
    demand: Demand
    shape: str
    windowed: bool = False
    # A windowed aggregate the Fjord may share between queries with the same `share_key`
    # (filter, groups, aggregates, window): the aggregate, and this query's Finish input.
    aggregate: WindowAggregate | None = None
    finish_input: Queue | None = None
    share_key: tuple | None = None
    shared_with: set[str] | None = None  # set by the Fjord: the queries sharing `aggregate`
    bound: BoundQuery | None = None  # the analysis the plan was built from
    # More inputs read from a stream's router besides `target` (a stream-stream join's second
    # side): the Fjord routes each like the first, with watermarks.
    extra_routes: tuple[Route, ...] = ()
    # WHERE conditions on the groups alone, checked after the shared aggregate (as HAVING),
    # as query text: the router does not index them (`_group_filters_last`).
    group_filter: tuple[str, ...] = ()
    # ... and as the shared aggregate's gate: (column index, values this query wants).
    group_gate: tuple[int, frozenset] | None = None
    # ... and for handing it only its groups' rows of each window (`SharedAggregate.fan_out`):
    # the gated column's position in the window's rows (the key comes first), the values,
    # and its HAVING and SELECT list without the moved condition (the rows already meet it).
    group_pick: tuple[int, frozenset, Callable[[tuple], tuple | None]] | None = None


@dataclass(frozen=True)
class Route:
    """One more input of a plan: `stream`'s tuples passing `atoms` and `residual` go to
    `target` (with the stream's watermarks)."""

    stream: str
    atoms: tuple[Atom, ...]
    residual: Callable[[tuple], bool] | None
    target: PushQueue


def plan_query(
    query: ast.Query | ast.Union,
    catalog: Catalog,
    *,
    queue_bound: int,
    start_time: float = -math.inf,
    limits: Limits = DEFAULT_LIMITS,
    bound: BoundQuery | None = None,
    share_group_filters: bool = True,
) -> Plan:
    """Plan without side effects: nothing is installed until the Fjord adds the plan.
    `bound` is `query` already analysed (a union's branch); a UNION ALL gets a `UnionPlan`."""
    if isinstance(query, ast.Union):
        return plan_union(  # type: ignore[return-value]
            query, catalog, queue_bound=queue_bound, start_time=start_time, limits=limits
        )
    b = analyze(query, catalog, limits) if bound is None else bound
    stream_resolver = _stream_resolver(b)
    residual = _all_of([as_predicate(compile_expr(e, stream_resolver)) for e in b.residual])
    atoms = b.atoms  # the analysis' tuple, not a copy per query
    target = PushQueue(queue_bound, name="query-input")
    sink_q = PushQueue(queue_bound, name="results")
    sink = Sink(sink_q, name="sink")

    def plan(ops: list[Operator], shape: str, **kw: Any) -> Plan:
        return Plan(
            b.stream,
            b.columns,
            ops,
            sink,
            atoms,
            residual,
            kw.pop("target", target),
            b.windowed,
            b.demand,
            shape,
            windowed=b.windowed,
            bound=b,
            **kw,
        )

    if b.right is not None:
        return _plan_stream_join(b, plan, target, sink, sink_q, start_time, queue_bound, limits)

    if b.windowed:
        # DISTINCT / ORDER BY / LIMIT: a WindowTop between the window's results and the sink.
        top = _window_top(b, sink_q, queue_bound) if b.per_window else None
        results_q = top.inputs[0] if top is not None else sink_q
        tail: list[Operator] = [top, sink] if top is not None else [sink]
        if b.table is None and b.distinct_args:
            ops = _plan_distinct(b, target, results_q, start_time, queue_bound)
            ops[0].limits = limits  # the partial WindowAggregate
            return plan([*ops, *tail], "windowed aggregate with COUNT(DISTINCT)")
        if b.table is None:
            # Conditions on the groups alone are checked on the window's rows (as HAVING), so
            # queries that differ only in which groups they want share one aggregate.
            moved = _group_filters_last(b, catalog, limits) if share_group_filters else None
            sb, gate, condition = moved or (b, None, None)
            agg_op, finish = _plan_aggregate(sb, target, start_time, queue_bound, results_q)
            agg_op.limits = limits
            w = sb.window
            assert w is not None
            # Queries with the same filter, groups, aggregates and window share one aggregate.
            share_key = (
                sb.stream,
                tuple(sorted(_canonical(c, sb) for c in sb.where)),
                tuple(
                    repr(sb.ref(g)) if isinstance(g, ast.Column) else repr(g)
                    for g in sb.query.group_by
                ),
                tuple(repr(_resolved(a, sb)) for a in sb.aggregates),
                (w.range, w.slide, w.rows),
                agg_op.window_marks,
            )
            p = plan(
                [finish, *tail],
                "windowed aggregate",
                aggregate=agg_op,
                finish_input=finish.inputs[0],
                share_key=share_key,
            )
            if sb is not b:  # the router's filter is what is left of WHERE
                p.group_gate = gate
                at = _key_position(sb, gate[0])  # type: ignore[index]
                if at is not None:
                    picked = _AggContext(sb).finalize(having=b.query.having)
                    p.group_pick = (at, gate[1], picked)  # type: ignore[index]
                p.group_filter = (sql_text(condition),)
                p.atoms = sb.atoms
                p.residual = _all_of(
                    [as_predicate(compile_expr(e, stream_resolver)) for e in sb.residual]
                )
            return p
        ops = _plan_aggregate_join(b, target, results_q, start_time, queue_bound)
        ops[0].limits = limits  # the partial WindowAggregate
        return plan([*ops, *tail], "windowed aggregate joined with a static table")

    if b.table is not None:
        ops = _plan_join(b, target, sink_q, queue_bound)
        ops.append(sink)
        return plan(ops, "stream joined with a static table")

    projection = _select_list(b, stream_resolver)
    if projection is None:
        # SELECT *: the router delivers straight to the sink; nothing is copied.
        return plan([sink], "filter", target=sink_q)
    fns, positions = projection
    proj = Project(fns, target, sink_q, positions=positions, name="project")
    return plan([proj, sink], "filter + project")


def _all_of(preds: list[Callable[[tuple], bool]]) -> Callable[[tuple], bool] | None:
    """One predicate for a conjunction (None when there is nothing to check)."""
    if not preds:
        return None
    if len(preds) == 1:
        return preds[0]
    ps = tuple(preds)
    return lambda t: all(p(t) for p in ps)


def _stream_resolver(b: BoundQuery) -> Callable[[ast.Expr], Any]:
    """Columns of the stream as tuple positions; NOW as the sample's time."""
    now_index = b.schema.time_index

    def resolve(node: ast.Expr) -> Any:
        if isinstance(node, ast.Column):
            r = b.ref(node)
            if r is None or r.side != STREAM:
                raise QueryError(f"column {node.name!r} of a table is not available here")
            return r.index
        if isinstance(node, ast.Now):
            if now_index is None:
                raise QueryError("NOW needs a stream with a time column")
            return now_index
        return None

    return resolve


def _select_list(
    b: BoundQuery, resolver: Callable
) -> tuple[list[Callable], list[int] | None] | None:
    """Column functions and their positions when all are plain columns; None for `SELECT *`."""
    items = b.query.select
    if (
        len(items) == 1
        and isinstance(items[0], ast.Star)
        and items[0].table in (None, b.stream_alias)
    ):
        return None
    fns: list[Callable] = []
    positions: list[int | None] = []
    for item in items:
        if isinstance(item, ast.Star):
            for i in range(len(b.schema)):
                fns.append(lambda t, i=i: t[i])
                positions.append(i)
            continue
        fns.append(compile_expr(item.expr, resolver))
        hit = resolver(item.expr) if isinstance(item.expr, ast.Column) else None
        positions.append(hit if isinstance(hit, int) else None)
    plain = None if any(p is None for p in positions) else [p for p in positions if p is not None]
    return fns, plain


class _AggContext:
    """Compiles the SELECT list and HAVING over a finished group row: keys + aggregates + (ws, we)."""

    def __init__(self, b: BoundQuery) -> None:
        self.b = b
        self.key_exprs = list(b.query.group_by)
        self.key_refs = [b.ref(k) if isinstance(k, ast.Column) else None for k in self.key_exprs]
        self.aggs = list(b.aggregates)
        self.nk = len(self.key_exprs)
        self.na = len(self.aggs)

    def resolve(self, node: ast.Expr) -> Any:
        ws, we = self.nk + self.na, self.nk + self.na + 1
        if isinstance(node, ast.Aggregate):
            return self.nk + self.aggs.index(node)
        if isinstance(node, ast.Now):
            return we
        if isinstance(node, ast.Column):
            slot = self.b.window_slot(node)
            if slot is not None:
                return ws if slot == "window_start" else we
            ref = self.b.ref(node)
            if ref in self.key_refs:
                return self.key_refs.index(ref)
            # analyze() refused it: a column outside GROUP BY and aggregates
            raise QueryError(f"column {node.name!r} must appear in GROUP BY or inside an aggregate")
        for i, k in enumerate(self.key_exprs):
            if k == node:
                return i
        return None

    def _batch(
        self, query: ast.Query, idx_t: tuple[int, ...]
    ) -> Callable[[list[tuple]], list[tuple]] | None:
        """`finalize` over a window's rows at once when it only picks columns (no HAVING, every
        SELECT item a group column, an aggregate or a window bound): the rows themselves when
        it keeps them as they are (Query 1), else one C-level `itemgetter` per row."""
        cols = []
        for item in query.select:
            if isinstance(item, ast.SelectItem):
                i = self.resolve(item.expr)
                if not isinstance(i, int):
                    return None
                cols.append(i)
        idx = (*cols, *idx_t)
        if idx == tuple(range(self.nk + self.na + 2)):
            return _same_rows
        if len(idx) == 1:
            return lambda rows: [(r[idx[0]],) for r in rows]
        get = operator.itemgetter(*idx)
        return lambda rows: list(map(get, rows))

    def finalize(self, having: ast.Expr | None | bool = True) -> Callable[[tuple], tuple | None]:
        """The row function; `having`: a HAVING other than the query's (None: none)."""
        query = self.b.query
        having_expr = query.having if having is True else having
        fns = tuple(
            compile_expr(item.expr, self.resolve)
            for item in query.select
            if isinstance(item, ast.SelectItem)
        )
        ws, we = self.nk + self.na, self.nk + self.na + 1
        extra = self.b.columns[len(fns) :]
        idx_t = tuple(ws if c == "window_start" else we for c in extra)
        # hidden ORDER BY columns, after the result's (WindowTop cuts them off)
        fns += tuple(compile_expr(e, self.resolve) for e in self.b.order_exprs)
        n_items = len(fns) - len(self.b.order_exprs)
        having = (
            as_predicate(compile_expr(having_expr, self.resolve))  # type: ignore[arg-type]
            if having_expr is not None
            else None
        )

        if not self.b.order_exprs:

            def finalize(row: tuple) -> tuple | None:
                if having is not None and not having(row):
                    return None
                return tuple(f(row) for f in fns) + tuple(row[i] for i in idx_t)

            if having is None:
                finalize.batch = self._batch(query, idx_t)  # type: ignore[attr-defined]
            return finalize

        items, hidden = fns[:n_items], fns[n_items:]

        def finalize_sorted(row: tuple) -> tuple | None:
            if having is not None and not having(row):
                return None
            return (
                tuple(f(row) for f in items)
                + tuple(row[i] for i in idx_t)
                + tuple(f(row) for f in hidden)
            )

        return finalize_sorted


def _same_rows(rows: list[tuple]) -> list[tuple]:
    """A finalize that keeps a window's rows as they are (its SELECT list is the row)."""
    return rows


def _agg_slots(
    b: BoundQuery, compile_arg: Callable[[ast.Expr], Callable]
) -> tuple[list, list[AggSpec]]:
    args, dargs = list(b.agg_args), list(b.distinct_args)
    specs = [
        AggSpec(COUNT_DISTINCT, dargs.index(a.arg), sql_text(a))
        if a.distinct
        else AggSpec(a.func, None if a.arg is None else args.index(a.arg), sql_text(a))
        for a in b.aggregates
    ]
    return [compile_arg(a) for a in args], specs


def _side_key(b: BoundQuery, side: int) -> Callable[[tuple], object]:
    """The join key of one side (0: the stream, 1: the table or the second stream)."""
    return _key_fn([lambda t, i=pair[side].index: t[i] for pair in b.join_keys])


def _key_fn(fns: list[Callable]) -> Callable[[tuple], tuple]:
    if not fns:
        return lambda t: ()
    if len(fns) == 1:
        f = fns[0]
        return lambda t: (f(t),)
    ft = tuple(fns)
    return lambda t: tuple(f(t) for f in ft)


# Nodes a condition moved to HAVING may have: comparisons of columns and constants.
_MOVABLE = (
    ast.Column,
    ast.Literal,
    ast.Compare,
    ast.InList,
    ast.Between,
    ast.IsNull,
    ast.Not,
    ast.And,
    ast.Or,
)


def _group_filters_last(
    b: BoundQuery, catalog: Catalog, limits: Limits
) -> tuple[BoundQuery, tuple[int, frozenset], ast.Expr] | None:
    """`b` with its WHERE condition on a GROUP BY column alone (`segment IN ('S05', 'S14')`,
    `station = '716949'`) moved to HAVING, that condition as a gate (the column's index in
    the stream's tuples, the values it lets through), and the condition; None when there is
    no such condition
    (or another kind, or several, or the query is not a plain time-windowed aggregate of one
    stream).

    A group's aggregates depend only on its own rows, so dropping the rows of the other groups
    before aggregating, or their groups after it, gives the same rows in the same order (the
    query's groups keep their first arrivals); NULL fails both. Then the aggregate serves
    every query with the same remaining filter, groups, aggregates and window, whatever
    groups each wants: 200 Query 1 dashboards on different segments are one aggregate, not
    200 (each fed its segments' readings: a call per query per batch). What the query needs
    from its sensors (`Demand`) is still the whole WHERE: the proxies wake only its sensors.

    Time windows, tumbling or sliding (not windows of rows: which rows make a window depends
    on the rows the query gets). Each user is handed only its groups' rows of a closing window
    (`Plan.group_pick`, `SharedAggregate.fan_out`): without that, sliding windows cost more
    shared than apart (every user checked every group at each slide: 19 -> 24 us per sample
    for 100 hourly tops on 207 stations), and a close of the 200 dashboards' aggregate held
    the event loop for milliseconds."""
    q, w = b.query, b.window
    if (
        q.where is None
        or w is None
        or w.rows
        or b.right is not None
        or b.table is not None
        or b.distinct_args
        or len(q.sources) != 1
    ):
        return None
    groups = {g.name for g in q.group_by if isinstance(g, ast.Column)}
    aliases = {i.alias for i in q.select if isinstance(i, ast.SelectItem) and i.alias}
    if not groups or groups & aliases:  # HAVING would read the alias
        return None
    moved, kept = [], []
    for c in conjuncts(q.where):
        on_groups = all(
            isinstance(n, _MOVABLE) and (not isinstance(n, ast.Column) or n.name in groups)
            for n in walk(c)
        )
        (moved if on_groups else kept).append(c)
    gate = _gate(moved, b)
    if gate is None:
        return None
    having = moved if q.having is None else [*moved, q.having]

    def both(items: list[ast.Expr]) -> ast.Expr | None:
        return None if not items else items[0] if len(items) == 1 else ast.And(tuple(items))

    try:
        moved_b = analyze(replace(q, where=both(kept), having=both(having)), catalog, limits)
    except QueryError:  # (as HAVING it would not check: keep the plan as written)
        return None
    return moved_b, gate, moved[0]


def _key_position(b: BoundQuery, index: int) -> int | None:
    """Where the stream column `index`, a GROUP BY column, is in the aggregate's rows."""
    for i, g in enumerate(b.query.group_by):
        ref = b.ref(g) if isinstance(g, ast.Column) else None
        if ref is not None and ref.index == index:
            return i
    return None


def _gate(moved: list[ast.Expr], b: BoundQuery) -> tuple[int, frozenset] | None:
    """One `column IN (constants)` or `column = constant`: its column's index and values (NULL
    matches nothing). Only these are moved: the shared aggregate is then fed the rows of the
    groups some user wants (the union of their values), so it never holds more groups than
    its users would apart."""
    if len(moved) != 1:
        return None
    c = moved[0]
    match c:
        case ast.InList(expr=ast.Column() as col, values=values, negated=False) if all(
            isinstance(v, ast.Literal) for v in values
        ):
            consts = [v.value for v in values]  # type: ignore[union-attr]
        case ast.Compare(op="=", left=ast.Column() as col, right=ast.Literal(value=v)):
            consts = [v]
        case ast.Compare(op="=", left=ast.Literal(value=v), right=ast.Column() as col):
            consts = [v]
        case _:
            return None
    return b.ref(col).index, frozenset(v for v in consts if v is not None)


def _plan_aggregate(
    b: BoundQuery,
    target: PushQueue,
    start_time: float,
    queue_bound: int,
    sink_q: PushQueue,
    resolver: Callable[[ast.Expr], Any] | None = None,
    time_index: int | None = None,
) -> tuple[WindowAggregate, Finish]:
    """The aggregate (which may be shared) and this query's Finish (HAVING, SELECT).
    `resolver` and `time_index` read its input's rows (default: the stream's tuples)."""
    s = b.schema
    resolver = resolver or _stream_resolver(b)
    key_fn = _key_fn([compile_expr(k, resolver) for k in b.query.group_by])
    arg_fns, specs = _agg_slots(b, lambda e: compile_expr(e, resolver))
    finalize = _AggContext(b).finalize()
    w = b.window
    assert w is not None
    op = WindowAggregate(
        target,
        PushQueue(queue_bound, name="window rows"),
        key_fn=key_fn,
        arg_fns=arg_fns,
        specs=specs,
        time_index=s.time_index if time_index is None else time_index,  # type: ignore[arg-type]
        range_s=w.range,
        slide_s=w.slide,
        rows=w.rows,
        start_time=start_time,
        window_marks=b.per_window,
        name="window_aggregate",
    )
    finish = Finish(
        PushQueue(queue_bound, name="finish"),
        sink_q,
        finalize=finalize,
        start_time=start_time,
        name="having+select",
    )
    return op, finish


def _canonical(expr: ast.Expr, b: BoundQuery) -> str:
    """An expression's text with columns resolved (`t.speed` and `speed` read the same)."""
    if isinstance(expr, ast.Column):
        r = b.ref(expr)
        if r is None:
            return expr.name
        return f"${r.side}{r.index}"
    kids = children(expr)
    if not kids:
        return repr(expr)
    inner = ",".join(_canonical(k, b) for k in kids)
    # The node's own fields besides its children: an operator, a negation, a function name.
    own = "".join(str(getattr(expr, f, "")) for f in ("op", "negated", "func", "name", "distinct"))
    return f"{type(expr).__name__}{own}({inner})"


def _resolved(a: ast.Aggregate, b: BoundQuery) -> tuple:
    """An aggregate with its column resolved, so `s.speed` and `speed` share."""
    if isinstance(a.arg, ast.Column):
        r = b.ref(a.arg)
        return (a.func, None if r is None else (r.side, r.index))
    return (a.func, a.arg)


def _table_pull(b: BoundQuery, queue_bound: int) -> tuple[TableScan, PullQueue]:
    scan = TableScan(b.table)  # type: ignore[arg-type]
    return scan, PullQueue(scan, bound=queue_bound, name=f"pull:{b.table.name}")  # type: ignore[union-attr]


def _plan_join(
    b: BoundQuery, target: PushQueue, sink_q: PushQueue, queue_bound: int
) -> list[Operator]:
    s, t = b.schema, b.table.schema  # type: ignore[union-attr]
    width = len(s)

    def resolve(node: ast.Expr) -> Any:
        if isinstance(node, ast.Column):
            r = b.ref(node)
            assert r is not None
            return r.index if r.side == STREAM else width + r.index
        if isinstance(node, ast.Now):
            return s.time_index
        return None

    residual = _all_of([as_predicate(compile_expr(e, resolve)) for e in b.post_join])
    scan, pull = _table_pull(b, queue_bound)
    joined = PushQueue(queue_bound, name="joined")
    join = IndexJoin(
        target,
        pull,
        joined,
        stream_key=_side_key(b, 0),
        table_key=_side_key(b, 1),
        table_width=len(t),
        residual=residual,
        name=f"index_join:{b.table.name}",  # type: ignore[union-attr]
    )
    fns: list[Callable] = []
    for item in b.query.select:
        if isinstance(item, ast.Star):
            if item.table in (None, b.stream_alias):
                fns += [lambda r, j=i: r[j] for i in range(width)]
            if item.table in (None, b.table_alias):
                fns += [lambda r, j=width + i: r[j] for i in range(len(t))]
            continue
        fns.append(compile_expr(item.expr, resolve))
    proj = Project(fns, joined, sink_q, name="project")
    return [join, scan, proj]


def _plan_aggregate_join(
    b: BoundQuery, target: PushQueue, sink_q: PushQueue, start_time: float, queue_bound: int
) -> list[Operator]:
    """Partial aggregate keyed by the stream columns needed after the join, the join, regroup."""
    s = b.schema
    needed = list(b.needed)
    stream_resolver = _stream_resolver(b)
    # COUNT(DISTINCT x): x is part of the partial key, after the needed columns
    dfns = [compile_expr(e, stream_resolver) for e in b.distinct_args]
    nn, m = len(needed), len(needed) + len(dfns)
    partial_key = _key_fn([*[lambda t, i=r.index: t[i] for r in needed], *dfns])
    arg_fns, specs = _agg_slots(b, lambda e: compile_expr(e, stream_resolver))
    partial_q = PushQueue(queue_bound, name="partials")
    w = b.window
    assert w is not None
    agg = WindowAggregate(
        target,
        partial_q,
        key_fn=partial_key,
        arg_fns=arg_fns,
        specs=specs,
        time_index=s.time_index,  # type: ignore[arg-type]
        range_s=w.range,
        slide_s=w.slide,
        rows=w.rows,
        partial=True,
        start_time=start_time,
        name="window_aggregate(partial)",
    )
    off = m + 3  # partial row: needed stream columns, window_start, window_end, state

    def resolve(node: ast.Expr) -> Any:
        if isinstance(node, ast.Column):
            slot = b.window_slot(node)
            if slot is not None:
                return m if slot == "window_start" else m + 1
            r = b.ref(node)
            assert r is not None
            if r.side != STREAM:
                return off + r.index
            return needed.index(r)
        if isinstance(node, ast.Now):
            return m + 1
        return None

    residual = _all_of([as_predicate(compile_expr(e, resolve)) for e in b.post_join])
    scan, pull = _table_pull(b, queue_bound)
    joined = PushQueue(queue_bound, name="joined")
    key_at = [needed.index(sk) for sk, _ in b.join_keys]
    join = IndexJoin(
        partial_q,
        pull,
        joined,
        stream_key=_key_fn([lambda r, j=j: r[j] for j in key_at]),
        table_key=_key_fn([lambda r, i=tk.index: r[i] for _, tk in b.join_keys]),
        table_width=len(b.table.schema),  # type: ignore[union-attr]
        residual=residual,
        name=f"index_join:{b.table.name}",  # type: ignore[union-attr]
    )
    merge_key = _key_fn([compile_expr(k, resolve) for k in b.query.group_by])
    if dfns:
        merge: Operator = DistinctMerge(
            joined,
            sink_q,
            key_fn=merge_key,
            distinct_fns=[lambda r, j=j: r[j] for j in range(nn, m)],
            ws_index=m,
            we_index=m + 1,
            state_index=m + 2,
            specs=specs,
            finalize=_AggContext(b).finalize(),
            name="distinct_merge",
        )
    else:
        merge = GroupMerge(
            joined,
            sink_q,
            key_fn=merge_key,
            ws_index=m,
            we_index=m + 1,
            state_index=m + 2,
            specs=specs,
            finalize=_AggContext(b).finalize(),
            name="group_merge",
        )
    return [agg, join, scan, merge]


def _plan_distinct(
    b: BoundQuery,
    target: PushQueue,
    out_q: Queue,
    start_time: float,
    queue_bound: int,
    resolver: Callable[[ast.Expr], Any] | None = None,
    time_index: int | None = None,
) -> list[Operator]:
    """COUNT(DISTINCT x): a partial aggregate keyed by the groups and x, regrouped by the
    groups with x's distinct values counted (fjords.runtime.operators.distinct). `resolver` and
    `time_index` read its input's rows (default: the stream's tuples)."""
    resolver = resolver or _stream_resolver(b)
    keys = [compile_expr(k, resolver) for k in b.query.group_by]
    dfns = [compile_expr(e, resolver) for e in b.distinct_args]
    nk, m = len(keys), len(keys) + len(dfns)
    arg_fns, specs = _agg_slots(b, lambda e: compile_expr(e, resolver))
    partial_q = PushQueue(queue_bound, name="partials")
    w = b.window
    assert w is not None
    agg = WindowAggregate(
        target,
        partial_q,
        key_fn=_key_fn([*keys, *dfns]),
        arg_fns=arg_fns,
        specs=[sp for sp in specs if sp.func != COUNT_DISTINCT],
        time_index=b.schema.time_index if time_index is None else time_index,  # type: ignore[arg-type]
        range_s=w.range,
        slide_s=w.slide,
        rows=w.rows,
        partial=True,
        start_time=start_time,
        name="window_aggregate(partial)",
    )
    merge = DistinctMerge(
        partial_q,
        out_q,
        key_fn=lambda r, nk=nk: r[:nk],
        distinct_fns=[lambda r, j=j: r[j] for j in range(nk, m)],
        ws_index=m,
        we_index=m + 1,
        state_index=m + 2,
        specs=specs,
        finalize=_AggContext(b).finalize(),
        name="distinct_merge",
    )
    return [agg, merge]


def _window_top(b: BoundQuery, out_q: PushQueue, queue_bound: int) -> WindowTop:
    """DISTINCT rows, ORDER BY and LIMIT over each window's results (fjords.runtime.operators.topk)."""
    cols = list(b.columns)
    return WindowTop(
        PushQueue(queue_bound, name="window results"),
        out_q,
        width=len(cols),
        window=(cols.index("window_start"), cols.index("window_end")),
        keys=b.order,
        limit=b.limit,
        distinct=b.distinct_rows,
        name="order+limit" if b.order else "distinct",
    )


# -- UNION ALL ---------------------------------------------------------------------------------


@dataclass
class UnionPlan:
    """A UNION ALL: each branch planned as a query of its own on its stream's shared router
    (its filters in the predicate index), the branches' results merged in sample-time order by
    a ZipperMerge, then one sink. Nothing is shared with other queries past the router."""

    bound: BoundUnion
    branches: list[Plan]
    merge: ZipperMerge
    sink: Sink
    operators: list[Operator]  # every branch's (their sinks left out), the merge, the sink
    columns: tuple[str, ...]
    shape: str
    # Set by the Fjord when installed: (router key, stream) of each branch.
    routes: list[tuple[str, str]] | None = None
    share_key: None = None
    shared_with: None = None
    aggregate: None = None
    windowed: bool = False

    @property
    def stream(self) -> str:
        return self.branches[0].stream

    @property
    def streams(self) -> tuple[str, ...]:
        return self.bound.streams

    @property
    def demand(self) -> Demand:
        return self.branches[0].demand

    @property
    def demands(self) -> tuple[Demand, ...]:
        return tuple(p.demand for p in self.branches)


def plan_union(
    union: ast.Union,
    catalog: Catalog,
    *,
    queue_bound: int,
    start_time: float = -math.inf,
    limits: Limits = DEFAULT_LIMITS,
) -> UnionPlan:
    """Plan each branch (unshared, unfused: its last queue feeds the merge), then the merge."""
    bu = analyze_union(union, catalog, limits)
    branches: list[Plan] = []
    operators: list[Operator] = []
    inputs: list[Queue] = []
    times: list[int] = []
    for b in bu.branches:
        p = plan_query(
            b.query,
            catalog,
            queue_bound=queue_bound,
            start_time=start_time,
            limits=limits,
            bound=b,
        )
        ops = [op for op in p.operators if op is not p.sink]
        if p.aggregate is not None and p.aggregate not in ops:  # not shared in a union:
            ops.insert(0, p.aggregate)  # it feeds this branch's Finish (no fan-out)
            p.aggregate.outputs[0] = p.finish_input  # type: ignore[assignment]
        for op in ops:  # watermarks after every window, and the stream's: the merge moves on
            if isinstance(op, WindowAggregate):
                op.window_marks = True
        p.share_key = None
        p.needs_progress = True  # the merge waits for every branch's watermark
        branches.append(p)
        operators += ops
        inputs.append(p.sink.inputs[0])
        times.append(list(b.columns).index("window_end") if bu.windowed else bu.time_index)
    out = PushQueue(queue_bound, name="union results")
    merge = ZipperMerge(
        inputs,
        out,
        times=times,
        width=bu.width,
        max_held=limits.max_union_held_rows,
        name=f"zipper_merge({len(branches)} branches)",
    )
    sink = Sink(out, name="sink")
    return UnionPlan(
        bound=bu,
        branches=branches,
        merge=merge,
        sink=sink,
        operators=[*operators, merge, sink],
        columns=bu.columns,
        shape=f"union all of {len(branches)} queries (zipper merge in sample-time order)",
        windowed=bu.windowed,
    )


def _plan_stream_join(
    b: BoundQuery,
    plan: Callable[..., Plan],
    left_q: PushQueue,
    sink: Sink,
    sink_q: PushQueue,
    start_time: float,
    queue_bound: int,
    limits: Limits,
) -> Plan:
    """Two streams joined within the same tumbling window (fjords.compile.analysis states the rule):

      router(a) ---+
                   +--> SymmetricHashJoin (key: window, join key) -> Project -> Sink
      router(b) ---+                   (or) -> WindowAggregate -> Finish [-> WindowTop] -> Sink

    Each side is routed with its own filter (both in the predicate index, as any query's),
    the join holds each open window's tuples and outputs a pair as soon as both are there;
    a joined row is the first stream's tuple, the second's, then its sample time (the later
    of the two), which the aggregate windows by. Windows are evicted by watermark."""
    right = b.right
    assert right is not None and b.window is not None
    width_l, width_r = len(b.schema), len(right.schema)
    stamp = width_l + width_r  # the joined row's sample time

    def resolve(node: ast.Expr) -> Any:
        if isinstance(node, ast.Column):
            r = b.ref(node)
            if r is None:
                raise QueryError(f"column {node.name!r} is not available here")
            return r.index if r.side == STREAM else width_l + r.index
        return None

    def resolve_right(node: ast.Expr) -> Any:
        if isinstance(node, ast.Column):
            r = b.ref(node)
            assert r is not None and r.side == RIGHT
            return r.index
        return None

    right_q = PushQueue(queue_bound, name="join-right")
    joined = PushQueue(queue_bound, name="joined")
    join = SymmetricHashJoin(
        left_q,
        right_q,
        joined,
        left_key=_side_key(b, 0),
        right_key=_side_key(b, 1),
        left_time=b.schema.time_index,  # type: ignore[arg-type]
        right_time=right.schema.time_index,  # type: ignore[arg-type]
        tumbling=b.window.range,
        residual=_all_of([as_predicate(compile_expr(e, resolve)) for e in b.post_join]),
        stamp=True,
        fill_threshold=limits.max_join_rows,
        name=f"symmetric_hash_join:{b.stream_alias},{right.alias}",
    )
    route = Route(
        right.stream,
        right.atoms,
        _all_of([as_predicate(compile_expr(e, resolve_right)) for e in right.residual]),
        right_q,
    )
    if b.windowed:
        top = _window_top(b, sink_q, queue_bound) if b.per_window else None
        results_q = top.inputs[0] if top is not None else sink_q
        tail: list[Operator] = [top, sink] if top is not None else [sink]
        if b.distinct_args:
            ops = _plan_distinct(b, joined, results_q, start_time, queue_bound, resolve, stamp)
            ops[0].limits = limits  # type: ignore[attr-defined]
            shape = "stream-stream join, windowed aggregate with COUNT(DISTINCT)"
        else:
            agg, finish = _plan_aggregate(
                b, joined, start_time, queue_bound, results_q, resolve, stamp
            )
            agg.limits = limits
            agg.outputs = [finish.inputs[0]]  # its own: a join's aggregate is never shared
            ops = [agg, finish]
            shape = "stream-stream join, windowed aggregate"
        p = plan([join, *ops, *tail], shape, extra_routes=(route,))
    else:
        fns: list[Callable] = []
        for item in b.query.select:
            if isinstance(item, ast.Star):
                if item.table in (None, b.stream_alias):
                    fns += [lambda r, j=i: r[j] for i in range(width_l)]
                if item.table in (None, right.alias):
                    fns += [lambda r, j=width_l + i: r[j] for i in range(width_r)]
                continue
            fns.append(compile_expr(item.expr, resolve))
        proj = Project(fns, joined, sink_q, name="project")
        p = plan([join, proj, sink], "stream-stream join", extra_routes=(route,))
    p.needs_progress = True  # the join evicts its windows by watermark
    return p
