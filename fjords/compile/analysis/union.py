"""UNION ALL: each branch analysed, then the branches checked alike (columns, kinds, windows)."""

from __future__ import annotations

from dataclasses import replace

from fjords.catalog import Catalog
from fjords.compile.analysis.bind import analyze
from fjords.compile.analysis.bound import UNION_TIME, WINDOW_COLUMNS, BoundQuery, BoundUnion
from fjords.compile.sql import ast
from fjords.compile.typecheck import TypeChecker
from fjords.errors import ClauseError, QueryPlanError
from fjords.limits import DEFAULT_LIMITS, Limits


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
