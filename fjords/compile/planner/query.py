"""`plan_query`: a bound query's pipeline, by shape, then lowered to its physical plan.

filter/project        router -> [Project] -> Sink
windowed aggregate    router -> WindowAggregate (shared) -> Finish -> Sink
stream x table        router -> IndexJoin(<- PullQueue <- TableScan) -> [Project] -> Sink
windowed agg x table  router -> WindowAggregate(partial, by join key) -> IndexJoin -> GroupMerge -> Sink
COUNT(DISTINCT x)     router -> WindowAggregate(partial, by groups + x) -> DistinctMerge -> Sink
stream x stream       router(a), router(b) -> SymmetricHashJoin -> Project | WindowAggregate ...
DISTINCT/ORDER/LIMIT  ... -> Finish (or the merge) -> WindowTop -> Sink  (per window)
"""

from __future__ import annotations

import math
from collections.abc import Callable

from fjords.catalog import Catalog
from fjords.compile.analysis import BoundQuery, analyze
from fjords.compile.expressions import compile_expr
from fjords.compile.planner.aggregate import (
    AggContext,
    aggregate_spec,
    changes_aggregate,
    finish_of,
    plan_distinct,
    rhythm_aggregate,
    rollup_finish_of,
    window_top,
)
from fjords.compile.planner.fusion import lower
from fjords.compile.planner.joins import plan_aggregate_join, plan_stream_join, plan_table_join
from fjords.compile.planner.pipeline import Pipeline, Shareable, residual_of, stream_resolver
from fjords.compile.planner.sharing import group_filters_last, key_position, share_key
from fjords.compile.sql import ast
from fjords.compile.sql.text import expr as sql_text
from fjords.limits import DEFAULT_LIMITS, Limits
from fjords.runtime.operators.base import Operator
from fjords.runtime.operators.simple import Project
from fjords.runtime.operators.sink import QuerySink
from fjords.runtime.plan import GroupGate, QueryPlan, Route
from fjords.runtime.queues import PushQueue

StreamIdle = Callable[[str], Callable[[], bool]]


def plan_query(
    query: ast.Query | ast.Union,
    catalog: Catalog,
    *,
    queue_bound: int,
    start_time: float = -math.inf,
    limits: Limits = DEFAULT_LIMITS,
    share_group_filters: bool = True,
    fuse: bool = True,
    stream_idle: StreamIdle | None = None,
) -> QueryPlan:
    """The physical plan of a parsed query, without side effects: nothing runs until the
    Fjord installs it. `fuse`: filters, projections, sinks and window updates may run inside
    the router's transition (False keeps one operator and queue per step: the reference the
    tests compare against). `share_group_filters`: conditions on the groups alone run after
    a shared aggregate (`sharing.group_filters_last`). `stream_idle` tells a UNION ALL's merge
    when a branch's stream has no sensor holding it back."""
    if isinstance(query, ast.Union):
        from fjords.compile.planner.union import plan_union

        return plan_union(
            query,
            catalog,
            queue_bound=queue_bound,
            start_time=start_time,
            limits=limits,
            stream_idle=stream_idle,
        )
    b = analyze(query, catalog, limits)
    p = pipeline(
        b,
        catalog,
        queue_bound=queue_bound,
        start_time=start_time,
        limits=limits,
        share=True,
        share_group_filters=share_group_filters,
        window_marks=False,
    )
    return lower(p, fuse=fuse)


def pipeline(
    b: BoundQuery,
    catalog: Catalog,
    *,
    queue_bound: int,
    start_time: float,
    limits: Limits,
    share: bool,
    share_group_filters: bool,
    window_marks: bool,
) -> Pipeline:
    """The operators of `b`, wired, with what feeds them. `share`: a plain windowed
    aggregate is left for the Fjord to share (else built into the pipeline); `window_marks`:
    every aggregate outputs a watermark after each window (a UNION ALL's merge moves on)."""
    target = PushQueue(queue_bound, name="query-input")
    sink_q = PushQueue(queue_bound, name="results")
    sink = QuerySink(sink_q, name="sink")

    def make(
        ops: list[Operator],
        shape: str,
        head: PushQueue = target,
        *,
        needs_progress: bool = b.windowed,
        filtered: BoundQuery = b,
        extra: tuple[Route, ...] = (),
        window: Shareable | None = None,
    ) -> Pipeline:
        """The pipeline; `filtered`: the bound query whose stream filters the router checks."""
        residual = residual_of(filtered, filtered.residual)
        return Pipeline(
            b, ops, sink, head, needs_progress, shape, filtered.atoms, residual, extra, window
        )

    marks = window_marks or b.per_window
    # a ROLLUP's windows are whole only at a mark where its aggregate is not fused (rows)
    rows_rollup = bool(b.query.grouping_sets) and b.window is not None and b.window.rows
    if b.query.changes is not None:  # (analyze refused it with joins, DISTINCT, ORDER BY)
        changes = changes_aggregate(b, target, sink_q, start_time=start_time, limits=limits)
        return make([changes, sink], "aggregate with EMIT CHANGES", needs_progress=True)
    if b.right is not None or b.windowed:
        # DISTINCT / ORDER BY / LIMIT: a WindowTop between the window's results and the sink.
        top = window_top(b, sink_q, queue_bound) if b.per_window else None
        results_q = top.inputs[0] if top is not None else sink_q
        tail: list[Operator] = [top, sink] if top is not None else [sink]
    if b.right is not None:
        ops, route, shape = plan_stream_join(
            b,
            target,
            results_q,
            start_time=start_time,
            queue_bound=queue_bound,
            limits=limits,
            window_marks=window_marks,
        )
        # the join evicts its windows by watermark
        return make([*ops, *tail], shape, extra=(route,), needs_progress=True)
    if b.windowed:
        kw = {"start_time": start_time, "queue_bound": queue_bound, "limits": limits}
        if b.query.emit_every_rows is not None:
            return make([*rhythm_aggregate(b, target, results_q, **kw), *tail], _rhythm_shape(b))  # type: ignore[arg-type]
        if b.table is None and b.distinct_args:
            ops = plan_distinct(b, target, results_q, window_marks=window_marks, **kw)  # type: ignore[arg-type]
            return make([*ops, *tail], "windowed aggregate with COUNT(DISTINCT)")
        if b.table is not None:
            ops = plan_aggregate_join(b, target, results_q, window_marks=window_marks, **kw)  # type: ignore[arg-type]
            return make([*ops, *tail], "windowed aggregate joined with a static table")
        if not share:
            finish = finish_of(b, results_q, start_time=start_time, queue_bound=queue_bound)
            spec = aggregate_spec(b, window_marks=marks or bool(b.query.grouping_sets), **kw)  # type: ignore[arg-type]
            agg = spec.build(output=finish.inputs[0], input=target)
            return make([agg, finish, *tail], "windowed aggregate")
        moved = group_filters_last(b, catalog, limits) if share_group_filters else None
        return _shared_window(b, moved, results_q, tail, make, marks or rows_rollup, **kw)  # type: ignore[arg-type]
    if b.table is not None:
        ops = plan_table_join(b, target, sink_q, queue_bound)
        return make([*ops, sink], "stream joined with a static table")
    projection = _select_list(b)
    if projection is None:
        # SELECT *: the router delivers straight to the sink; nothing is copied.
        return make([sink], "filter", head=sink_q)
    fns, positions = projection
    proj = Project(fns, target, sink_q, positions=positions, name="project")
    return make([proj, sink], "filter + project")


def _rhythm_shape(b: BoundQuery) -> str:
    col = b.query.emit_partition
    by = f" partitioned by {col.name}" if col is not None else ""
    return f"windowed aggregate every {b.query.emit_every_rows} rows{by}, over (t - range, t]"


def _shared_window(
    b: BoundQuery,
    moved: tuple[BoundQuery, tuple[int, frozenset], ast.Expr] | None,
    results_q: PushQueue,
    tail: list[Operator],
    make: Callable[..., Pipeline],
    marks: bool,
    *,
    start_time: float,
    queue_bound: int,
    limits: Limits,
) -> Pipeline:
    """A windowed aggregate the Fjord may share. With `moved` (`sharing.group_filters_last`),
    the conditions on the groups alone are checked on the window's rows (as HAVING), so
    queries that differ only in which groups they want share one aggregate; the router's
    filter is then what is left of WHERE."""
    sb = b if moved is None else moved[0]
    spec = aggregate_spec(
        sb, start_time=start_time, queue_bound=queue_bound, limits=limits, window_marks=marks
    )
    finish = finish_of(sb, results_q, start_time=start_time, queue_bound=queue_bound)
    key = share_key(sb, spec)
    shape = "windowed aggregate"
    if moved is None:
        return make([finish, *tail], shape, window=Shareable(key, spec))
    _, (column, values), condition = moved
    at = key_position(sb, column)
    if b.query.grouping_sets:
        # the moved condition reads the finest groups (a rolled-up row has NULL there), and
        # every user is handed its groups' rows only after that check
        finish = rollup_finish_of(
            sb,
            results_q,
            start_time=start_time,
            queue_bound=queue_bound,
            having=b.query.having,
            pre=condition,
        )
        gate = GroupGate(column, values, sql_text(condition), at, finish.finalize, None)
        return make([finish, *tail], shape, filtered=sb, window=Shareable(key, spec, gate))
    # a user handed only its groups' rows runs its HAVING without the moved condition
    finalize, batch = (
        AggContext(sb).finalizer(having=b.query.having) if at is not None else (None, None)
    )
    gate = GroupGate(column, values, sql_text(condition), at, finalize, batch)
    return make([finish, *tail], shape, filtered=sb, window=Shareable(key, spec, gate))


def _select_list(b: BoundQuery) -> tuple[list[Callable], list[int] | None] | None:
    """Column functions and their positions when all are plain columns; None for `SELECT *`."""
    resolver = stream_resolver(b)
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
