"""One semantic analysis of a parsed query, shared by both engines.

`analyze` resolves every name against the catalog, types every expression, checks every clause
and splits the WHERE clause, once; the result is a frozen `BoundQuery`. The Fjord planner
(fjords.compile.planner) builds operators from it and the Spark compiler (gateway.spark.compiler) builds
DataFrames from it: neither resolves a name again, so the two engines cannot drift apart on
names, output columns, join keys, filters or errors. Semantic errors carry the line and column of
the offending token and, for unknown names, the names that exist.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, fields, is_dataclass, replace
from functools import lru_cache
from types import MappingProxyType
from typing import TypeVar

from fjords.catalog import Catalog, StreamInfo
from fjords.compile.expressions import children, coerce_literals, conjuncts, walk
from fjords.compile.sql import ast
from fjords.compile.typecheck import TypeChecker
from fjords.demand import Demand
from fjords.errors import ClauseError, QueryError, QueryPlanError, UnknownNameError
from fjords.limits import DEFAULT_LIMITS, Limits
from fjords.runtime.predicate_index import Atom
from fjords.schema import Schema
from fjords.tables import Table

WINDOW_COLUMNS = ("window_start", "window_end")
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
    of the same shape (`_interned`): thousands of installed queries each keep one."""

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
        for node in _walk(expr):
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


# -- scope ----------------------------------------------------------------------------------


class Scope:
    """Name resolution over the query's sources: one stream and at most one static table, or
    two streams (a stream-stream join, `right`)."""

    def __init__(self, query: ast.Query, catalog: Catalog) -> None:
        self.stream: StreamInfo | None = None
        self.stream_alias = ""
        self.window: ast.Window | None = None
        self.tables: list[tuple[str, Table]] = []
        # A stream-stream join's second stream (`_check_stream_join` checks the rule).
        self.right: StreamInfo | None = None
        self.right_alias = ""
        self.right_window: ast.Window | None = None
        self.right_pos: ast.Pos = None
        self._resolved: dict[tuple[str | None, str], ColumnRef] = {}
        for ref in query.sources:
            if ref.name not in catalog.streams and ref.name not in catalog.tables:
                known = sorted([*catalog.streams, *catalog.tables])
                raise UnknownNameError("stream or table", ref.name, known, ref.pos)
            obj = catalog.lookup(ref.name)
            alias = ref.alias or ref.name
            if isinstance(obj, StreamInfo):
                if self.right is not None:
                    raise QueryPlanError(
                        f"a query joins at most two streams; {ref.name!r} would be the third",
                        *(ref.pos or (None, None)),
                    )
                if self.stream is not None:
                    if alias == self.stream_alias:
                        raise QueryPlanError(
                            f"two sources are named {alias!r}: give each stream of the join "
                            f"its own alias, e.g. FROM {self.stream.name} AS a [RANGE 5 MINUTES], "
                            f"{obj.name} AS b [RANGE 5 MINUTES]",
                            *(ref.pos or (None, None)),
                        )
                    self.right, self.right_alias, self.right_window = obj, alias, ref.window
                    self.right_pos = ref.pos
                    continue
                self.stream, self.stream_alias, self.window = obj, alias, ref.window
            else:
                if ref.window is not None:
                    raise ClauseError(
                        f"a window applies to a stream; {ref.name!r} is a static table",
                        ref.window.pos,
                    )
                self.tables.append((alias, obj))
        if self.stream is None:
            first = query.sources[0].pos if query.sources else None
            raise QueryPlanError(
                "a continuous query needs a sensor stream in FROM", *(first or (None, None))
            )
        if len(self.tables) > 1:
            second = [r for r in query.sources if r.name in catalog.tables][1].pos
            raise QueryPlanError(
                "joining more than one static table per query is not supported yet",
                *(second or (None, None)),
            )
        self.table_alias, self.table = self.tables[0] if self.tables else ("", None)
        if self.right is not None and self.table is not None:
            raise QueryPlanError(
                "a join of two streams with a static table is not supported; join the two "
                "streams, or one stream with the table",
                *([r for r in query.sources if r.name in catalog.tables][0].pos or (None, None)),
            )

    @property
    def schema(self) -> Schema:
        assert self.stream is not None
        return self.stream.schema

    def _ref(self, side: str, schema: Schema, name: str) -> ColumnRef:
        i = schema.index(name)
        return _interned(ColumnRef(side, i, name, schema.fields[i].type))

    def resolve(self, col: ast.Column) -> ColumnRef:
        """The column a name means (QueryError if none, or two): each name once per query,
        for the several checks that ask."""
        key = (col.table, col.name)
        got = self._resolved.get(key)
        if got is None:
            got = self._resolved[key] = self._resolve(col)
        return got

    def _resolve(self, col: ast.Column) -> ColumnRef:
        s = self.schema
        if col.table is not None:
            if col.table == self.stream_alias:
                if col.name not in s:
                    raise UnknownNameError(
                        "column", col.name, s.names, col.pos, f" in stream {self.stream_alias!r}"
                    )
                return self._ref(STREAM, s, col.name)
            if self.right is not None and col.table == self.right_alias:
                rs = self.right.schema
                if col.name not in rs:
                    raise UnknownNameError(
                        "column", col.name, rs.names, col.pos, f" in stream {self.right_alias!r}"
                    )
                return self._ref(RIGHT, rs, col.name)
            if self.table is not None and col.table == self.table_alias:
                ts = self.table.schema
                if col.name not in ts:
                    raise UnknownNameError(
                        "column", col.name, ts.names, col.pos, f" in table {self.table_alias!r}"
                    )
                return self._ref(TABLE, ts, col.name)
            raise UnknownNameError(
                "table or alias", col.table, self.aliases, col.pos, f" in {col.table}.{col.name}"
            )
        in_s = col.name in s
        if self.right is not None:
            in_r = col.name in self.right.schema
            if in_s and in_r:
                raise QueryPlanError(
                    f"column {col.name!r} is ambiguous: qualify it with {self.stream_alias!r} "
                    f"or {self.right_alias!r}",
                    *(col.pos or (None, None)),
                )
            if in_r:
                return self._ref(RIGHT, self.right.schema, col.name)
        in_t = self.table is not None and col.name in self.table.schema
        if in_s and in_t:
            raise QueryPlanError(
                f"column {col.name!r} is ambiguous: qualify it with {self.stream_alias!r} "
                f"or {self.table_alias!r}",
                *(col.pos or (None, None)),
            )
        if in_s:
            return self._ref(STREAM, s, col.name)
        if in_t:
            return self._ref(TABLE, self.table.schema, col.name)  # type: ignore[union-attr]
        raise UnknownNameError("column", col.name, self.column_names, col.pos)

    def known(self, col: ast.Column) -> bool:
        try:
            self.resolve(col)
            return True
        except QueryError:
            return False

    @property
    def aliases(self) -> list[str]:
        return [a for a in (self.stream_alias, self.right_alias, self.table_alias) if a]

    @property
    def column_names(self) -> list[str]:
        """Every column a bare name can mean, stream first, each once."""
        names = list(self.schema.names)
        if self.right is not None:
            names += [n for n in self.right.schema.names if n not in names]
        if self.table is not None:
            names += [n for n in self.table.schema.names if n not in names]
        return names


# -- analysis -------------------------------------------------------------------------------


def analyze(query: ast.Query, catalog: Catalog, limits: Limits = DEFAULT_LIMITS) -> BoundQuery:
    """Resolve, type and check `query` against `catalog`; raises QueryError (with line and
    column where the query text has them) for anything either engine would refuse."""
    outer = getattr(_local, "nodes", None)
    _local.nodes = {} if outer is None else outer
    try:
        return _analyze(query, catalog, limits)
    finally:
        _local.nodes = outer


_local = threading.local()


def _walk(expr: ast.Expr) -> Iterable[ast.Expr]:
    """`walk`, listed once per expression during an analysis: its checks walk the same few
    expressions ~15 times (a third of the time analysing a simple filter took). By identity:
    an equal expression elsewhere in the query has other positions. The list holds the
    expression, so its id is not reused while the analysis lasts."""
    seen = getattr(_local, "nodes", None)
    if seen is None:
        return walk(expr)
    got = seen.get(id(expr))
    if got is None:
        got = seen[id(expr)] = (expr, list(walk(expr)))
    return got[1]


def _analyze(query: ast.Query, catalog: Catalog, limits: Limits) -> BoundQuery:
    scope = Scope(query, catalog)
    distinct = query.distinct
    query, distinct_rows = _rewrite_distinct(query, scope)
    names = _select_names(query, scope)
    hidden = _order_hidden(query, names, distinct)
    refs = _resolve_all(query, scope, hidden)
    query, hidden = _promote_numbers(query, scope, hidden)
    _check_in_lists(query, limits)
    aggs = collect_aggregates(query, hidden)
    windowed = bool(aggs or query.group_by)
    _check_order_limit(query, windowed)
    if scope.right is not None:
        _check_stream_join(query, scope, windowed)
    # A stream-stream join's window scopes the join, so it means something without aggregates.
    check_clauses(query, windowed, scope.window if windowed or scope.right is None else None)
    _check_options(query)
    where = tuple(_coerce(c, scope) for c in conjuncts(query.where))
    _type_check(query, scope, where, hidden)
    window = (
        WindowSpec(*_window(scope.window, query.emit_every_s, limits)) if scope.window else None
    )

    def sides(e: ast.Expr) -> set[str]:
        out = set()
        for node in _walk(e):
            if isinstance(node, ast.Column) and (node.table, node.name) in refs:
                out.add(refs[(node.table, node.name)].side)
            elif isinstance(node, ast.Now):
                out.add("now")
        return out

    only_stream = [sides(c) <= {STREAM} for c in where]
    stream_only = [c for c, only in zip(where, only_stream, strict=True) if only]
    others = [c for c, only in zip(where, only_stream, strict=True) if not only]
    atoms, residual = _split_atoms(stream_only, refs)
    stream_filters = list(stream_only)
    right_side = None
    if scope.right is not None:
        right_side, others = _right_side(scope, others, refs, sides)
    elif scope.table is None:
        # Stream-only conditions involving NOW (the sample time here) are simply residual.
        residual, stream_filters, others = residual + others, stream_filters + others, []
    join_keys, post_join = _join_keys(others, refs)
    if scope.right is not None and not join_keys:
        raise QueryPlanError(
            "a join of two streams needs an equality between a column of each in WHERE (the "
            f"join key, e.g. {scope.stream_alias}.segment = {scope.right_alias}.segment); "
            "other conditions across both are then checked on each pair",
            *(scope.right_pos or (None, None)),
        )
    if windowed and scope.window is None:
        raise ClauseError(
            "aggregates over a stream need a window: add [RANGE 15 MINUTES] or [ROWS 100] "
            "after the stream",
            query.pos_of("GROUP BY") or (aggs[0].pos if aggs else None),
        )
    for k in query.group_by:
        for n in _walk(k):
            if isinstance(n, ast.Aggregate):
                raise QueryPlanError("GROUP BY cannot contain aggregates", *(n.pos or (None, None)))
    agg_args: list[ast.Expr] = []
    distinct_args: list[ast.Expr] = []
    for a in aggs:
        args = distinct_args if a.distinct else agg_args
        if a.arg is not None and a.arg not in args:
            args.append(a.arg)
    needed: list[ColumnRef] = []
    if windowed:
        if scope.table is not None:
            for a in aggs:
                if a.arg is not None and TABLE in sides(a.arg):
                    raise QueryPlanError(
                        "aggregates over static-table columns are not supported; aggregate "
                        "stream columns",
                        *(a.pos or (None, None)),
                    )
        if any(isinstance(i, ast.Star) for i in query.select):
            raise QueryError(
                "SELECT * cannot be combined with GROUP BY or aggregates; name the columns"
            )
        _check_grouped(query, refs, hidden)
        if scope.table is not None:
            needed = _needed(query, refs, post_join, join_keys, hidden)
    _check_unique(names, query)
    columns = (*names, *[c for c in WINDOW_COLUMNS if c not in names]) if windowed else names
    order = _order_positions(query, columns, hidden)
    frozen_refs = _frozen_refs(tuple(refs.items()))
    bound = BoundQuery(
        query=query,
        stream=scope.stream.name,  # type: ignore[union-attr]
        stream_alias=scope.stream_alias,
        schema=scope.schema,
        table=scope.table,
        table_alias=scope.table_alias,
        window=window,
        windowed=windowed,
        refs=frozen_refs,
        aggregates=tuple(aggs),
        agg_args=tuple(agg_args),
        where=where,
        stream_filters=_same_or_tuple(where, stream_filters),
        atoms=tuple(atoms),
        residual=tuple(residual),
        join_keys=tuple(join_keys),
        post_join=tuple(post_join),
        needed=tuple(needed),
        select_names=_interned(tuple(names)),
        columns=_interned(tuple(columns)),
        demand=None,  # type: ignore[arg-type]  # set just below, from the bound query itself
        distinct_args=tuple(distinct_args),
        order=order,
        order_exprs=tuple(hidden),
        limit=query.limit,
        distinct_rows=distinct_rows,
        right=right_side,
    )
    if right_side is not None:
        object.__setattr__(bound, "demand", _join_demand(bound, STREAM))
        object.__setattr__(right_side, "demand", _join_demand(bound, RIGHT))
    else:
        object.__setattr__(bound, "demand", _demand(bound))
    return bound


_T = TypeVar("_T")


def _same_or_tuple(whole: tuple[_T, ...], part: list[_T]) -> tuple[_T, ...]:
    """`part` as a tuple: `whole` itself when it holds the same items (a query's stream
    filters are usually its whole WHERE clause; no second tuple kept per query)."""
    if len(part) == len(whole) and all(a is b for a, b in zip(part, whole, strict=True)):
        return whole
    return tuple(part)


def _interned(value: _T) -> _T:
    """One shared copy of an immutable value that many queries have alike (tuples of names,
    resolved columns: strings and ints, never floats, which would equal ints): an installed
    query keeps no copy of its own."""
    return _intern(value)


@lru_cache(maxsize=4096)  # bounded: the cache cannot grow with distinct shapes
def _intern(value: object) -> object:
    return value


@lru_cache(maxsize=4096)
def _frozen_refs(
    items: tuple[tuple[tuple[str | None, str], ColumnRef], ...],
) -> Mapping[tuple[str | None, str], ColumnRef]:
    """A read-only `refs` mapping, one per distinct set of resolved columns (see `_interned`)."""
    return MappingProxyType(dict(items))


def _check_stream_join(query: ast.Query, scope: Scope, windowed: bool) -> None:
    """The rule of a stream-stream join: both streams have the same tumbling time window
    (`[RANGE r]`, no SLIDE), and a pair joins when both tuples fall in the same window; ROWS
    windows, SLIDE, EMIT EVERY and NOW are refused (each at its position), and so are the
    window bounds where there are no windowed results (no aggregates)."""
    assert scope.right is not None
    if not windowed:
        for e in _all_exprs(query):
            for node in _walk(e):
                if (
                    isinstance(node, ast.Column)
                    and node.table is None
                    and node.name in WINDOW_COLUMNS
                    and not scope.known(node)
                ):
                    raise QueryPlanError(
                        f"{node.name} is a column of windowed results: without GROUP BY or an "
                        "aggregate a join of two streams outputs each pair as it is found; "
                        "select the streams' time columns instead",
                        *(node.pos or (None, None)),
                    )
    sides = (
        (scope.stream_alias, scope.window, query.sources[0].pos),
        (scope.right_alias, scope.right_window, scope.right_pos),
    )
    rule = (
        "a join of two streams pairs tuples that fall in the same tumbling window, so both "
        "streams need the same [RANGE r] window without SLIDE, e.g. FROM traffic AS a "
        "[RANGE 5 MINUTES], traffic AS b [RANGE 5 MINUTES]"
    )
    for alias, w, pos in sides:
        if w is None:
            raise ClauseError(f"stream {alias!r} has no window: {rule}", pos)
        if w.rows is not None:
            raise ClauseError(
                f"ROWS windows cannot scope a join of two streams (stream {alias!r}): {rule}",
                w.pos,
            )
        if w.slide_s is not None:
            raise ClauseError(f"SLIDE on stream {alias!r}: {rule}", w.pos)
    (_, lw, _), (ralias, rw, _) = sides
    assert lw is not None and rw is not None
    if lw.range_s != rw.range_s:
        raise ClauseError(
            f"the windows differ (RANGE {_duration_text(lw.range_s or 0.0)} and "
            f"RANGE {_duration_text(rw.range_s or 0.0)}): {rule}",
            rw.pos,
        )
    if query.emit_every_s is not None:
        raise ClauseError(
            f"EMIT EVERY cannot be used with a join of two streams: {rule}; the results of "
            "each window are output when it closes",
            query.pos_of("EMIT EVERY"),
        )
    for e in _all_exprs(query):
        for node in _walk(e):
            if isinstance(node, ast.Now):
                raise QueryPlanError(
                    "NOW is not supported in a join of two streams; compare the streams' time "
                    f"columns instead (e.g. {scope.stream_alias}.time <= {ralias}.time)",
                    *(node.pos or (None, None)),
                )


def _right_side(
    scope: Scope,
    others: list[ast.Expr],
    refs: Mapping,
    sides: Callable[[ast.Expr], set[str]],
) -> tuple[StreamJoinSide, list[ast.Expr]]:
    """The second stream's own filters (atoms for its router, the rest residual), and the
    conditions left for the join (keys and conditions across both streams)."""
    assert scope.right is not None
    own = [c for c in others if sides(c) <= {RIGHT}]
    rest = [c for c in others if not sides(c) <= {RIGHT}]
    atoms, residual = _split_atoms(own, refs)
    side = StreamJoinSide(
        stream=scope.right.name,
        alias=scope.right_alias,
        schema=scope.right.schema,
        filters=tuple(own),
        atoms=tuple(atoms),
        residual=tuple(residual),
        demand=None,  # type: ignore[arg-type]  # set by analyze, from the bound query
    )
    return side, rest


def _join_demand(b: BoundQuery, side: str) -> Demand:
    """What a stream-stream join needs from one of its streams' sensors: every reading with
    the fields it reads (the join needs raw readings; each side's filter differs, so no
    filter or aggregate is pushed down: the safe side, see proxies.demand)."""
    query = b.query
    schema = b.schema if side == STREAM else b.right.schema  # type: ignore[union-attr]
    stream = b.stream if side == STREAM else b.right.stream  # type: ignore[union-attr]
    used: list[str] = []
    if any(isinstance(i, ast.Star) for i in query.select):
        used = list(schema.names)
    same = b.right is not None and b.right.stream == b.stream  # a self-join: both sides
    for e in _all_exprs(query):
        for node in _walk(e):
            if isinstance(node, ast.Column):
                r = b.ref(node)
                if r is None:
                    continue
                if (r.side == side or (same and r.side in (STREAM, RIGHT))) and r.name not in used:
                    used.append(r.name)
    if schema.time is not None and schema.time not in used:
        used.append(schema.time)  # the window of each tuple
    return Demand(
        stream=stream,
        sample_period_s=query.sample_period_s,
        lifetime_s=query.lifetime_s,
        fields=tuple(used),
        atoms=(),
        filtered_only_by_atoms=False,
        aggregates=(),
        window=None,
        group_by=(),
    )


def _rewrite_distinct(query: ast.Query, scope: Scope) -> tuple[ast.Query, bool]:
    """SELECT DISTINCT without aggregates is GROUP BY its items, per window (both engines run
    that); with aggregates or GROUP BY it removes duplicate result rows of each window.
    Returns the query to plan and whether result rows are deduplicated."""
    if not query.distinct:
        return query, False
    if scope.window is None:
        raise ClauseError(
            "SELECT DISTINCT over a stream needs a window (an unbounded stream never ends, so "
            "its distinct values never do): e.g. SELECT DISTINCT segment FROM traffic "
            "[RANGE 15 MINUTES]",
            query.pos_of("DISTINCT"),
        )
    exprs = [i.expr for i in query.select if isinstance(i, ast.SelectItem)]
    if query.having is not None:
        exprs.append(query.having)
    if query.group_by or any(isinstance(n, ast.Aggregate) for e in exprs for n in _walk(e)):
        return query, True
    items: list[ast.SelectItem] = []
    for item in query.select:
        if isinstance(item, ast.SelectItem):
            items.append(item)
            continue
        sides: list[tuple[str, Schema]] = []
        if item.table in (None, scope.stream_alias):
            sides.append((scope.stream_alias, scope.schema))
        if scope.right is not None and item.table in (None, scope.right_alias):
            sides.append((scope.right_alias, scope.right.schema))
        if scope.table is not None and item.table in (None, scope.table_alias):
            sides.append((scope.table_alias, scope.table.schema))
        for alias, schema in sides:
            if scope.right is not None:  # named as `_select_names` names a join's stars
                items += [
                    ast.SelectItem(ast.Column(alias, n), f"{alias}.{n}") for n in schema.names
                ]
                continue
            items += [ast.SelectItem(ast.Column(alias, n)) for n in schema.names]
    rewritten = replace(
        query, select=tuple(items), group_by=tuple(i.expr for i in items), distinct=False
    )
    return rewritten, False


def _is_output_ref(e: ast.Expr, names: list[str]) -> bool:
    if isinstance(e, ast.Literal) and isinstance(e.value, int) and not isinstance(e.value, bool):
        return True
    return (
        isinstance(e, ast.Column)
        and e.table is None
        and (e.name in names or e.name in WINDOW_COLUMNS)
    )


def _order_hidden(query: ast.Query, names: list[str], distinct: bool) -> list[ast.Expr]:
    """ORDER BY expressions that are not result columns: computed as hidden sort columns."""
    hidden: list[ast.Expr] = []
    for item in query.order_by:
        e = item.expr
        if _is_output_ref(e, names) or e in hidden:
            continue
        if distinct:
            raise QueryPlanError(
                f"with SELECT DISTINCT, ORDER BY must name result columns; "
                f"{ast.to_sql(e)} is not one",
                *(e.pos or (None, None)),
            )
        hidden.append(e)
    return hidden


def _check_order_limit(query: ast.Query, windowed: bool) -> None:
    """ORDER BY and LIMIT apply to each window's results: refused where there is none."""
    if not query.order_by and query.limit is None:
        return
    clause = "ORDER BY" if query.order_by else "LIMIT"
    if not windowed:
        raise ClauseError(
            f"{clause} applies to each window's results, and this query has no windowed "
            "aggregate: an unbounded stream cannot be sorted; aggregate over a window, e.g. "
            "SELECT segment, AVG(speed) AS s FROM traffic [RANGE 15 MINUTES] GROUP BY segment "
            "ORDER BY s LIMIT 5",
            query.pos_of(clause),
        )
    if query.limit is not None:
        if not query.order_by:
            raise ClauseError(
                "LIMIT needs ORDER BY to say which rows of each window to keep, e.g. "
                "ORDER BY avg_speed LIMIT 5",
                query.pos_of("LIMIT"),
            )
        if query.limit < 1:
            raise ClauseError("LIMIT must be at least 1", query.pos_of("LIMIT"))


def _order_positions(
    query: ast.Query, columns: tuple[str, ...] | list[str], hidden: list[ast.Expr]
) -> tuple[tuple[int, bool], ...]:
    out: list[tuple[int, bool]] = []
    n = len(query.select)
    for item in query.order_by:
        e = item.expr
        if (
            isinstance(e, ast.Literal)
            and isinstance(e.value, int)
            and not isinstance(e.value, bool)
        ):
            if not 1 <= e.value <= n:
                raise QueryPlanError(
                    f"ORDER BY {e.value}: the SELECT list has {n} item{'s' if n != 1 else ''}",
                    *(e.pos or (None, None)),
                )
            pos = e.value - 1
        elif isinstance(e, ast.Column) and e.table is None and e.name in columns:
            pos = list(columns).index(e.name)
        else:
            pos = len(columns) + hidden.index(e)
        out.append((pos, item.descending))
    return tuple(out)


_MIXING = ("COALESCE", "LEAST", "GREATEST")


def _promote_numbers(
    query: ast.Query, scope: Scope, hidden: list[ast.Expr]
) -> tuple[ast.Query, list[ast.Expr]]:
    """COALESCE, LEAST, GREATEST and CASE whose values mix integers and floats give floats, as
    on Spark: their integer values are made floats (`LEAST(speed, 30)` is 30.0, not 30)."""
    checker = TypeChecker(lambda col: _column_type(col, scope))

    def kind(e: ast.Expr) -> str:
        try:
            return checker.infer(e)
        except QueryError:  # reported later, in the clause's own order
            return "?"

    def as_float(e: ast.Expr) -> ast.Expr:
        if kind(e) != "int":
            return e
        if isinstance(e, ast.Literal):
            return ast.Literal(float(e.value), e.pos)  # type: ignore[arg-type]
        return ast.Func("FLOAT", (e,), e.pos)

    def fix(e: ast.Expr) -> ast.Expr:
        e = _map_children(e, fix)
        if isinstance(e, ast.Func) and e.name in _MIXING and kind(e) == "float":
            return ast.Func(e.name, tuple(map(as_float, e.args)), e.pos)
        if isinstance(e, ast.Case) and kind(e) == "float":
            whens = tuple((c, as_float(v)) for c, v in e.whens)
            other = as_float(e.otherwise) if e.otherwise is not None else None
            return ast.Case(whens, other, e.pos)
        return e

    if not any(
        isinstance(n, ast.Func | ast.Case) for e in [*_all_exprs(query), *hidden] for n in _walk(e)
    ):
        return query, hidden
    select = tuple(
        replace(i, expr=fix(i.expr)) if isinstance(i, ast.SelectItem) else i for i in query.select
    )
    having = fix(query.having) if query.having is not None else None
    order_by = tuple(replace(o, expr=fix(o.expr)) for o in query.order_by)
    query = replace(
        query,
        select=select,
        group_by=tuple(map(fix, query.group_by)),
        having=having,
        order_by=order_by,
    )
    return query, [fix(e) for e in hidden]


def _map_children(e: ast.Expr, fn: Callable[[ast.Expr], ast.Expr]) -> ast.Expr:
    """`e` with `fn` applied to each direct sub-expression (a new node only if one changed)."""
    if not children(e):
        return e

    def conv(v: object) -> object:
        if isinstance(v, tuple):
            return tuple(conv(x) for x in v)
        if v is not None and is_dataclass(v) and hasattr(v, "pos"):
            return fn(v)  # type: ignore[arg-type]
        return v

    changes = {}
    for f in fields(e):  # type: ignore[arg-type]
        if f.name == "pos":
            continue
        old = getattr(e, f.name)
        new = conv(old)
        if new != old or new is not old:
            changes[f.name] = new
    return replace(e, **changes) if changes else e  # type: ignore[type-var]


def _column_type(col: ast.Column, scope: Scope) -> str:
    if col.table is None and col.name in WINDOW_COLUMNS and not scope.known(col):
        return "float"
    return scope.resolve(col).type


def _all_exprs(query: ast.Query) -> list[ast.Expr]:
    exprs: list[ast.Expr] = [i.expr for i in query.select if isinstance(i, ast.SelectItem)]
    exprs += list(query.group_by)
    exprs += [e for e in (query.where, query.having) if e is not None]
    return exprs


def _resolve_all(
    query: ast.Query, scope: Scope, hidden: list[ast.Expr]
) -> dict[tuple[str | None, str], ColumnRef]:
    """Every column reference of the query, resolved once (errors at the first unknown one)."""
    refs: dict[tuple[str | None, str], ColumnRef] = {}
    for e in [*_all_exprs(query), *hidden]:
        for node in _walk(e):
            if not isinstance(node, ast.Column) or (node.table, node.name) in refs:
                continue
            if node.table is None and node.name in WINDOW_COLUMNS:
                if scope.known(node):
                    refs[(None, node.name)] = scope.resolve(node)
                continue
            refs[(node.table, node.name)] = scope.resolve(node)
    for item in query.select:
        if isinstance(item, ast.Star) and item.table not in (None, *scope.aliases):
            raise UnknownNameError("table or alias", item.table, scope.aliases, None)
    if query.where is not None:
        for n in _walk(query.where):
            if isinstance(n, ast.Aggregate):
                raise QueryPlanError(
                    "aggregates are not allowed in WHERE; use HAVING", *(n.pos or (None, None))
                )
    return refs


def collect_aggregates(query: ast.Query, extra: Iterable[ast.Expr] = ()) -> list[ast.Aggregate]:
    """The distinct aggregate calls of SELECT, HAVING (and `extra`: ORDER BY), in order."""
    found: list[ast.Aggregate] = []
    exprs = [i.expr for i in query.select if isinstance(i, ast.SelectItem)]
    if query.having is not None:
        exprs.append(query.having)
    exprs += list(extra)
    for e in exprs:
        for node in _walk(e):
            if isinstance(node, ast.Aggregate) and node not in found:
                if node.arg is not None and any(
                    isinstance(n, ast.Aggregate) for n in _walk(node.arg)
                ):
                    raise QueryPlanError("aggregates cannot be nested", *(node.pos or (None, None)))
                found.append(node)
    return found


def _check_grouped(query: ast.Query, refs: Mapping, hidden: list[ast.Expr]) -> None:
    """Outside aggregates, a windowed query's SELECT and HAVING read only its groups' keys
    (a GROUP BY expression or column) and the window bounds."""
    key_refs = [refs.get((k.table, k.name)) for k in query.group_by if isinstance(k, ast.Column)]

    def visit(e: ast.Expr) -> None:
        if isinstance(e, ast.Aggregate) or e in query.group_by:
            return
        if isinstance(e, ast.Column):
            r = refs.get((e.table, e.name))
            if r is None or r in key_refs:
                return  # a window bound, or a key
            raise QueryPlanError(
                f"column {e.name!r} must appear in GROUP BY or inside an aggregate",
                *(e.pos or (None, None)),
            )
        for c in children(e):
            visit(c)

    for item in query.select:
        if isinstance(item, ast.SelectItem):
            visit(item.expr)
    if query.having is not None:
        visit(query.having)
    for e in hidden:
        visit(e)


def _needed(
    query: ast.Query,
    refs: Mapping,
    post_join: list[ast.Expr],
    join_keys: list[tuple[ColumnRef, ColumnRef]],
    hidden: list[ast.Expr],
) -> list[ColumnRef]:
    """The stream columns a partial aggregate is keyed by so that they survive to the join."""
    needed: list[ColumnRef] = []

    def add(r: ColumnRef | None) -> None:
        if r is not None and r.side == STREAM and r not in needed:
            needed.append(r)

    exprs: list[ast.Expr] = [*query.group_by, *post_join]
    exprs += [i.expr for i in query.select if isinstance(i, ast.SelectItem)]
    if query.having is not None:
        exprs.append(query.having)
    exprs += hidden

    def outside(e: ast.Expr) -> Iterator[ast.Expr]:
        if isinstance(e, ast.Aggregate):
            return
        yield e
        for c in children(e):
            yield from outside(c)

    for e in exprs:
        for node in outside(e):
            if isinstance(node, ast.Column):
                add(refs.get((node.table, node.name)))
    for s, _ in join_keys:
        add(s)
    return needed


def _select_names(query: ast.Query, scope: Scope) -> list[str]:
    names: list[str] = []
    s = scope.schema
    t = scope.table.schema if scope.table is not None else None
    for n, item in enumerate(query.select):
        if isinstance(item, ast.Star) and scope.right is not None:
            # Two streams: star columns are named by alias (`a.speed`), so both sides'
            # columns (the same ones, in a self-join) keep apart.
            for alias, schema in (
                (scope.stream_alias, s),
                (scope.right_alias, scope.right.schema),
            ):
                if item.table in (None, alias):
                    names += [f"{alias}.{c}" for c in schema.names]
            continue
        if isinstance(item, ast.Star):
            if item.table in (None, scope.stream_alias):
                names += s.names
            if t is not None and item.table in (None, scope.table_alias):
                names += t.names
            continue
        names.append(output_name(item, n))
    return names


def output_name(item: ast.SelectItem, n: int) -> str:
    """A result column's name: the alias, else the column's name (`i.description` ->
    `description`), `max_speed` for `MAX(speed)`, `count` for `COUNT(*)`, else `col<n>`."""
    if item.alias:
        return item.alias
    e = item.expr
    if isinstance(e, ast.Column):
        return e.name
    if isinstance(e, ast.Aggregate):
        if e.arg is None:
            return f"{e.func.lower()}"
        if isinstance(e.arg, ast.Column):
            return f"{e.func.lower()}_{e.arg.name}"
    return f"col{n}"


def _check_unique(names: Iterable[str], query: ast.Query) -> None:
    seen = set()
    for n in names:
        if n in seen:
            pos = next(
                (
                    i.expr.pos
                    for k, i in enumerate(query.select)
                    if isinstance(i, ast.SelectItem) and output_name(i, k) == n
                ),
                None,
            )
            raise QueryPlanError(
                f"two result columns are named {n!r}; give one an alias with AS",
                *(pos or (None, None)),
            )
        seen.add(n)


def _type_check(
    query: ast.Query, scope: Scope, where: tuple[ast.Expr, ...], hidden: list[ast.Expr]
) -> None:
    """Every expression typed from the schemas (fjords.compile.typecheck), WHERE after literal casts."""

    def column_type(col: ast.Column) -> str:
        if col.table is None and col.name in WINDOW_COLUMNS and not scope.known(col):
            return "float"
        return scope.resolve(col).type

    checker = TypeChecker(column_type)
    checker.check_query(
        [i.expr for i in query.select if isinstance(i, ast.SelectItem)],
        where,
        query.group_by,
        query.having,
    )
    for e in hidden:
        checker.infer(e)


def _coerce(expr: ast.Expr, scope: Scope) -> ast.Expr:
    def column_type(col: ast.Column) -> str | None:
        if col.table is None and col.name in WINDOW_COLUMNS and not scope.known(col):
            return None
        return scope.resolve(col).type

    return coerce_literals(expr, column_type)


_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "="}


def _split_atoms(exprs: list[ast.Expr], refs: Mapping) -> tuple[list[Atom], list[ast.Expr]]:
    """The indexable conditions (column op constant) as atoms; the rest stays residual."""

    def idx(c: ast.Column) -> int:
        return refs[(c.table, c.name)].index

    atoms: list[Atom] = []
    rest: list[ast.Expr] = []
    for e in exprs:
        match e:
            case ast.Compare(op=op, left=ast.Column() as c, right=ast.Literal(value=v)) if (
                op in _FLIP and v is not None
            ):
                atoms.append(Atom(idx(c), op, v))
            case ast.Compare(op=op, left=ast.Literal(value=v), right=ast.Column() as c) if (
                op in _FLIP and v is not None
            ):
                atoms.append(Atom(idx(c), _FLIP[op], v))
            case ast.InList(expr=ast.Column() as c, values=vals, negated=False) if all(
                isinstance(x, ast.Literal) and x.value is not None for x in vals
            ):
                atoms.append(Atom(idx(c), "in", frozenset(x.value for x in vals)))  # type: ignore[union-attr]
            case ast.Between(
                expr=ast.Column() as c,
                low=ast.Literal(value=lo),
                high=ast.Literal(value=hi),
                negated=False,
            ) if lo is not None and hi is not None:
                i = idx(c)
                atoms += [Atom(i, ">=", lo), Atom(i, "<=", hi)]
            case _:
                rest.append(e)
    return atoms, rest


def _join_keys(
    others: list[ast.Expr], refs: Mapping
) -> tuple[list[tuple[ColumnRef, ColumnRef]], list[ast.Expr]]:
    """`stream_col = table_col` (or, joining two streams, `first_col = second_col`) conditions
    are the equi-join keys, first stream's column first; the rest are checked after."""
    keys: list[tuple[ColumnRef, ColumnRef]] = []
    rest: list[ast.Expr] = []
    for e in others:
        if (
            isinstance(e, ast.Compare)
            and e.op == "="
            and isinstance(e.left, ast.Column)
            and isinstance(e.right, ast.Column)
        ):
            a = refs.get((e.left.table, e.left.name))
            b = refs.get((e.right.table, e.right.name))
            if (
                a is not None
                and b is not None
                and {a.side, b.side} in ({STREAM, TABLE}, {STREAM, RIGHT})
            ):
                keys.append((a, b) if a.side == STREAM else (b, a))
                continue
        rest.append(e)
    return keys, rest


def _demand(b: BoundQuery) -> Demand:
    s = b.schema
    query = b.query
    used: list[str] = []
    if any(isinstance(i, ast.Star) for i in query.select):
        used = list(s.names)
    for e in _all_exprs(query):
        for node in _walk(e):
            if isinstance(node, ast.Column):
                r = b.ref(node)
                if r is not None and r.side == STREAM and r.name not in used:
                    used.append(r.name)
    window = None
    if b.window is not None and not b.window.rows:
        window = (b.window.range, b.window.slide)
    group_by = tuple(
        r.name for g in query.group_by if isinstance(g, ast.Column) and (r := b.ref(g)) is not None
    )
    agg_list: list[tuple[str, str | None]] = []
    for a in b.aggregates:
        if a.distinct:
            # not a mote-side aggregate (fjords.partial has no distinct values)
            agg_list.append((f"{a.func} DISTINCT", "<expr>"))
        elif a.arg is None:
            agg_list.append((a.func, None))
        elif isinstance(a.arg, ast.Column) and (r := b.ref(a.arg)) is not None:
            agg_list.append((a.func, r.name))
        else:
            agg_list.append((a.func, "<expr>"))
    return Demand(
        stream=b.stream,
        sample_period_s=query.sample_period_s,
        lifetime_s=query.lifetime_s,
        fields=_interned(tuple(used)),
        atoms=tuple((s.names[a.field], a.op, a.value) for a in b.atoms),
        filtered_only_by_atoms=not b.residual
        and not b.join_keys
        and not any(STREAM in b.sides(o) for o in b.post_join),
        aggregates=tuple(agg_list),
        window=window,
        group_by=group_by,
    )


# -- clauses --------------------------------------------------------------------------------


def _duration_text(seconds: float) -> str:
    for unit, size in (("DAY", 86400.0), ("HOUR", 3600.0), ("MINUTE", 60.0), ("SECOND", 1.0)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"{n} {unit}{'S' if n != 1 else ''}"
    return f"{seconds:g} SECONDS"


def check_clauses(query: ast.Query, windowed: bool, window: ast.Window | None) -> None:
    """Every clause must change the result or be refused: a clause that would be silently
    ignored (HAVING without groups, a window or EMIT EVERY on a query without aggregates) or
    would silently skip samples (a SLIDE longer than the RANGE) is an error at the clause.
    Shared by both engines through `analyze`."""
    if query.having is not None and not windowed:
        raise ClauseError(
            "HAVING filters groups, but this query has no GROUP BY and no aggregate; "
            "use WHERE to filter rows",
            query.pos_of("HAVING"),
        )
    if query.emit_every_s is not None:
        if not windowed:
            raise ClauseError(
                "EMIT EVERY sets how often an aggregate's window is output, but this query has "
                "no aggregate or GROUP BY: each row is output as it arrives; remove EMIT EVERY",
                query.pos_of("EMIT EVERY"),
            )
        if window is None:
            raise ClauseError(
                "EMIT EVERY needs a window on the stream, e.g. [RANGE 15 MINUTES]",
                query.pos_of("EMIT EVERY"),
            )
        if window.rows is not None:
            raise ClauseError(
                "EMIT EVERY applies to time windows; use [ROWS n SLIDE m]",
                query.pos_of("EMIT EVERY"),
            )
    if window is None:
        return
    if not windowed:
        shown = (
            f"[ROWS {window.rows}]"
            if window.rows is not None
            else f"[RANGE {_duration_text(window.range_s or 0.0)}]"
        )
        raise ClauseError(
            f"the window {shown} changes nothing: this query has no aggregate or GROUP BY, so "
            "each row is output as it arrives; remove the window, or aggregate over it "
            "(e.g. SELECT station, AVG(speed) ... GROUP BY station)",
            window.pos,
        )
    if window.rows is not None:
        if window.rows_slide is not None and window.rows_slide > window.rows:
            raise ClauseError(
                f"SLIDE {window.rows_slide} is larger than ROWS {window.rows}: the rows between "
                "windows would be ignored; use a SLIDE of at most the window size",
                window.pos,
            )
        return
    rng = window.range_s
    slide, what, pos = window.slide_s, "SLIDE", window.pos
    if query.emit_every_s is not None and slide is None:
        slide, what, pos = query.emit_every_s, "EMIT EVERY", query.pos_of("EMIT EVERY")
    if rng is not None and slide is not None and slide > rng:
        raise ClauseError(
            f"{what} {_duration_text(slide)} is longer than RANGE {_duration_text(rng)}: the "
            f"samples between windows would be ignored; use a {what} of at most the RANGE, "
            "or a longer RANGE",
            pos,
        )


def _check_options(query: ast.Query) -> None:
    """SAMPLE PERIOD and LIFETIME reach the proxies' cost model: positive, finite, sane."""
    for name, seconds, least in (
        ("SAMPLE PERIOD", query.sample_period_s, 0.001),
        ("LIFETIME", query.lifetime_s, 1.0),
    ):
        if seconds is None:
            continue
        if seconds < least:
            raise ClauseError(
                f"{name} must be at least {least:g} seconds (got {seconds:g})", query.pos_of(name)
            )
        if seconds > MAX_DURATION_S:
            raise ClauseError(
                f"{name} {seconds:g} seconds is too large (at most {MAX_DURATION_S:g})",
                query.pos_of(name),
            )


def _check_in_lists(query: ast.Query, limits: Limits) -> None:
    exprs = [i.expr for i in query.select if isinstance(i, ast.SelectItem)]
    exprs += [e for e in (query.where, query.having) if e is not None]
    for e in exprs:
        for node in _walk(e):
            if isinstance(node, ast.InList):
                limits.check("max_in_list", len(node.values), "IN list length")


# -- windows ---------------------------------------------------------------------------


def _window(
    w: ast.Window, emit_every: float | None, limits: Limits = DEFAULT_LIMITS
) -> tuple[float, float, bool]:
    if w.rows is not None:
        if emit_every is not None:
            raise QueryError("EMIT EVERY applies to time windows; use [ROWS n SLIDE m]")
        if w.rows < 1 or (w.rows_slide is not None and w.rows_slide < 1):
            raise QueryError("ROWS windows need positive sizes")
        limits.check("max_rows_window", w.rows, "ROWS window size")
        step = w.rows_slide or w.rows
        limits.check("max_windows_per_pane", -(-w.rows // step), "ROWS windows holding each row")
        return float(w.rows), float(step), True
    range_s, slide = _time_window(w, emit_every)
    for name, seconds in (("RANGE", range_s), ("SLIDE", slide)):
        if seconds > MAX_DURATION_S:
            raise QueryError(
                f"{name} {seconds:g} seconds is too large (at most {MAX_DURATION_S:g})"
            )
    range_ms, slide_ms = round(range_s * 1000), round(slide * 1000)
    if range_ms < 1:
        raise QueryError(f"RANGE must be at least 1 millisecond (got {range_s:g} seconds)")
    if slide_ms < 1:
        raise QueryError(f"SLIDE must be at least 1 millisecond (got {slide:g} seconds)")
    pane = math.gcd(range_ms, slide_ms)
    limits.check(
        "max_panes_per_window",
        range_ms // pane,
        f"RANGE {range_s:g} s with SLIDE {slide:g} s cuts each window into panes",
    )
    limits.check(
        "max_windows_per_pane",
        -(-range_ms // slide_ms),
        f"RANGE {range_s:g} s with SLIDE {slide:g} s: windows holding each sample",
    )
    return range_s, slide, False


def _time_window(w: ast.Window, emit_every: float | None) -> tuple[float, float]:
    if w.range_s is None or w.range_s <= 0:
        raise QueryError("a window needs a positive RANGE")
    slide = w.slide_s
    if emit_every is not None:
        if slide is not None:
            raise QueryError(
                "give either SLIDE or EMIT EVERY, not both (EMIT EVERY sets how often the window is output)"
            )
        slide = emit_every
    slide = w.range_s if slide is None else slide
    if slide <= 0:
        raise QueryError("SLIDE must be positive")
    if not (math.isfinite(w.range_s) and math.isfinite(slide)):
        raise QueryError("RANGE and SLIDE must be finite durations")
    return w.range_s, slide


# -- UNION ALL ---------------------------------------------------------------------------------

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


def analyze_union(
    union: ast.Union, catalog: Catalog, limits: Limits = DEFAULT_LIMITS
) -> BoundUnion:
    """Analyse each branch, then check them against the first; errors name the branch and
    column and point at the offending item (or the UNION before the branch)."""
    plain = [analyze(q, catalog, limits) for q in union.branches]
    for b in plain:
        if b.window is not None and b.window.rows:
            w = next(r.window for r in b.query.sources if r.window is not None)
            raise ClauseError(
                "ROWS windows are not supported in a UNION ALL: their rows come in arrival "
                "order, not in sample-time order, so they cannot be merged by time; use a "
                "time window such as [RANGE 15 MINUTES]",
                w.pos,
            )
    first = plain[0]
    n = len(first.select_names)
    kinds = [_result_kinds(b) for b in plain]
    for i, b in enumerate(plain[1:], start=1):
        where = union.union_pos[i - 1] if i - 1 < len(union.union_pos) else None
        if b.windowed != first.windowed:
            what = "aggregates over a window" if b.windowed else "outputs each row"
            raise QueryPlanError(
                f"UNION ALL branch {i + 1} {what} but the first "
                f"{'does' if first.windowed else 'does not'}: every branch must aggregate over "
                "windows, or none",
                *(where or (None, None)),
            )
        if len(b.select_names) != n:
            theirs, ours = ", ".join(b.select_names), ", ".join(first.select_names)
            raise QueryPlanError(
                f"UNION ALL branch {i + 1} has {len(b.select_names)} columns ({theirs}), "
                f"the first has {n} ({ours})",
                *(where or (None, None)),
            )
    types: list[str] = []
    for c in range(n):
        known = [k[c] for k in kinds if k[c] != "null"]
        kind = known[0] if known else "null"
        if known and all(k in ("int", "float") for k in known):
            kind = "float" if "float" in known else "int"
        else:
            for i, k in enumerate(kinds):
                if k[c] not in ("null", kind):
                    raise QueryPlanError(
                        f"UNION ALL column {c + 1} ({first.select_names[c]}) is "
                        f"{_KIND_WORDS.get(kind, kind)} in the first branch but "
                        f"{_KIND_WORDS.get(k[c], k[c])} in branch {i + 1} "
                        f"({plain[i].select_names[c]})",
                        *(_item_pos(plain[i], c) or (None, None)),
                    )
        types.append(kind)
    bound: list[BoundQuery] = []
    for i, (q, b) in enumerate(zip(union.branches, plain, strict=True)):
        casts = [c for c in range(n) if types[c] == "float" and kinds[i][c] == "int"]
        if casts or not first.windowed:
            q = _union_branch(q, b, casts, first.windowed)
            b = analyze(q, catalog, limits)
        bound.append(b)
    columns = (*first.select_names, *[c for c in first.columns if c in WINDOW_COLUMNS])
    if first.windowed:
        time_index = list(first.columns).index("window_end")
        width = len(first.columns)
    else:
        time_index, width = n, n
    return BoundUnion(
        union=union,
        branches=tuple(bound),
        columns=tuple(columns),
        types=tuple(types),
        width=width,
        time_index=time_index,
        windowed=first.windowed,
    )


_KIND_WORDS = {"int": "an integer", "float": "a number", "str": "text", "bool": "a boolean"}


def _expanded_items(b: BoundQuery) -> list[tuple[ast.Expr, str]]:
    """The SELECT list as (expression, name), stars expanded to qualified columns."""
    q = b.query
    out: list[tuple[ast.Expr, str]] = []
    names = iter(b.select_names)
    for item in q.select:
        if isinstance(item, ast.Star):
            sides = []
            if item.table in (None, b.stream_alias):
                sides.append((b.stream_alias, b.schema))
            if b.table is not None and item.table in (None, b.table_alias):
                sides.append((b.table_alias, b.table.schema))
            for alias, schema in sides:
                out += [(ast.Column(alias, f), next(names)) for f in schema.names]
            continue
        out.append((item.expr, next(names)))
    return out


def _result_kinds(b: BoundQuery) -> list[str]:
    """The kind of each SELECT column of an analysed query."""

    def column_type(col: ast.Column) -> str:
        if b.window_slot(col) is not None:
            return "float"
        r = b.ref(col)
        if r is not None:  # analyze() resolved it
            return r.type
        # a star's column (_expanded_items qualifies it with its source's alias)
        table = b.table.schema if b.table is not None else b.schema
        schema = b.schema if col.table == b.stream_alias else table
        return schema.fields[schema.index(col.name)].type

    checker = TypeChecker(column_type)
    return [checker.infer(e) for e, _ in _expanded_items(b)]


def _item_pos(b: BoundQuery, c: int) -> ast.Pos:
    e = _expanded_items(b)[c][0]
    return e.pos or (b.query.sources[0].pos if b.query.sources else None)


def _union_branch(q: ast.Query, b: BoundQuery, casts: list[int], windowed: bool) -> ast.Query:
    """The branch as the union runs it: integer columns cast where the union's column is a
    float, and (row by row) the sample's time as a hidden last column."""
    select: tuple[ast.SelectItem | ast.Star, ...] = q.select
    if casts:
        items = []
        for c, (e, name) in enumerate(_expanded_items(b)):
            if c in casts:
                e = ast.Func("FLOAT", (e,), e.pos)
            items.append(ast.SelectItem(e, name))
        select = tuple(items)
    if not windowed:
        time = ast.Column(b.stream_alias, b.schema.time)  # type: ignore[arg-type]
        select = (*select, ast.SelectItem(time, UNION_TIME))
    return replace(q, select=select)
