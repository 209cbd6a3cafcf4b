"""Joins: a stream with a static table (its rows pulled through a pull queue, indexed by the
join key), a windowed aggregate with a table (aggregate by the join key first: the paper's
Query 2), and two streams within the same tumbling window."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from fjords.compile.analysis import RIGHT, STREAM, BoundQuery
from fjords.compile.expressions import as_predicate, compile_expr
from fjords.compile.planner.aggregate import (
    AggContext,
    agg_slots,
    aggregate_spec,
    finish_of,
    partial_aggregate,
    plan_distinct,
)
from fjords.compile.planner.pipeline import all_of, key_fn, stream_resolver
from fjords.compile.sql import ast
from fjords.errors import QueryError
from fjords.limits import Limits
from fjords.runtime.operators.aggregate import GroupMerge
from fjords.runtime.operators.base import Operator
from fjords.runtime.operators.distinct import DistinctMerge
from fjords.runtime.operators.joins import IndexJoin, SymmetricHashJoin
from fjords.runtime.operators.scan import TableScan
from fjords.runtime.operators.simple import Project
from fjords.runtime.plan import Route
from fjords.runtime.queues import PullQueue, PushQueue, Queue


def _side_key(b: BoundQuery, side: int) -> Callable[[tuple], tuple]:
    """The join key of one side (0: the stream, 1: the table or the second stream)."""
    return key_fn([lambda t, i=pair[side].index: t[i] for pair in b.join_keys])


def _table_pull(b: BoundQuery, queue_bound: int) -> tuple[TableScan, PullQueue]:
    """The table's scan and the pull queue the join reads it through."""
    table = b.table
    assert table is not None
    buffer = PushQueue(queue_bound, name=f"pull:{table.name}")
    scan = TableScan(table, buffer)
    return scan, PullQueue(scan, buffer)


def plan_table_join(
    b: BoundQuery, target: PushQueue, sink_q: PushQueue, queue_bound: int
) -> list[Operator]:
    """router -> IndexJoin(<- PullQueue <- TableScan) -> Project -> (sink)."""
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

    residual = all_of([as_predicate(compile_expr(e, resolve)) for e in b.post_join])
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


def plan_aggregate_join(
    b: BoundQuery,
    target: PushQueue,
    sink_q: Queue,
    *,
    start_time: float,
    queue_bound: int,
    limits: Limits,
    window_marks: bool,
) -> list[Operator]:
    """Partial aggregate keyed by the stream columns needed after the join, the join, regroup."""
    needed = list(b.needed)
    stream_resolve = stream_resolver(b)
    # COUNT(DISTINCT x): x is part of the partial key, after the needed columns
    dfns = [compile_expr(e, stream_resolve) for e in b.distinct_args]
    nn, m = len(needed), len(needed) + len(dfns)
    partial_key = key_fn([*[lambda t, i=r.index: t[i] for r in needed], *dfns])
    arg_fns, specs = agg_slots(b, lambda e: compile_expr(e, stream_resolve))
    partial_q = PushQueue(queue_bound, name="partials")
    agg = partial_aggregate(
        b,
        target,
        partial_q,
        partial_key,
        arg_fns,
        specs,
        time_index=b.schema.time_index,  # type: ignore[arg-type]
        start_time=start_time,
        limits=limits,
        window_marks=window_marks,
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

    residual = all_of([as_predicate(compile_expr(e, resolve)) for e in b.post_join])
    scan, pull = _table_pull(b, queue_bound)
    joined = PushQueue(queue_bound, name="joined")
    key_at = [needed.index(sk) for sk, _ in b.join_keys]
    join = IndexJoin(
        partial_q,
        pull,
        joined,
        stream_key=key_fn([lambda r, j=j: r[j] for j in key_at]),
        table_key=key_fn([lambda r, i=tk.index: r[i] for _, tk in b.join_keys]),
        table_width=len(b.table.schema),  # type: ignore[union-attr]
        residual=residual,
        name=f"index_join:{b.table.name}",  # type: ignore[union-attr]
    )
    merge_key = key_fn([compile_expr(k, resolve) for k in b.query.group_by])
    merge: Operator
    if dfns:
        merge = DistinctMerge(
            joined,
            sink_q,
            key_fn=merge_key,
            distinct_fns=[operator.itemgetter(j) for j in range(nn, m)],
            ws_index=m,
            we_index=m + 1,
            state_index=m + 2,
            specs=specs,
            finalize=AggContext(b).finalize(),
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
            finalize=AggContext(b).finalize(),
            name="group_merge",
        )
    return [agg, join, scan, merge]


def plan_stream_join(
    b: BoundQuery,
    left_q: PushQueue,
    results_q: Queue,
    *,
    start_time: float,
    queue_bound: int,
    limits: Limits,
    window_marks: bool,
) -> tuple[list[Operator], Route, str]:
    """Two streams joined within the same tumbling window (`fjords.compile.analysis` states
    the rule): the operators up to (not including) the per-window tail and the sink, the
    second stream's route, and the plan's shape.

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
        residual=all_of([as_predicate(compile_expr(e, resolve)) for e in b.post_join]),
        stamp=True,
        fill_threshold=limits.max_join_rows,
        name=f"symmetric_hash_join:{b.stream_alias},{right.alias}",
    )
    route = Route(
        right.stream,
        right.atoms,
        all_of([as_predicate(compile_expr(e, resolve_right)) for e in right.residual]),
        right_q.put_many,
        progress=right_q.put,
        suffix="#2",
    )
    if not b.windowed:
        fns: list[Callable] = []
        for item in b.query.select:
            if isinstance(item, ast.Star):
                if item.table in (None, b.stream_alias):
                    fns += [lambda r, j=i: r[j] for i in range(width_l)]
                if item.table in (None, right.alias):
                    fns += [lambda r, j=width_l + i: r[j] for i in range(width_r)]
                continue
            fns.append(compile_expr(item.expr, resolve))
        return [join, Project(fns, joined, results_q, name="project")], route, "stream-stream join"
    if b.distinct_args:
        ops = plan_distinct(
            b,
            joined,
            results_q,
            start_time=start_time,
            queue_bound=queue_bound,
            limits=limits,
            window_marks=window_marks,
            resolver=resolve,
            time_index=stamp,
        )
        return [join, *ops], route, "stream-stream join, windowed aggregate with COUNT(DISTINCT)"
    spec = aggregate_spec(
        b,
        start_time=start_time,
        queue_bound=queue_bound,
        limits=limits,
        window_marks=window_marks or b.per_window,
        resolver=resolve,
        time_index=stamp,
    )
    finish = finish_of(b, results_q, start_time=start_time, queue_bound=queue_bound)
    agg = spec.build(output=finish.inputs[0], input=joined)  # its own: never shared
    return [join, agg, finish], route, "stream-stream join, windowed aggregate"
