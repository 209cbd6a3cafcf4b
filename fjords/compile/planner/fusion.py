"""The fusion pass: what runs inside the stream router's transition, and what is scheduled.

Decided once, before anything runs, from the shape of a query's pipeline:

- a filter query (SELECT *: its sink) or a filter + projection (Project, then the sink) is
  fused: the router calls one callback with the query's rows of each batch, which projects them
  and hands them to the sink's consumers right there, with no queue and no scheduler step;
- a plain windowed aggregate (a time window, then the query's Finish and sink) is fused: the
  router hands the (shared) aggregate its rows a batch at a time and its progress, and each
  emitted window goes straight to every user's Finish and sink;
- every other shape (joins, ROWS windows, COUNT(DISTINCT), per-window ORDER BY ...) keeps its
  operators and queues, as scheduled steps.

The result is the physical plan (`fjords.runtime.plan.QueryPlan`), in which every route names
where its rows go.
"""

from __future__ import annotations

from fjords.compile.planner.pipeline import Pipeline
from fjords.runtime.delivery import Guarded, ProjectThenSink
from fjords.runtime.operators.aggregate import Finish, RollupFinish
from fjords.runtime.operators.simple import Project
from fjords.runtime.plan import QueryPlan, Route, SharedWindow
from fjords.runtime.predicate_index import BatchTarget


def lower(p: Pipeline, *, fuse: bool) -> QueryPlan:
    """`p` as the runtime installs it; `fuse` False schedules every operator (the reference
    the tests compare fused plans against)."""
    b = p.bound
    streams = (
        (b.stream,) if b.right is None or b.right.stream == b.stream else (b.stream, b.right.stream)
    )
    demands = (b.demand,) if b.right is None else (b.demand, b.right.demand)
    if p.window is not None:
        finish = p.operators[0]
        assert isinstance(finish, Finish)
        fused = fuse and _fusable_window(p)
        window = SharedWindow(
            p.window.key,
            p.window.spec,
            b.stream,
            tuple(p.atoms),
            p.residual,
            finish,
            fused,
            p.window.gate,
        )
        return QueryPlan(
            b.stream, streams, b.columns, p.operators, p.sink, (), fused, demands, p.shape, window
        )
    deliver = _delivery(p) if fuse else None
    if deliver is None:
        head = p.head
        route = Route(
            b.stream,
            tuple(p.atoms),
            p.residual,
            head.put_many,
            progress=head.put if p.needs_progress else None,
        )
    else:
        projection = deliver.projection() if isinstance(deliver, ProjectThenSink) else None
        route = Route(b.stream, tuple(p.atoms), p.residual, deliver, projection=projection)
    return QueryPlan(
        b.stream,
        streams,
        b.columns,
        p.operators,
        p.sink,
        (route, *p.extra),
        deliver is not None,
        demands,
        p.shape,
    )


def _delivery(p: Pipeline) -> BatchTarget | None:
    """The query's work after its filter as one callback per batch, or None (not fusable)."""
    ops, sink = p.operators, p.sink
    if p.extra:
        return None
    if len(ops) == 1 and ops[0] is sink and sink.inputs[0] is p.head:
        return Guarded(sink.deliver, sink.name)
    if (
        len(ops) == 2
        and type(ops[0]) is Project
        and ops[1] is sink
        and ops[0].inputs[0] is p.head
        and ops[0].outputs == sink.inputs
    ):
        return ProjectThenSink(ops[0], sink)
    return None


def _fusable_window(p: Pipeline) -> bool:
    """A time-window aggregate (not ROWS) whose users' part is their Finish (or a ROLLUP's), then
    the sink."""
    ops = p.operators
    return (
        p.window is not None
        and not p.window.spec.rows
        and len(ops) == 2
        and type(ops[0]) in (Finish, RollupFinish)
        and ops[1] is p.sink
        and ops[0].outputs == p.sink.inputs
    )
