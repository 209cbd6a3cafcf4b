"""`analyze`: resolve, type and check a parsed query once, into a frozen `BoundQuery`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import fields, is_dataclass, replace

from fjords.catalog import Catalog
from fjords.compile.analysis.bound import (
    CHANGES_COLUMNS,
    RIGHT,
    STREAM,
    TABLE,
    WINDOW_COLUMNS,
    BoundQuery,
    ColumnRef,
    WindowSpec,
    frozen_refs,
    interned,
    same_or_tuple,
)
from fjords.compile.analysis.clauses import (
    check_changes,
    check_clauses,
    check_drilldown,
    check_emit_rows,
    check_grouped,
    check_grouping,
    check_in_lists,
    check_options,
    check_order_limit,
    check_stream_join,
    check_unique,
    order_hidden,
    order_positions,
    rewrite_distinct,
    rollup_helpers,
)
from fjords.compile.analysis.demand import join_demand, stream_demand
from fjords.compile.analysis.filters import second_stream, split_atoms, split_join_keys
from fjords.compile.analysis.nodes import listing, nodes_of, query_exprs
from fjords.compile.analysis.scope import Scope, select_names
from fjords.compile.analysis.windows import window_spec
from fjords.compile.expressions import children, coerce_literals, conjuncts
from fjords.compile.sql import ast
from fjords.compile.typecheck import TypeChecker
from fjords.errors import ClauseError, QueryError, QueryPlanError, UnknownNameError
from fjords.limits import DEFAULT_LIMITS, Limits


def analyze(query: ast.Query, catalog: Catalog, limits: Limits = DEFAULT_LIMITS) -> BoundQuery:
    """Resolve, type and check `query` against `catalog`; raises QueryError (with line and
    column where the query text has them) for anything either engine would refuse."""
    outer = getattr(listing, "nodes", None)
    listing.nodes = {} if outer is None else outer
    try:
        return _analyze(query, catalog, limits)
    finally:
        listing.nodes = outer


def _analyze(query: ast.Query, catalog: Catalog, limits: Limits) -> BoundQuery:
    scope = Scope(query, catalog)
    distinct = query.distinct
    query, distinct_rows = rewrite_distinct(query, scope)
    names = select_names(query, scope)
    hidden = order_hidden(query, names, distinct)
    refs = resolve_all(query, scope, hidden)
    query, hidden = promote_numbers(query, scope, hidden)
    check_in_lists(query, limits)
    aggs = collect_aggregates(query, hidden)
    windowed = bool(aggs or query.group_by)
    check_order_limit(query, windowed)
    if scope.right is not None:
        check_stream_join(query, scope, windowed)
        if query.sample_every_rows is not None:
            raise ClauseError(
                "SAMPLE EVERY n ROWS is not supported on a join of two streams: sample each "
                "stream in a query of its own",
                query.pos_of("SAMPLE EVERY"),
            )
    # A stream-stream join's window scopes the join, so it means something without aggregates.
    check_clauses(query, windowed, scope.window if windowed or scope.right is None else None)
    check_options(query)
    check_changes(query, windowed, scope.window, scope.right is not None or scope.table is not None)
    check_emit_rows(query, scope, windowed)
    where = tuple(coerce(c, scope) for c in conjuncts(query.where))
    type_check(query, scope, where, hidden)
    window = (
        WindowSpec(*window_spec(scope.window, query.emit_every_s, limits)) if scope.window else None
    )

    def sides(e: ast.Expr) -> set[str]:
        out = set()
        for node in nodes_of(e):
            if isinstance(node, ast.Column) and (node.table, node.name) in refs:
                out.add(refs[(node.table, node.name)].side)
            elif isinstance(node, ast.Now):
                out.add("now")
        return out

    only_stream = [sides(c) <= {STREAM} for c in where]
    stream_only = [c for c, only in zip(where, only_stream, strict=True) if only]
    others = [c for c, only in zip(where, only_stream, strict=True) if not only]
    atoms, residual = split_atoms(stream_only, refs)
    stream_filters = list(stream_only)
    right_side = None
    if scope.right is not None:
        right_side, others = second_stream(scope, others, refs, sides)
    elif scope.table is None:
        # Stream-only conditions involving NOW (the sample time here) are simply residual.
        residual, stream_filters, others = residual + others, stream_filters + others, []
    join_keys, post_join = split_join_keys(others, refs)
    if scope.right is not None and not join_keys:
        raise QueryPlanError(
            "a join of two streams needs an equality between a column of each in WHERE (the "
            f"join key, e.g. {scope.stream_alias}.segment = {scope.right_alias}.segment); "
            "other conditions across both are then checked on each pair",
            *(scope.right_pos or (None, None)),
        )
    if windowed and scope.window is None and query.changes is None:
        raise ClauseError(
            "aggregates over a stream need a window: add [RANGE 15 MINUTES] or [ROWS 100] "
            "after the stream",
            query.pos_of("GROUP BY") or (aggs[0].pos if aggs else None),
        )
    for k in query.group_by:
        for n in nodes_of(k):
            if isinstance(n, ast.Aggregate):
                raise QueryPlanError("GROUP BY cannot contain aggregates", *(n.pos or (None, None)))
    agg_args: list[ast.Expr] = []
    distinct_args: list[ast.Expr] = []
    for a in aggs:
        args = distinct_args if a.distinct else agg_args
        if a.arg is not None and a.arg not in args:
            args.append(a.arg)
    needed: list[ColumnRef] = []
    check_grouping(query, refs, aggs, scope.table is not None or scope.right is not None)
    check_drilldown(query, scope.stream, catalog.tables.values())
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
        check_grouped(query, refs, hidden)
        if scope.table is not None:
            needed = needed_columns(query, refs, post_join, join_keys, hidden)
    check_unique(names, query)
    columns = (*names, *[c for c in WINDOW_COLUMNS if c not in names]) if windowed else names
    if query.changes is not None:
        # online aggregation (no window) has no window bounds; every EMIT CHANGES row says
        # whether it is final and up to which event time it counts
        if scope.window is None:
            columns = names
        columns = (*columns, *[c for c in CHANGES_COLUMNS if c not in names])
    order = order_positions(query, columns, hidden)
    shared_refs = frozen_refs(tuple(refs.items()))
    bound = BoundQuery(
        query=query,
        stream=scope.stream.name,  # type: ignore[union-attr]
        stream_alias=scope.stream_alias,
        schema=scope.schema,
        table=scope.table,
        table_alias=scope.table_alias,
        window=window,
        windowed=windowed,
        refs=shared_refs,
        aggregates=tuple(aggs + rollup_helpers(aggs)) if query.grouping_sets else tuple(aggs),
        agg_args=tuple(agg_args),
        where=where,
        stream_filters=same_or_tuple(where, stream_filters),
        atoms=tuple(atoms),
        residual=tuple(residual),
        join_keys=tuple(join_keys),
        post_join=tuple(post_join),
        needed=tuple(needed),
        select_names=interned(tuple(names)),
        columns=interned(tuple(columns)),
        demand=None,  # type: ignore[arg-type]  # set just below, from the bound query itself
        distinct_args=tuple(distinct_args),
        order=order,
        order_exprs=tuple(hidden),
        limit=query.limit,
        distinct_rows=distinct_rows,
        right=right_side,
    )
    if right_side is not None:
        object.__setattr__(bound, "demand", join_demand(bound, STREAM))
        object.__setattr__(right_side, "demand", join_demand(bound, RIGHT))
    else:
        object.__setattr__(bound, "demand", stream_demand(bound))
    return bound


_MIXING = ("COALESCE", "LEAST", "GREATEST")


def promote_numbers(
    query: ast.Query, scope: Scope, hidden: list[ast.Expr]
) -> tuple[ast.Query, list[ast.Expr]]:
    """COALESCE, LEAST, GREATEST and CASE whose values mix integers and floats give floats, as
    on Spark: their integer values are made floats (`LEAST(speed, 30)` is 30.0, not 30)."""
    checker = TypeChecker(lambda col: column_type(col, scope))

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
        isinstance(n, ast.Func | ast.Case)
        for e in [*query_exprs(query), *hidden]
        for n in nodes_of(e)
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
    for f in fields(e):
        if f.name == "pos":
            continue
        old = getattr(e, f.name)
        new = conv(old)
        if new != old or new is not old:
            changes[f.name] = new
    return replace(e, **changes) if changes else e  # type: ignore[arg-type]  # fields of `e`


def column_type(col: ast.Column, scope: Scope) -> str:
    if col.table is None and col.name in WINDOW_COLUMNS and not scope.known(col):
        return "float"
    return scope.resolve(col).type


def resolve_all(
    query: ast.Query, scope: Scope, hidden: list[ast.Expr]
) -> dict[tuple[str | None, str], ColumnRef]:
    """Every column reference of the query, resolved once (errors at the first unknown one)."""
    refs: dict[tuple[str | None, str], ColumnRef] = {}
    for e in [*query_exprs(query), *hidden]:
        for node in nodes_of(e):
            if not isinstance(node, ast.Column) or (node.table, node.name) in refs:
                continue
            if node.table is None and node.name in WINDOW_COLUMNS:
                if scope.known(node):
                    refs[(None, node.name)] = scope.resolve(node)
                continue
            refs[(node.table, node.name)] = scope.resolve(node)
    for item in query.select:
        if isinstance(item, ast.Star) and item.table is not None:
            if item.table not in scope.aliases:
                raise UnknownNameError("table or alias", item.table, scope.aliases, None)
    if query.where is not None:
        for n in nodes_of(query.where):
            if isinstance(n, ast.Aggregate):
                raise QueryPlanError(
                    "aggregates are not allowed in WHERE; use HAVING", *(n.pos or (None, None))
                )
            if (
                isinstance(n, ast.Column)
                and n.table is None
                and n.name in WINDOW_COLUMNS
                and not scope.known(n)
            ):
                raise QueryPlanError(
                    f"{n.name} is a bound of a window's results, not a column of the readings "
                    "WHERE filters: compare it in HAVING",
                    *(n.pos or (None, None)),
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
        for node in nodes_of(e):
            if isinstance(node, ast.Aggregate) and node not in found:
                if node.arg is not None and any(
                    isinstance(n, ast.Aggregate) for n in nodes_of(node.arg)
                ):
                    raise QueryPlanError("aggregates cannot be nested", *(node.pos or (None, None)))
                found.append(node)
    return found


def needed_columns(
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


def type_check(
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


def coerce(expr: ast.Expr, scope: Scope) -> ast.Expr:
    def column_type(col: ast.Column) -> str | None:
        if col.table is None and col.name in WINDOW_COLUMNS and not scope.known(col):
            return None
        return scope.resolve(col).type

    return coerce_literals(expr, column_type)
