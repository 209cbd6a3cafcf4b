"""Snapshot queries: one answer over the readings a stream already has, in the same dialect.

A snapshot is planned as a continuous query that sees its readings once:

- with aggregates (or GROUP BY, DISTINCT), the stream's window becomes one tumbling window
  holding every time from 1970 on (`ALL_TIME_S`), so HAVING, ORDER BY, LIMIT and DISTINCT
  apply to the whole answer exactly as they apply to one window of a continuous query; the
  result's window bounds are the snapshot's `[from, to)`;
- without them, the rows pass the query's filter and projection; ORDER BY (by result column)
  and LIMIT are applied to the answer.

Which readings: `[RANGE r]` means the last `r` seconds before `to`; comparisons of the time
column with constants in WHERE narrow it further; without either, all of history. Clauses
about the future (EMIT EVERY, SAMPLE PERIOD, LIFETIME, PRIORITY) mean nothing here and are
refused with their position.

`measure`: when every aggregate reads one measured column of the stream directly and nothing
else reads it (nor the time column, outside those comparisons), the answer can be computed
from per-sensor aggregates (the history's cells, as `fjords.partial.Partial` values) instead
of from every reading.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from fjords.catalog import Catalog, StreamInfo
from fjords.compile.analysis import BoundQuery, analyze
from fjords.compile.expressions import walk
from fjords.compile.sql import ast
from fjords.errors import ClauseError
from fjords.limits import DEFAULT_LIMITS, Limits

__all__ = ["ALL_TIME_S", "SnapshotPlan", "plan_snapshot"]

#: One tumbling window of this length holds every time from 1970 to the year 2039 and more
#: (2**41 ms, about 69.7 years): a whole snapshot is one window of it.
ALL_TIME_S = 2.0**41 / 1000

_FUTURE_CLAUSES = (
    "EMIT EVERY",
    "EMIT EVERY ROWS",
    "EMIT CHANGES",
    "SAMPLE PERIOD",
    "SAMPLE EVERY",
    "LIFETIME",
    "PRIORITY",
)


@dataclass(frozen=True)
class SnapshotPlan:
    """What a snapshot reads and how it answers (see the module docstring)."""

    stream: str
    query: ast.Query  # the query the snapshot runs (one all-time window, or none)
    bound: BoundQuery  # its analysis
    aggregated: bool
    range_s: float | None  # [RANGE r]: the last r seconds before `to`
    lower: float  # time >= lower (from WHERE; -inf without)
    upper: float  # time < upper (from WHERE; inf without)
    window_columns: bool  # the answer keeps window_start/window_end ([RANGE] was given)
    measure: str | None  # answerable from per-sensor aggregates of this column (None: readings)
    order: tuple[tuple[int, bool], ...] = ()  # without aggregates: (column, descending)
    limit: int | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        cols = self.bound.columns
        if self.aggregated and not self.window_columns:
            return tuple(c for c in cols if c not in ("window_start", "window_end"))
        return cols

    def span(self, to: float) -> tuple[float, float]:
        """The snapshot's `[from, to)` for a stream whose data is complete up to `to`."""
        start = self.lower if self.range_s is None else max(self.lower, to - self.range_s)
        return start, min(to, self.upper)


def plan_snapshot(
    tree: ast.Statement,
    catalog: Catalog,
    limits: Limits = DEFAULT_LIMITS,
    *,
    measures: frozenset[str] = frozenset(),
) -> SnapshotPlan:
    """The snapshot plan of `tree`; ClauseError (with position) for what a snapshot cannot
    honour. `measures`: the stream's measured columns (its history's), for `measure`."""
    if isinstance(tree, ast.Union):
        raise ClauseError("a snapshot of a UNION ALL is not supported yet: ask each branch")
    for clause in _FUTURE_CLAUSES:
        pos = tree.pos_of(clause)
        if pos is not None or _has_option(tree, clause):
            raise ClauseError(
                f"{clause} is about a continuous query's future; a snapshot answers once: "
                f"remove {clause}",
                pos,
            )
    streams = [(i, r) for i, r in enumerate(tree.sources) if r.name in catalog.streams]
    if len(streams) != 1:
        raise ClauseError(
            "a snapshot reads one stream (joined with tables): "
            + ("name a stream" if not streams else "join one stream with tables only"),
            tree.sources[0].pos if tree.sources else None,
        )
    at, ref = streams[0]
    info = catalog.streams[ref.name]
    range_s = _range_of(ref)
    aggregated = _aggregated(tree)
    order_items: tuple[ast.OrderItem, ...] = ()
    limit: int | None = None
    if aggregated:
        window = ast.Window(range_s=ALL_TIME_S, pos=ref.window.pos if ref.window else ref.pos)
        query = _with_window(tree, at, window)
    else:
        query = _with_window(tree, at, None)
        order_items, limit = query.order_by, query.limit
        query = dataclasses.replace(query, order_by=(), limit=None)
    bound = analyze(query, catalog, limits)
    lower, upper = _time_bounds(bound, info)
    return SnapshotPlan(
        stream=ref.name,
        query=query,
        bound=bound,
        aggregated=aggregated,
        range_s=range_s,
        lower=lower,
        upper=upper,
        window_columns=range_s is not None,
        measure=_measure(bound, info, measures) if aggregated else None,
        order=_order(order_items, bound.columns),
        limit=limit,
    )


def _has_option(tree: ast.Query, clause: str) -> bool:
    value = {
        "EMIT EVERY": tree.emit_every_s,
        "EMIT CHANGES": tree.changes,
        "EMIT EVERY ROWS": tree.emit_every_rows,
        "SAMPLE PERIOD": tree.sample_period_s,
        "SAMPLE EVERY": tree.sample_every_rows,
        "LIFETIME": tree.lifetime_s,
        "PRIORITY": tree.priority,
    }[clause]
    return value is not None


def _range_of(ref: ast.TableRef) -> float | None:
    w = ref.window
    if w is None:
        return None
    if w.rows is not None:
        raise ClauseError("a snapshot covers a time range: use [RANGE r], not [ROWS n]", w.pos)
    if w.slide_s is not None and w.slide_s != w.range_s:
        raise ClauseError(
            "a snapshot covers one range, the last r before the stream's watermark: remove SLIDE",
            w.pos,
        )
    return w.range_s


def _aggregated(tree: ast.Query) -> bool:
    if tree.group_by or tree.distinct:
        return True
    exprs = [i.expr for i in tree.select if isinstance(i, ast.SelectItem)]
    exprs += [tree.having] if tree.having is not None else []
    exprs += [o.expr for o in tree.order_by]
    return any(isinstance(n, ast.Aggregate) for e in exprs for n in walk(e))


def _with_window(tree: ast.Query, at: int, window: ast.Window | None) -> ast.Query:
    sources = list(tree.sources)
    sources[at] = dataclasses.replace(sources[at], window=window)
    return dataclasses.replace(tree, sources=tuple(sources))


def _time_bounds(b: BoundQuery, info: StreamInfo) -> tuple[float, float]:
    """[lower, upper) from the WHERE conjuncts that compare the time column with a number."""
    lower, upper = -math.inf, math.inf
    for c in b.where:
        cmp = _time_compare(c, info.schema.time)
        if cmp is None:
            continue
        op, v = cmp
        if op in (">=", "="):
            lower = max(lower, v)
        if op == ">":
            lower = max(lower, math.nextafter(v, math.inf))
        if op in ("<=", "="):
            upper = min(upper, math.nextafter(v, math.inf))
        if op == "<":
            upper = min(upper, v)
    return lower, upper


_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "=", "!=": "!="}


def _time_compare(c: ast.Expr, time: str | None) -> tuple[str, float] | None:
    """(op, value) for `time op number` (either way round), else None."""
    if not isinstance(c, ast.Compare) or c.op == "!=":
        return None
    left, right, op = c.left, c.right, c.op
    if isinstance(right, ast.Column) and not isinstance(left, ast.Column):
        left, right, op = right, left, _FLIP[op]
    if not (isinstance(left, ast.Column) and left.name == time and isinstance(right, ast.Literal)):
        return None
    v = right.value
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return op, float(v)


def _measure(b: BoundQuery, info: StreamInfo, measures: frozenset[str]) -> str | None:
    """The measured column every aggregate reads, if the answer can come from per-sensor
    aggregates of it (see the module docstring), else None."""
    if b.table is not None or b.distinct_args or b.right is not None:
        return None
    args = set()
    for a in b.aggregates:
        if a.distinct or a.func not in ("COUNT", "SUM", "AVG", "MIN", "MAX"):
            return None
        if a.arg is None:
            continue
        if not isinstance(a.arg, ast.Column) or a.arg.name not in measures:
            return None
        args.add(a.arg.name)
    if len(args) > 1:
        return None
    measure = next(iter(args), None)
    time = info.schema.time
    q = b.query
    outside = [i.expr for i in q.select if isinstance(i, ast.SelectItem)]
    outside += list(q.group_by) + ([q.having] if q.having is not None else [])
    outside += [o.expr for o in q.order_by]
    outside += [c for c in b.where if _time_compare(c, time) is None]
    for e in outside:
        for n in walk(e):
            if isinstance(n, ast.Aggregate):
                continue
            if isinstance(n, ast.Column) and (n.name in measures or n.name == time):
                if not _inside_aggregate(e, n):
                    return None
            if isinstance(n, ast.Now):
                return None
    if measure is None:  # COUNT(*) alone: any measure's cells count the rows
        measure = next(iter(sorted(measures)), None)
    return measure


def _inside_aggregate(expr: ast.Expr, col: ast.Column) -> bool:
    for n in walk(expr):
        if isinstance(n, ast.Aggregate) and n.arg is not None:
            if any(m is col for m in walk(n.arg)):
                return True
    return False


def _order(
    items: tuple[ast.OrderItem, ...], columns: tuple[str, ...]
) -> tuple[tuple[int, bool], ...]:
    """A snapshot's ORDER BY without aggregates: by result column name or 1-based position."""
    out = []
    for item in items:
        e = item.expr
        if isinstance(e, ast.Column) and e.table is None and e.name in columns:
            out.append((columns.index(e.name), item.descending))
        elif (
            isinstance(e, ast.Literal)
            and isinstance(e.value, int)
            and not isinstance(e.value, bool)
            and 1 <= e.value <= len(columns)
        ):
            out.append((e.value - 1, item.descending))
        else:
            raise ClauseError(
                "ORDER BY of a snapshot without aggregates names a result column "
                f"({', '.join(columns)}) or its position",
                getattr(e, "pos", None),
            )
    return tuple(out)
