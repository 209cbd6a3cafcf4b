"""The results of the analysis: a bound query (every name resolved, every expression typed,
every clause checked) and a bound UNION ALL, which both engines build from.

Bound values that thousands of installed queries have alike (tuples of names, resolved
columns, column maps) are interned: one shared copy each.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import TypeVar

from fjords.compile.analysis.nodes import nodes_of
from fjords.compile.sql import ast
from fjords.demand import Demand
from fjords.runtime.predicate_index import Atom
from fjords.schema import Schema
from fjords.tables import Table

WINDOW_COLUMNS = ("window_start", "window_end")
CHANGES_COLUMNS = ("final", "as_of")  # after the window bounds, in EMIT CHANGES results


MAX_DURATION_S = 1e12  # about 31,700 years: past it, milliseconds stop being exact integers


STREAM, TABLE = "s", "t"


RIGHT = "r"  # the second stream of a stream-stream join (STREAM is the first)


@dataclass(frozen=True, slots=True)
class ColumnRef:
    """A resolved column: which side (`"s"` the stream, `"t"` the table, `"r"` the second
    stream of a stream-stream join), where, what type."""

    side: str
    index: int
    name: str
    type: str


@dataclass(frozen=True, slots=True)
class WindowSpec:
    """A window as both engines run it: seconds for RANGE/SLIDE, row counts for ROWS."""

    range: float
    slide: float
    rows: bool


@dataclass(frozen=True)
class StreamJoinSide:
    """The second stream of a stream-stream join, as the first's fields of BoundQuery say it."""

    stream: str
    alias: str
    schema: Schema
    filters: tuple[ast.Expr, ...]  # conjuncts on this stream alone (before the join)
    atoms: tuple[Atom, ...]  # the indexable ones (its router's predicate index)
    residual: tuple[ast.Expr, ...]  # the rest of them
    demand: Demand  # what the query needs from this stream's sensors


@dataclass(frozen=True, slots=True)
class BoundQuery:
    """A query with every name resolved, every expression typed and every clause checked.

    Slots, and `refs`, `columns`, `select_names` and `demand.fields` shared between queries
    of the same shape (`interned`): thousands of installed queries each keep one."""

    query: ast.Query
    stream: str
    stream_alias: str
    schema: Schema
    table: Table | None
    table_alias: str
    window: WindowSpec | None  # the stream's window (checked against the limits)
    windowed: bool  # aggregates or GROUP BY: results per window
    refs: Mapping[tuple[str | None, str], ColumnRef]  # (qualifier, name) -> column
    aggregates: tuple[ast.Aggregate, ...]  # distinct calls of SELECT and HAVING, in order
    agg_args: tuple[ast.Expr, ...]  # their distinct arguments: one value slot each
    where: tuple[ast.Expr, ...]  # WHERE conjuncts, literals cast to their columns' types
    stream_filters: tuple[ast.Expr, ...]  # conjuncts on the stream alone (before any join)
    atoms: tuple[Atom, ...]  # the indexable ones among them (the router's predicate index)
    residual: tuple[ast.Expr, ...]  # stream conditions that are not atoms
    join_keys: tuple[tuple[ColumnRef, ColumnRef], ...]  # (stream column, table column)
    post_join: tuple[ast.Expr, ...]  # conditions checked on joined rows (not equi-join keys)
    needed: tuple[ColumnRef, ...]  # stream columns a partial aggregate keeps for after a join
    select_names: tuple[str, ...]  # the SELECT list's names (stars expanded)
    columns: tuple[str, ...]  # result columns: select_names (+ window_start/end when windowed)
    demand: Demand
    # COUNT(DISTINCT x): the distinct arguments (one set of values each), apart from agg_args
    distinct_args: tuple[ast.Expr, ...] = ()
    # Per window: ORDER BY keys as (position, descending) in the result row extended by
    # `order_exprs` (hidden sort columns after `columns`), LIMIT, and DISTINCT over result rows
    # (SELECT DISTINCT with aggregates; without them it became GROUP BY, see `analyze`).
    order: tuple[tuple[int, bool], ...] = ()
    order_exprs: tuple[ast.Expr, ...] = ()
    limit: int | None = None
    distinct_rows: bool = False
    # A stream-stream join (`right` set): the second stream, joined with the first on
    # `join_keys` (first stream's column, second's) within the same tumbling window (`window`);
    # `stream_filters`/`atoms`/`residual` are the first stream's filters, `right.filters`/
    # `.atoms`/`.residual` the second's, `post_join` the conditions across both; `demand` is the
    # first stream's, `right.demand` the second's. None without such a join.
    right: StreamJoinSide | None = None

    @property
    def stream_join(self) -> bool:
        """Whether the query joins two streams (see `right`)."""
        return self.right is not None

    @property
    def per_window(self) -> bool:
        """Whether results are shaped per window after the Finish (DISTINCT, ORDER BY, LIMIT)."""
        return bool(self.order or self.limit is not None or self.distinct_rows)

    # -- lookups (never resolution: every column was resolved by `analyze`) ---------------------
    def ref(self, col: ast.Column) -> ColumnRef | None:
        """The column a reference means; None for the window bounds `window_start`/`window_end`
        of a windowed query when no source has such a column."""
        return self.refs.get((col.table, col.name))

    def sides(self, expr: ast.Expr) -> set[str]:
        """Which sides an expression reads: "s", "t", and "now" for NOW."""
        out: set[str] = set()
        for node in nodes_of(expr):
            if isinstance(node, ast.Column):
                r = self.ref(node)
                if r is not None:
                    out.add(r.side)
            elif isinstance(node, ast.Now):
                out.add("now")
        return out

    @property
    def time_column(self) -> str | None:
        return self.schema.time

    def window_slot(self, col: ast.Column) -> str | None:
        """`window_start`/`window_end` when the column means a window bound, else None."""
        if col.table is None and col.name in WINDOW_COLUMNS and self.ref(col) is None:
            return col.name
        return None


_T = TypeVar("_T")


def same_or_tuple(whole: tuple[_T, ...], part: list[_T]) -> tuple[_T, ...]:
    """`part` as a tuple: `whole` itself when it holds the same items (a query's stream
    filters are usually its whole WHERE clause; no second tuple kept per query)."""
    if len(part) == len(whole) and all(a is b for a, b in zip(part, whole, strict=True)):
        return whole
    return tuple(part)


def interned(value: _T) -> _T:
    """One shared copy of an immutable value that many queries have alike (tuples of names,
    resolved columns: strings and ints, never floats, which would equal ints): an installed
    query keeps no copy of its own."""
    return _intern(value)  # type: ignore[return-value]  # the cache returns what it was given


@lru_cache(maxsize=4096)  # bounded: the cache cannot grow with distinct shapes
def _intern(value: object) -> object:
    return value


@lru_cache(maxsize=4096)
def frozen_refs(
    items: tuple[tuple[tuple[str | None, str], ColumnRef], ...],
) -> Mapping[tuple[str | None, str], ColumnRef]:
    """A read-only `refs` mapping, one per distinct set of resolved columns (see `interned`)."""
    return MappingProxyType(dict(items))


# A row-by-row branch of a union carries its sample's time as a hidden last column (the zipper
# merge orders by it and cuts it off); a windowed branch is ordered by its window_end.
UNION_TIME = "__union_time"


@dataclass(frozen=True)
class BoundUnion:
    """A UNION ALL with every branch analysed (`analyze`) and the branches checked alike: the
    same number of columns, of compatible kinds (integers among floats become floats), all
    windowed or none. Both engines build from `branches`: the Fjord merges their outputs in
    sample-time order (fjords.runtime.operators.joins.ZipperMerge), Spark unions their DataFrames."""

    union: ast.Union
    branches: tuple[BoundQuery, ...]
    columns: tuple[str, ...]  # the result's names: the first branch's (+ window bounds)
    types: tuple[str, ...]  # the result columns' kinds (int, float, str, bool, null)
    width: int  # how many leading columns of a branch's row are the union's row
    time_index: int  # where a branch's row holds the time the merge orders by
    windowed: bool

    @property
    def streams(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(b.stream for b in self.branches))

    @property
    def demands(self) -> tuple[Demand, ...]:
        return tuple(b.demand for b in self.branches)
