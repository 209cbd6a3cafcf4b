"""UNION ALL: each branch planned as a query of its own on its stream's shared router (its
filters in the predicate index), the branches' results merged in sample-time order by a
ZipperMerge, then one sink. Nothing is shared with other queries past the router."""

from __future__ import annotations

import math
from collections.abc import Callable

from fjords.catalog import Catalog
from fjords.compile.analysis import analyze_union
from fjords.compile.planner.query import StreamIdle, pipeline
from fjords.compile.sql import ast
from fjords.limits import DEFAULT_LIMITS, Limits
from fjords.runtime.operators.base import Operator
from fjords.runtime.operators.joins import ZipperMerge
from fjords.runtime.operators.sink import QuerySink
from fjords.runtime.plan import QueryPlan, Route
from fjords.runtime.queues import PushQueue, Queue


def plan_union(
    union: ast.Union,
    catalog: Catalog,
    *,
    queue_bound: int,
    start_time: float = -math.inf,
    limits: Limits = DEFAULT_LIMITS,
    stream_idle: StreamIdle | None = None,
) -> QueryPlan:
    """Plan each branch (unshared, unfused: its last queue feeds the merge; watermarks after
    every window, and the stream's: the merge waits for them), then the merge. A branch whose
    stream has no sensor holding it back is not waited for (`stream_idle`)."""
    bu = analyze_union(union, catalog, limits)
    operators: list[Operator] = []
    inputs: list[Queue] = []
    times: list[int] = []
    routes: list[Route] = []
    for i, b in enumerate(bu.branches):
        p = pipeline(
            b,
            catalog,
            queue_bound=queue_bound,
            start_time=start_time,
            limits=limits,
            share=False,
            share_group_filters=False,
            window_marks=True,
        )
        operators += [op for op in p.operators if op is not p.sink]
        inputs.append(p.sink.inputs[0])
        times.append(list(b.columns).index("window_end") if bu.windowed else bu.time_index)
        head = p.head
        routes.append(
            Route(
                b.stream,
                tuple(p.atoms),
                p.residual,
                head.put_many,
                progress=head.put,
                suffix=f"#{i}",
            )
        )
    idle: list[Callable[[], bool]] | None = None
    if stream_idle is not None:
        idle = [stream_idle(b.stream) for b in bu.branches]
    out = PushQueue(queue_bound, name="union results")
    merge = ZipperMerge(
        inputs,
        out,
        times=times,
        width=bu.width,
        max_held=limits.max_union_held_rows,
        idle=idle,
        name=f"zipper_merge({len(bu.branches)} branches)",
    )
    sink = QuerySink(out, name="sink")
    return QueryPlan(
        stream=bu.branches[0].stream,
        streams=bu.streams,
        columns=bu.columns,
        operators=[*operators, merge, sink],
        sink=sink,
        routes=tuple(routes),
        fused=False,
        demands=bu.demands,
        shape=f"union all of {len(bu.branches)} queries (zipper merge in sample-time order)",
    )
