"""Which windowed aggregates queries share: the share key, and WHERE conditions on the groups
alone moved after the aggregate so that queries differing only in their groups share it."""

from __future__ import annotations

import itertools
from dataclasses import replace

from fjords.catalog import Catalog
from fjords.compile.analysis import BoundQuery, analyze
from fjords.compile.expressions import children, conjuncts, walk
from fjords.compile.sql import ast
from fjords.errors import QueryError
from fjords.limits import Limits
from fjords.runtime.plan import AggregateSpec

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


_UNSHARED = itertools.count()  # tells apart the aggregates that are never shared


def share_key(b: BoundQuery, spec: AggregateSpec) -> tuple:
    """Queries with the same filter, groups, aggregates and window share one aggregate. One
    with SAMPLE EVERY n ROWS counts each sensor's readings from its own first: never shared."""
    w = b.window
    assert w is not None
    every = b.query.sample_every_rows
    return (
        *((("sample every", every, next(_UNSHARED)),) if every is not None else ()),
        b.stream,
        tuple(sorted(_canonical(c, b) for c in b.where)),
        tuple(repr(b.ref(g)) if isinstance(g, ast.Column) else repr(g) for g in b.query.group_by),
        tuple(repr(_resolved(a, b)) for a in b.aggregates),
        (w.range, w.slide, w.rows),
        spec.window_marks,
    )


def group_filters_last(
    b: BoundQuery, catalog: Catalog, limits: Limits
) -> tuple[BoundQuery, tuple[int, frozenset], ast.Expr] | None:
    """`b` with its WHERE condition on a GROUP BY column alone (`segment IN ('S05', 'S14')`,
    `station = '716949'`) moved to HAVING, that condition as a gate (the column's index in
    the stream's tuples, the values it lets through), and the condition; None when there is
    no such condition (or another kind, or several, or the query is not a plain
    time-windowed aggregate of one stream).

    A group's aggregates depend only on its own rows, so dropping the rows of the other groups
    before aggregating, or their groups after it, gives the same rows in the same order (the
    query's groups keep their first arrivals); NULL fails both. Then the aggregate serves
    every query with the same remaining filter, groups, aggregates and window, whatever
    groups each wants: 200 Query 1 dashboards on different segments are one aggregate, not
    200 (each fed its segments' readings: a call per query per batch). What the query needs
    from its sensors (`Demand`) is still the whole WHERE: the proxies wake only its sensors.

    Time windows, tumbling or sliding (not windows of rows: which rows make a window depends
    on the rows the query gets). Each user is handed only its groups' rows of a closing window
    (`GroupGate`, `fjords.runtime.shared.WindowFanOut`): without that, sliding windows cost
    more shared than apart (every user checked every group at each slide: 19 -> 24 us per
    sample for 100 hourly tops on 207 stations), and a close of the 200 dashboards' aggregate
    held the event loop for milliseconds."""
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
    moved: list[ast.Expr] = []
    kept: list[ast.Expr] = []
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


def key_position(b: BoundQuery, index: int) -> int | None:
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
    ref = b.ref(col)
    assert ref is not None
    return ref.index, frozenset(v for v in consts if v is not None)


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
