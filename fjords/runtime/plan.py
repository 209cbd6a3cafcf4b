"""What the compiler hands the runtime: a query's physical plan.

Every stage's output is named before anything runs. A `Route` says which of a stream's tuples
the query takes and where its router delivers them: to a batch callback (the query's work fused
into the router's transition) or to the queue of its first scheduled operator. The operators
were built with their queues. A windowed aggregate that queries may share is asked for by its
key (`SharedWindow`): the runtime joins the one running under that key, or builds it from its
`AggregateSpec` with its output, a fan-out to its users. The runtime installs what it is given
and re-wires nothing.

Nothing here imports the compiler (`fjords.compile`): the runtime can be read, tested and run
without the SQL front end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fjords.demand import Demand
from fjords.limits import DEFAULT_LIMITS, Limits
from fjords.runtime.operators.aggregate import (
    AggSpec,
    BatchFinalize,
    FanOut,
    Finalize,
    Finish,
    WindowAggregate,
)
from fjords.runtime.operators.base import Operator
from fjords.runtime.operators.sink import QuerySink
from fjords.runtime.predicate_index import Atom, BatchTarget, Projection, Residual
from fjords.runtime.queues import PushQueue, Queue

ProgressTarget = Callable[[object], None]


@dataclass(frozen=True, slots=True)
class Route:
    """One input of a query on `stream`'s router: the tuples passing `atoms` (indexed) and
    `residual` go to `rows`, a batch at a time; `progress`, if set, receives the stream's
    watermarks. `projection`: a fused query that only
    picks columns (the router shares the picking with every query picking the same ones).
    `suffix` tells a query's inputs apart on one router (its key is the query id + suffix)."""

    stream: str
    atoms: tuple[Atom, ...]
    residual: Residual
    rows: BatchTarget
    progress: ProgressTarget | None = None
    projection: Projection | None = None
    suffix: str = ""


@dataclass(frozen=True, slots=True)
class AggregateSpec:
    """How to build a windowed aggregate, once, when no running query has one like it: the
    compiled group key and arguments, the aggregates and the window (see WindowAggregate)."""

    key_fn: Callable[[tuple], tuple]
    arg_fns: tuple[Callable[[tuple], object], ...]
    specs: tuple[AggSpec, ...]
    time_index: int
    range_s: float
    slide_s: float
    rows: bool
    start_time: float
    window_marks: bool
    queue_bound: int
    limits: Limits = DEFAULT_LIMITS
    name: str = "window_aggregate"

    def build(
        self,
        output: Queue | None = None,
        fan: FanOut | None = None,
        input: PushQueue | None = None,
    ) -> WindowAggregate:
        """The aggregate, with its one output (a queue, or a fan-out) and its input (by
        default a queue of its own: the router's, for the tuples or the watermarks)."""
        return WindowAggregate(
            input if input is not None else PushQueue(self.queue_bound, name="query-input"),
            output,
            key_fn=self.key_fn,
            arg_fns=self.arg_fns,
            specs=self.specs,
            time_index=self.time_index,
            range_s=self.range_s,
            slide_s=self.slide_s,
            rows=self.rows,
            start_time=self.start_time,
            window_marks=self.window_marks,
            fan=fan,
            limits=self.limits,
            name=self.name,
        )

    def describe(self) -> dict[str, Any]:
        """What EXPLAIN shows of the aggregate before it runs (as `WindowAggregate.describe`)."""
        return {
            "operator": WindowAggregate.kind,
            "name": self.name,
            "range": self.range_s,
            "slide": self.slide_s,
            "unit": "rows" if self.rows else "seconds",
            "aggregates": [
                s.label or f"{s.func}({'*' if s.slot is None else s.slot})" for s in self.specs
            ],
        }


@dataclass(frozen=True, slots=True)
class GroupGate:
    """A query of a shared aggregate that wants some groups only (`column IN (...)` moved after
    the aggregate): `column` indexes the stream's tuples, `values` are the groups it wants.
    `position` is that column's place in the window's rows (None: not a plain key) and
    `finalize` (`finalize_batch`, over a window's rows at once, where there is one) its HAVING
    and SELECT list without the moved condition: a fused user is handed only its groups' rows
    of each window. `text` is the moved condition as the query wrote it."""

    column: int
    values: frozenset
    text: str
    position: int | None = None
    finalize: Finalize | None = None
    finalize_batch: BatchFinalize | None = None


@dataclass(frozen=True, slots=True)
class SharedWindow:
    """A windowed aggregate that every query with the same `key` (filter, groups, aggregates,
    window) shares: the runtime joins the running one or builds it from `spec`. The router
    feeds it the tuples passing `atoms` and `residual` (and, with gated users, of a group some
    user wants). `fused`: it runs inside the router's transition and hands each window to its
    users' `finish` directly; else through a fan-out queue to `finish`'s input."""

    key: tuple
    spec: AggregateSpec
    stream: str
    atoms: tuple[Atom, ...]
    residual: Residual
    finish: Finish
    fused: bool
    gate: GroupGate | None = None


@dataclass(frozen=True, slots=True)
class QueryPlan:
    """A query as the runtime installs it (slots: one per installed query).

    `operators` are the query's own, in pipeline order (EXPLAIN and stats list them); they run
    as scheduled steps unless `fused` (then its routes call them inside the router's
    transition). `window` is a shared aggregate feeding `operators[0]`."""

    stream: str
    streams: tuple[str, ...]  # every stream it reads, its own first
    columns: tuple[str, ...]
    operators: list[Operator]
    sink: QuerySink
    routes: tuple[Route, ...]
    fused: bool
    demands: tuple[Demand, ...]
    shape: str
    window: SharedWindow | None = None

    @property
    def demand(self) -> Demand:
        """What the query needs from its own stream's sensors."""
        return self.demands[0]
