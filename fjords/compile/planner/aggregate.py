"""Windowed aggregates: the aggregate, each query's Finish (HAVING, SELECT list), COUNT(DISTINCT)
and the per-window DISTINCT / ORDER BY / LIMIT."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from fjords.compile.analysis import BoundQuery
from fjords.compile.expressions import as_predicate, compile_expr
from fjords.compile.planner.pipeline import key_fn, stream_resolver
from fjords.compile.sql import ast
from fjords.compile.sql.text import expr as sql_text
from fjords.errors import QueryError
from fjords.limits import Limits
from fjords.runtime.operators.aggregate import (
    AggSpec,
    BatchFinalize,
    Finalize,
    Finish,
    RollupFinish,
    WindowAggregate,
)
from fjords.runtime.operators.aggregate.changes import ChangesAggregate
from fjords.runtime.operators.aggregate.rhythm import RowRhythmAggregate
from fjords.runtime.operators.base import Operator
from fjords.runtime.operators.distinct import COUNT_DISTINCT, DistinctMerge
from fjords.runtime.operators.topk import WindowTop
from fjords.runtime.plan import AggregateSpec
from fjords.runtime.queues import PushQueue, Queue


class AggContext:
    """Compiles the SELECT list and HAVING over a finished group row: keys + aggregates + (ws, we)."""

    def __init__(self, b: BoundQuery) -> None:
        self.b = b
        self.key_exprs = list(b.query.group_by)
        self.key_refs = [b.ref(k) if isinstance(k, ast.Column) else None for k in self.key_exprs]
        self.aggs = list(b.aggregates)
        self.nk = len(self.key_exprs)
        self.na = len(self.aggs)

    def grouping(self, node: ast.Func) -> Any:
        """GROUPING(col) of a plain GROUP BY row: never rolled up."""
        return lambda row: 0

    def resolve(self, node: ast.Expr) -> Any:
        ws, we = self.nk + self.na, self.nk + self.na + 1
        if isinstance(node, ast.Func) and node.name == "GROUPING":
            return self.grouping(node)
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

    def _batch(self, query: ast.Query, idx_t: tuple[int, ...]) -> BatchFinalize | None:
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

    def finalizer(
        self, having: ast.Expr | bool | None = True
    ) -> tuple[Finalize, BatchFinalize | None]:
        """The row function, and the same over a window's rows at once where it only picks
        columns (else None); `having`: a HAVING other than the query's (None: none)."""
        query = self.b.query
        having_expr = query.having if having is True else having
        fns = tuple(
            compile_expr(item.expr, self.resolve)
            for item in query.select
            if isinstance(item, ast.SelectItem)
        )
        ws, we = self.nk + self.na, self.nk + self.na + 1
        extra = self.b.columns[len(fns) :]
        # after the window bounds, EMIT CHANGES rows carry `final` and `as_of` (ChangesAggregate)
        at = {"window_start": ws, "window_end": we, "final": we + 1, "as_of": we + 2}
        idx_t = tuple(at[c] for c in extra)
        # hidden ORDER BY columns, after the result's (WindowTop cuts them off)
        fns += tuple(compile_expr(e, self.resolve) for e in self.b.order_exprs)
        n_items = len(fns) - len(self.b.order_exprs)
        check = (
            as_predicate(compile_expr(having_expr, self.resolve))
            if isinstance(having_expr, ast.Expr)
            else None
        )

        if not self.b.order_exprs:

            def finalize(row: tuple) -> tuple | None:
                if check is not None and not check(row):
                    return None
                return tuple(f(row) for f in fns) + tuple(row[i] for i in idx_t)

            return finalize, (self._batch(query, idx_t) if check is None else None)

        items, hidden = fns[:n_items], fns[n_items:]

        def finalize_sorted(row: tuple) -> tuple | None:
            if check is not None and not check(row):
                return None
            return (
                tuple(f(row) for f in items)
                + tuple(row[i] for i in idx_t)
                + tuple(f(row) for f in hidden)
            )

        return finalize_sorted, None

    def finalize(self) -> Finalize:
        """The query's row function (HAVING and SELECT list) alone."""
        return self.finalizer()[0]


class RollupContext(AggContext):
    """AggContext over a ROLLUP / GROUPING SETS level row: `keys (NULL where rolled up) +
    aggregates + (ws, we) + one GROUPING flag per key` (`RollupFinish`)."""

    def grouping(self, node: ast.Func) -> Any:
        arg = node.args[0]
        for i, k in enumerate(self.key_exprs):
            if k == arg or (
                isinstance(arg, ast.Column)
                and isinstance(k, ast.Column)
                and self.b.ref(arg) == self.b.ref(k)
            ):
                return self.nk + self.na + 2 + i
        raise QueryError(
            f"GROUPING({sql_text(arg)}): not a GROUP BY column"
        )  # analyze() refused it


def rollup_finish_of(
    b: BoundQuery,
    out: Queue,
    *,
    start_time: float,
    queue_bound: int,
    having: ast.Expr | bool | None = True,
    pre: ast.Expr | None = None,
) -> RollupFinish:
    """A ROLLUP / GROUPING SETS query's end: its coarser levels merged from the finest
    level's finished groups, then HAVING and the SELECT list on every level's rows. `having`:
    a HAVING other than the query's; `pre`: a condition on the finest groups checked first
    (a WHERE on the groups moved after a shared aggregate)."""
    ctx = RollupContext(b)
    finalize = ctx.finalizer(having=having)[0]
    aggs = list(b.aggregates)
    avg = []
    for i, a in enumerate(aggs):
        if a.func == "AVG":
            avg.append(
                (
                    i,
                    aggs.index(ast.Aggregate("SUM", a.arg)),
                    aggs.index(ast.Aggregate("COUNT", a.arg)),
                )
            )
    keys = [sql_text(k) for k in b.query.group_by]
    labels = ["(" + ", ".join(keys[i] for i in level) + ")" for level in b.query.grouping_sets]
    check = as_predicate(compile_expr(pre, AggContext(b).resolve)) if pre is not None else None
    return RollupFinish(
        PushQueue(queue_bound, name="finish"),
        out,
        finalize=finalize,
        levels=b.query.grouping_sets,
        n_keys=len(keys),
        kinds=[a.func for a in aggs],
        avg=avg,
        pre=check,
        labels=labels,
        prune=None
        if b.query.drilldown is None
        else [sql_text(c) if c is not None else "" for c in b.query.drilldown],
        start_time=start_time,
        name="drilldown+having+select" if b.query.drilldown is not None else "rollup+having+select",
    )


def _same_rows(rows: list[tuple]) -> list[tuple]:
    """A finalize that keeps a window's rows as they are (its SELECT list is the row)."""
    return rows


def agg_slots(
    b: BoundQuery, compile_arg: Callable[[ast.Expr], Callable]
) -> tuple[list, list[AggSpec]]:
    """The aggregates' argument functions (one value slot each) and their specs."""
    args, dargs = list(b.agg_args), list(b.distinct_args)
    specs = []
    for a in b.aggregates:
        if a.distinct:  # (COUNT(DISTINCT x) always has its x)
            specs.append(AggSpec(COUNT_DISTINCT, dargs.index(a.arg), sql_text(a)))  # type: ignore[arg-type]
        else:
            slot = None if a.arg is None else args.index(a.arg)
            specs.append(AggSpec(a.func, slot, sql_text(a)))
    return [compile_arg(a) for a in args], specs


def aggregate_spec(
    b: BoundQuery,
    *,
    start_time: float,
    queue_bound: int,
    limits: Limits,
    window_marks: bool,
    resolver: Callable[[ast.Expr], Any] | None = None,
    time_index: int | None = None,
) -> AggregateSpec:
    """The windowed aggregate of `b` (which queries may share). `resolver` and `time_index`
    read its input's rows (default: the stream's tuples)."""
    resolver = resolver or stream_resolver(b)
    arg_fns, specs = agg_slots(b, lambda e: compile_expr(e, resolver))
    w = b.window
    assert w is not None
    return AggregateSpec(
        key_fn=key_fn([compile_expr(k, resolver) for k in b.query.group_by]),
        arg_fns=tuple(arg_fns),
        specs=tuple(specs),
        time_index=b.schema.time_index if time_index is None else time_index,  # type: ignore[arg-type]
        range_s=w.range,
        slide_s=w.slide,
        rows=w.rows,
        start_time=start_time,
        window_marks=window_marks,
        queue_bound=queue_bound,
        limits=limits,
    )


def changes_aggregate(
    b: BoundQuery, input: Queue, out: Queue, *, start_time: float, limits: Limits
) -> ChangesAggregate:
    """`EMIT CHANGES`: the query's own aggregate with early rows (not shared: a plain query
    on the same window keeps its own rhythm and rows)."""
    changes = b.query.changes
    assert changes is not None
    resolver = stream_resolver(b)
    arg_fns, specs = agg_slots(b, lambda e: compile_expr(e, resolver))
    w = b.window
    return ChangesAggregate(
        input,
        out,
        key_fn=key_fn([compile_expr(k, resolver) for k in b.query.group_by]),
        arg_fns=arg_fns,
        specs=specs,
        time_index=b.schema.time_index,  # type: ignore[arg-type]
        range_s=None if w is None else w.range,
        slide_s=None if w is None else w.slide,
        every_s=changes.every_s,
        every_rows=changes.every_rows,
        finalize=AggContext(b).finalize(),
        start_time=start_time,
        limits=limits,
        name="changes_aggregate",
    )


def rhythm_aggregate(
    b: BoundQuery,
    input: PushQueue,
    out: Queue,
    *,
    start_time: float,
    queue_bound: int,
    limits: Limits,
) -> list[Operator]:
    """EMIT EVERY n ROWS [PARTITIONED BY col]: the aggregate emitting `(t - r, t]` at each
    partition's n-th reading, then the query's Finish (HAVING, SELECT list)."""
    spec = aggregate_spec(
        b, start_time=start_time, queue_bound=queue_bound, limits=limits, window_marks=False
    )
    finish = finish_of(b, out, start_time=start_time, queue_bound=queue_bound)
    col = b.query.emit_partition
    every = b.query.emit_every_rows
    assert every is not None
    agg = RowRhythmAggregate(
        input,
        finish.inputs[0],
        key_fn=spec.key_fn,
        arg_fns=spec.arg_fns,
        specs=spec.specs,
        time_index=spec.time_index,
        range_s=spec.range_s,
        every=every,
        partition_index=None if col is None else b.schema.index(col.name),
        limits=limits,
    )
    return [agg, finish]


def finish_of(b: BoundQuery, out: Queue, *, start_time: float, queue_bound: int) -> Finish:
    """One query's end of a windowed aggregate: its start time, HAVING and SELECT list."""
    if b.query.grouping_sets:
        return rollup_finish_of(b, out, start_time=start_time, queue_bound=queue_bound)
    finalize, batch = AggContext(b).finalizer()
    return Finish(
        PushQueue(queue_bound, name="finish"),
        out,
        finalize=finalize,
        batch_finalize=batch,
        start_time=start_time,
        name="having+select",
    )


def plan_distinct(
    b: BoundQuery,
    input: PushQueue | None,
    out_q: Queue,
    *,
    start_time: float,
    queue_bound: int,
    limits: Limits,
    window_marks: bool,
    resolver: Callable[[ast.Expr], Any] | None = None,
    time_index: int | None = None,
) -> list[Operator]:
    """COUNT(DISTINCT x): a partial aggregate keyed by the groups and x, regrouped by the
    groups with x's distinct values counted (fjords.runtime.operators.distinct). `input` is
    what feeds the partial aggregate (None: its own queue, for the router); `resolver` and
    `time_index` read its rows (default: the stream's tuples)."""
    resolver = resolver or stream_resolver(b)
    keys = [compile_expr(k, resolver) for k in b.query.group_by]
    dfns = [compile_expr(e, resolver) for e in b.distinct_args]
    nk, m = len(keys), len(keys) + len(dfns)
    arg_fns, specs = agg_slots(b, lambda e: compile_expr(e, resolver))
    partial_q = PushQueue(queue_bound, name="partials")
    agg = partial_aggregate(
        b,
        input if input is not None else PushQueue(queue_bound, name="query-input"),
        partial_q,
        key_fn([*keys, *dfns]),
        arg_fns,
        [sp for sp in specs if sp.func != COUNT_DISTINCT],
        time_index=b.schema.time_index if time_index is None else time_index,  # type: ignore[arg-type]
        start_time=start_time,
        limits=limits,
        window_marks=window_marks,
    )
    merge = DistinctMerge(
        partial_q,
        out_q,
        key_fn=operator.itemgetter(slice(0, nk)),
        distinct_fns=[operator.itemgetter(j) for j in range(nk, m)],
        ws_index=m,
        we_index=m + 1,
        state_index=m + 2,
        specs=specs,
        finalize=AggContext(b).finalize(),
        name="distinct_merge",
    )
    return [agg, merge]


def partial_aggregate(
    b: BoundQuery,
    input: PushQueue,
    out: PushQueue,
    key: Callable[[tuple], tuple],
    arg_fns: list,
    specs: list[AggSpec],
    *,
    time_index: int,
    start_time: float,
    limits: Limits,
    window_marks: bool,
) -> WindowAggregate:
    """A windowed aggregate over `b`'s window that outputs partial rows (`key`, the window's
    bounds, the state) for a merge after it (COUNT(DISTINCT), a join with a table)."""
    w = b.window
    assert w is not None
    return WindowAggregate(
        input,
        out,
        key_fn=key,
        arg_fns=arg_fns,
        specs=specs,
        time_index=time_index,
        range_s=w.range,
        slide_s=w.slide,
        rows=w.rows,
        partial=True,
        start_time=start_time,
        window_marks=window_marks,
        limits=limits,
        name="window_aggregate(partial)",
    )


def window_top(b: BoundQuery, out_q: PushQueue, queue_bound: int) -> WindowTop:
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
