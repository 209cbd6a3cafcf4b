"""A query's operators as the planner wires them, before the fusion pass.

The planner builds each query's short pipeline with its queues (`Pipeline`); the fusion pass
(`fjords.compile.planner.fusion`) then decides what runs inside the stream router and names
every stage's output in the physical plan (`fjords.runtime.plan.QueryPlan`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fjords.compile.analysis import STREAM, BoundQuery
from fjords.compile.expressions import as_predicate, compile_expr
from fjords.compile.sql import ast
from fjords.errors import QueryError
from fjords.runtime.operators.base import Operator
from fjords.runtime.operators.sink import QuerySink
from fjords.runtime.plan import AggregateSpec, GroupGate, Route
from fjords.runtime.predicate_index import Atom, Residual
from fjords.runtime.queues import PushQueue


@dataclass(frozen=True, slots=True)
class Shareable:
    """A windowed aggregate other queries with the same `key` may share (it runs before the
    pipeline's first operator, its Finish): how to build it, and the groups this query wants
    when it shares one that serves other groups too."""

    key: tuple
    spec: AggregateSpec
    gate: GroupGate | None = None


@dataclass(slots=True)
class Pipeline:
    """A query's own operators, first to last (the sink last), and what feeds them: the
    router puts the tuples passing `atoms` and `residual` into `head` (with the stream's
    watermarks when `needs_progress`); `extra` are further inputs already routed (a
    stream-stream join's second side); `window` a shareable aggregate before them."""

    bound: BoundQuery
    operators: list[Operator]
    sink: QuerySink
    head: PushQueue
    needs_progress: bool
    shape: str
    atoms: tuple[Atom, ...]
    residual: Residual
    extra: tuple[Route, ...] = ()
    window: Shareable | None = None


def all_of(preds: list[Callable[[tuple], bool]]) -> Callable[[tuple], bool] | None:
    """One predicate for a conjunction (None when there is nothing to check)."""
    if not preds:
        return None
    if len(preds) == 1:
        return preds[0]
    ps = tuple(preds)
    return lambda t: all(p(t) for p in ps)


def stream_resolver(b: BoundQuery) -> Callable[[ast.Expr], Any]:
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


def residual_of(b: BoundQuery, exprs: tuple[ast.Expr, ...]) -> Residual:
    """The stream conditions the predicate index cannot hold, as one compiled check."""
    resolve = stream_resolver(b)
    return all_of([as_predicate(compile_expr(e, resolve)) for e in exprs])


def key_fn(fns: list[Callable]) -> Callable[[tuple], tuple]:
    """A group (or join) key of compiled columns, as a tuple."""
    if not fns:
        return lambda t: ()
    if len(fns) == 1:
        f = fns[0]
        return lambda t: (f(t),)
    ft = tuple(fns)
    return lambda t: tuple(f(t) for f in ft)
