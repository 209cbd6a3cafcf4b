"""Lark's parse tree to the syntax tree (`fjords.compile.sql.ast`): one method per grammar rule,
with the checks only the parser can make at a token's position (a function's arguments, a
number's size, a clause given twice).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from lark import Token, Transformer, v_args

from fjords.compile.sql import ast

_UNITS = {
    "MILLISECOND": 0.001,
    "SECOND": 1.0,
    "MINUTE": 60.0,
    "HOUR": 3600.0,
    "DAY": 86400.0,
    "WEEK": 604800.0,
}


MAX_INT_DIGITS = 18  # an integer numeral fits a signed 64-bit integer


class TransformError(Exception):
    """Raised inside the transformer; carries a token for the position."""

    def __init__(self, message: str, token: Token | None, expected: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.message, self.token, self.expected = message, token, expected


_FUNCTIONS = (*ast.AGGREGATE_FUNCTIONS, *ast.SCALAR_FUNCTIONS)
# A parameterized measure while parsing (`avg_speed(segment)`: Func(MEASURE, (alias, level))):
# a drill-down's HAVING replaces it by the alias's aggregate; anywhere else it is refused as
# an unknown function.
MEASURE = "<measure>"


def _check_function(name: Token) -> None:
    if name.upper() not in _FUNCTIONS:
        known = ", ".join(_FUNCTIONS)
        raise TransformError(
            f"unknown function {name}; the functions are {known}", name, _FUNCTIONS
        )


def _at(*parts: object) -> ast.Pos:
    """The position of the first part that has one (a Token, or a node with `pos`)."""
    for p in parts:
        if isinstance(p, Token):
            if p.line is not None:
                return (p.line, p.column or 1)
            continue
        pos = getattr(p, "pos", None)
        if pos is not None:
            return pos
    return None


def _fold_left(first: ast.Expr, rest: tuple[ast.Expr | Token, ...]) -> ast.Expr:
    """`a - b - c` is `(a - b) - c`: the flat chain [a, -, b, -, c] folds from the left."""
    result = first
    pos = _at(first, *rest)
    for i in range(0, len(rest), 2):
        result = ast.BinaryOp(str(rest[i]), result, rest[i + 1], pos)  # type: ignore[arg-type]
    return result


def _grouping_sets(kw: Token, sets: list[tuple[ast.Expr, ...]]) -> tuple:
    """The GROUP BY of grouping sets: the union of their columns (the finest level, in order
    of first mention) and each set as positions in it, each set once."""
    keys: list[ast.Expr] = []
    for s in sets:
        for e in s:
            if e not in keys:
                keys.append(e)
    positions: list[tuple[int, ...]] = []
    for s in sets:
        p = tuple(sorted({keys.index(e) for e in s}))
        if p not in positions:
            positions.append(p)
    return ("group", tuple(keys), _at(kw), tuple(positions))


def _is_drilldown(part: object) -> bool:
    return isinstance(part, tuple) and len(part) == 3 and part[0] == "drilldown"


def _no_drilldown(parts: tuple, kind: str) -> None:
    for p in parts:
        if _is_drilldown(p):
            raise TransformError(
                f"DRILLDOWN cannot be combined with {kind}: a drill-down's levels are its own "
                "grouping sets (GROUP BY segment DRILLDOWN station is (segment), "
                "(segment, station)); use one or the other",
                p[1],
            )


def _pos_token(pos: ast.Pos, text: str) -> Token:
    line, column = pos or (None, None)
    return Token("NAME", text, line=line, column=column)


def _map_expr(e: Any, fn: Callable[[Any], Any]) -> Any:
    """`e` with `fn` applied bottom-up to every node (`fn` returns the node or its stand-in)."""
    if isinstance(e, tuple):
        return tuple(_map_expr(x, fn) for x in e)
    if not hasattr(e, "__dataclass_fields__") or isinstance(e, ast.Query):
        return e
    changes = {}
    for f in dataclasses.fields(e):
        v = getattr(e, f.name)
        w = _map_expr(v, fn)
        if w is not v:
            changes[f.name] = w
    return fn(dataclasses.replace(e, **changes) if changes else e)


def _measures(e: Any) -> list[ast.Func]:
    found: list[ast.Func] = []

    def see(node: Any) -> Any:
        if isinstance(node, ast.Func) and node.name == MEASURE:
            found.append(node)
        return node

    _map_expr(e, see)
    return found


def _conjuncts(e: ast.Expr) -> list[ast.Expr]:
    if isinstance(e, ast.And):
        return [c for item in e.items for c in _conjuncts(item)]
    return [e]


def _drilldown_having(
    select: tuple, levels: tuple[ast.Expr, ...], having: ast.Expr | None
) -> tuple[ast.Expr | None, tuple[ast.Expr | None, ...]]:
    """SQL_MS's HAVING over a drill-down's levels as one HAVING on its level rows, and each
    level's condition (EXPLAIN). A parameterized measure `avg_speed(segment)` is the
    SELECT alias `avg_speed`'s aggregate at level `segment`: a condition with measures of one
    level holds for that level's rows only; one without holds at every level. A level row
    is told by its GROUPING flags. The pruning (a failing row removes its descendants) is
    the finish step's (`RollupFinish`, `prune`)."""
    if having is None:
        return None, (None,) * len(levels)
    aliases = {
        item.alias: item.expr
        for item in select
        if isinstance(item, ast.SelectItem) and item.alias is not None
    }
    per_level: list[list[ast.Expr]] = [[] for _ in levels]
    every: list[ast.Expr] = []
    for c in _conjuncts(having):
        named: set[int] = set()
        for m in _measures(c):
            alias, level = m.args
            name = str(alias.value)  # type: ignore[union-attr]
            if name not in aliases:
                raise TransformError(
                    f"{name}({ast.to_sql(level)}): {name} is not a SELECT alias (a "
                    "parameterized measure names an aggregate of the SELECT list and a level: "
                    "avg_speed(segment) with AVG(speed) AS avg_speed)",
                    _pos_token(m.pos, name),
                )
            if not any(isinstance(n, ast.Aggregate) for n in _walk_all(aliases[name])):
                raise TransformError(
                    f"{name}({ast.to_sql(level)}): {name} is {ast.to_sql(aliases[name])}, not "
                    "an aggregate; a parameterized measure names an aggregate's alias",
                    _pos_token(m.pos, name),
                )
            at = [i for i, lv in enumerate(levels) if _same_column(lv, level)]
            if not at:
                known = ", ".join(ast.to_sql(lv) for lv in levels)
                raise TransformError(
                    f"{name}({ast.to_sql(level)}): the query has no level "
                    f"{ast.to_sql(level)}; its levels are {known}",
                    _pos_token(getattr(level, "pos", None) or m.pos, ast.to_sql(level)),
                )
            named.add(at[0])
        if len(named) > 1:
            raise TransformError(
                "a HAVING condition names measures of two levels; each condition holds at "
                "one level (join them with AND)",
                _pos_token(_measures(c)[0].pos, "HAVING"),
            )

        def swap(node: Any) -> Any:
            if isinstance(node, ast.Func) and node.name == MEASURE:
                return aliases[str(node.args[0].value)]  # type: ignore[union-attr]
            return node

        cond = _map_expr(c, swap)
        (per_level[named.pop()] if named else every).append(cond)
    level_conds: list[ast.Expr | None] = []
    branches: list[ast.Expr] = []
    for k, level in enumerate(levels):
        conds = every + per_level[k]
        level_conds.append(
            None if not conds else conds[0] if len(conds) == 1 else ast.And(tuple(conds))
        )
        ident: list[ast.Expr] = [ast.Compare("=", ast.Func("GROUPING", (level,)), ast.Literal(0))]
        if k + 1 < len(levels):
            finer = ast.Func("GROUPING", (levels[k + 1],))
            ident.append(ast.Compare("=", finer, ast.Literal(1)))
        branches.append(ast.And((*ident, *conds)))
    return ast.Or(tuple(branches)), tuple(level_conds)


def _walk_all(e: Any) -> list[Any]:
    out: list[Any] = []

    def see(node: Any) -> Any:
        out.append(node)
        return node

    _map_expr(e, see)
    return out


def _same_column(a: ast.Expr, b: ast.Expr) -> bool:
    if isinstance(a, ast.Column) and isinstance(b, ast.Column):
        return a.name == b.name and (b.table is None or a.table in (None, b.table))
    return a == b


def _seconds(number: float | int, unit: Token) -> float:
    u = unit.upper().rstrip("S")
    return float(number) * _UNITS[u]


@v_args(inline=True)
class ToAst(Transformer):
    def start(self, query: ast.Statement) -> ast.Statement:
        return query

    def set_op(self, kw: Token, *all_: Token) -> Token:
        if not all_:
            raise TransformError(
                "UNION (which removes duplicate rows) is not supported: a stream's rows never "
                "end, so neither would the duplicates to remember; use UNION ALL",
                kw,
                ("ALL",),
            )
        return kw

    def union(self, *parts: object) -> ast.Statement:
        """One query, or the branches of a UNION ALL with the last branch's options moved to
        every branch (see `_union`)."""
        if len(parts) == 1:
            return parts[0]  # type: ignore[return-value]
        return _union(parts[0::2], parts[1::2])  # type: ignore[arg-type]

    def query(self, *parts: object) -> ast.Query:
        distinct: Token | None = None
        if isinstance(parts[0], Token):
            distinct, parts = parts[0], parts[1:]
        select, rest = parts[0], parts[1:]
        sources = []
        order_by: tuple = ()
        limit: int | None = None
        where = None
        group_by: tuple = ()
        grouping_sets: tuple = ()
        drilldown = False
        having = None
        options: dict[str, float] = {}
        emit_partition: ast.Column | None = None
        positions: list[tuple[str, ast.Pos]] = []
        for part in rest:
            if isinstance(part, ast.TableRef):
                sources.append(part)
            elif isinstance(part, tuple) and part and part[0] == "where":
                where = part[1]
            elif isinstance(part, tuple) and part and part[0] == "group":
                group_by, grouping_sets = part[1], part[3]
                drilldown = len(part) > 4
                positions.append(("GROUP BY", part[2]))
            elif isinstance(part, tuple) and part and part[0] == "having":
                having = part[1]
                positions.append(("HAVING", part[2]))
            elif isinstance(part, tuple) and part and part[0] == "order":
                order_by = part[1]
                positions.append(("ORDER BY", part[2]))
            elif isinstance(part, tuple) and part and part[0] == "limit":
                limit = part[1]
                positions.append(("LIMIT", part[2]))
            elif isinstance(part, tuple) and part and part[0] == "option":
                _, key, value, token = part
                if key in options:
                    raise TransformError(f"{token.upper()} is given twice", token)
                if {key, *options} >= {"emit_every", "emit_every_rows"}:
                    raise TransformError(
                        "EMIT EVERY d and EMIT EVERY n ROWS both say when rows go out: keep one",
                        token,
                    )
                if key == "emit_every_rows":
                    value, emit_partition = value
                options[key] = value
                positions.append((str(token).upper(), _at(token)))
        if distinct is not None:
            positions.append(("DISTINCT", _at(distinct)))
        level_having: tuple[ast.Expr | None, ...] = ()
        if drilldown:
            having, level_having = _drilldown_having(select, group_by, having)  # type: ignore[arg-type]
        others = [select, where, group_by, order_by] + ([] if drilldown else [having])
        for m in _measures(tuple(others)):
            _check_function(_pos_token(m.pos, str(m.args[0].value)))  # type: ignore[union-attr]
        return ast.Query(
            select=select,  # type: ignore[arg-type]
            sources=tuple(sources),
            where=where,
            group_by=group_by,
            grouping_sets=grouping_sets,
            drilldown=level_having if drilldown else None,
            having=having,
            sample_period_s=options.get("sample_period"),
            sample_every_rows=options.get("sample_every_rows"),  # type: ignore[arg-type]  # an int
            emit_every_rows=options.get("emit_every_rows"),  # type: ignore[arg-type]  # an int
            emit_partition=emit_partition,
            emit_every_s=options.get("emit_every"),
            lifetime_s=options.get("lifetime"),
            priority=options.get("priority"),  # type: ignore[arg-type]  # an int (`priority`)
            distinct=distinct is not None,
            order_by=order_by,
            limit=limit,
            changes=options.get("emit_changes"),  # type: ignore[arg-type]  # an ast.Changes
            clause_pos=tuple(positions),
        )

    # -- SELECT ------------------------------------------------------------------------
    def select_list(self, *items: object) -> tuple:
        return tuple(items)

    def star(self) -> ast.Star:
        return ast.Star()

    def qualified_star(self, table: Token) -> ast.Star:
        return ast.Star(str(table))

    def item(self, expr: ast.Expr, alias: Token | None = None) -> ast.SelectItem:
        return ast.SelectItem(expr, None if alias is None else str(alias))

    # -- FROM ------------------------------------------------------------------------------
    def source(self, name: Token, *rest: object) -> ast.TableRef:
        alias = None
        window = None
        for r in rest:
            if isinstance(r, ast.Window):
                if window is not None:
                    raise TransformError(f"{name} has two windows", name)
                window = r
            else:
                alias = str(r)
        return ast.TableRef(str(name), alias, window, _at(name))

    def range_window(self, kw: Token, rng: float, *slide: object) -> ast.Window:
        return ast.Window(range_s=rng, slide_s=slide[1] if slide else None, pos=_at(kw))  # type: ignore[arg-type]

    def rows_window(self, kw: Token, n: Token, *slide: Token) -> ast.Window:
        return ast.Window(rows=int(n), rows_slide=int(slide[1]) if slide else None, pos=_at(kw))

    def duration(self, number: ast.Literal, unit: Token) -> float:
        seconds = _seconds(number.value, unit)  # type: ignore[arg-type]
        if math.isinf(seconds) or math.isnan(seconds):
            raise TransformError(f"duration {number.value} {unit} is too large", unit)
        return seconds

    # -- clauses -------------------------------------------------------------------------
    def where_clause(self, expr: ast.Expr) -> tuple:
        return ("where", expr)

    def group_clause(self, kw: Token, *parts: object) -> tuple:
        exprs = tuple(p for p in parts if not _is_drilldown(p))
        drills: list[tuple] = [p for p in parts if isinstance(p, tuple) and _is_drilldown(p)]
        if not drills:
            return ("group", exprs, _at(kw), ())
        if len(exprs) > 1:
            raise TransformError(
                "DRILLDOWN descends from one GROUP BY column: GROUP BY segment DRILLDOWN "
                "station (a hierarchy's top level, then each finer level)",
                drills[0][1],
            )
        levels: tuple = (exprs[0], *(d[2] for d in drills))
        for i, e in enumerate(levels):
            if e in levels[:i]:
                raise TransformError(
                    f"DRILLDOWN {ast.to_sql(e)}: {ast.to_sql(e)} is already a level",
                    drills[i - 1][1],
                )
        # the levels (a), (a, b), (a, b, c)...: no total row
        sets = tuple(tuple(range(n)) for n in range(1, len(levels) + 1))
        return ("group", levels, _at(kw), sets, "drilldown")

    def drilldown(self, kw: Token, expr: ast.Expr) -> tuple:
        return ("drilldown", kw, expr)

    def rollup_clause(self, kw: Token, _rollup: Token, *parts: object) -> tuple:
        """`ROLLUP(a, b, c)` is `GROUPING SETS ((a, b, c), (a, b), (a), ())`."""
        _no_drilldown(parts, "ROLLUP")
        exprs: tuple = parts
        sets = [tuple(exprs[:n]) for n in range(len(exprs), -1, -1)]
        return _grouping_sets(kw, sets)

    def grouping_sets_clause(self, kw: Token, _g: Token, _s: Token, *sets: tuple) -> tuple:
        _no_drilldown(sets, "GROUPING SETS")
        return _grouping_sets(kw, list(sets))

    def grouping_set(self, *exprs: ast.Expr) -> tuple:
        return tuple(e for e in exprs if e is not None)

    def having_clause(self, kw: Token, expr: ast.Expr) -> tuple:
        return ("having", expr, _at(kw))

    def distinct_clause(self, kw: Token) -> Token:
        return kw

    def order_clause(self, kw: Token, *items: ast.OrderItem) -> tuple:
        return ("order", tuple(items), _at(kw))

    def order_item(self, expr: ast.Expr, direction: Token | None = None) -> ast.OrderItem:
        return ast.OrderItem(expr, direction is not None and direction.type == "DESC")

    def limit_clause(self, kw: Token, n: Token) -> tuple:
        if len(str(n).lstrip("0")) > MAX_INT_DIGITS:
            raise TransformError(f"LIMIT {n} is too large", n)
        return ("limit", int(n), _at(kw))

    def sample_period(self, kw: Token, seconds: float) -> tuple:
        return (
            "option",
            "sample_period",
            seconds,
            Token(kw.type, "SAMPLE PERIOD", kw.start_pos, kw.line, kw.column),
        )

    def sample_every_rows(self, kw: Token, *rest: Token) -> tuple:
        """`SAMPLE EVERY n ROWS`: a whole number of at least 1, refused at the number."""
        sign, num = rest[:2] if len(rest) == 3 else (None, rest[0])
        text = f"{sign or ''}{num}"
        if not re.fullmatch(r"\+?\d{1,18}", text) or int(text) < 1:
            raise TransformError(
                f"SAMPLE EVERY n ROWS takes a whole number of readings of at least 1 (got {text})",
                sign or num,
            )
        return (
            "option",
            "sample_every_rows",
            int(text),
            Token(kw.type, "SAMPLE EVERY", kw.start_pos, kw.line, kw.column),
        )

    def emit_every_rows(self, kw: Token, *rest: Any) -> tuple:
        """`EMIT EVERY n ROWS [PARTITIONED BY col]`: a whole number of at least 1, refused at
        the number; the value is (n, the partition column or None)."""
        partition = rest[-1] if isinstance(rest[-1], ast.Column) else None
        rest = rest[:-1] if partition is not None else rest
        sign, num = rest[:2] if len(rest) == 3 else (None, rest[0])
        text = f"{sign or ''}{num}"
        if not re.fullmatch(r"\+?\d{1,18}", text) or int(text) < 1:
            raise TransformError(
                f"EMIT EVERY n ROWS takes a whole number of readings of at least 1 (got {text})",
                sign or num,
            )
        return (
            "option",
            "emit_every_rows",
            (int(text), partition),
            Token(kw.type, "EMIT EVERY ROWS", kw.start_pos, kw.line, kw.column),
        )

    def emit_partition(self, kw: Token, name: Token) -> ast.Column:
        return ast.Column(None, str(name), _at(name))

    def emit_every(self, kw: Token, seconds: float) -> tuple:
        return (
            "option",
            "emit_every",
            seconds,
            Token(kw.type, "EMIT EVERY", kw.start_pos, kw.line, kw.column),
        )

    def emit_changes(self, kw: Token, changes: Token, every: ast.Changes | None = None) -> tuple:
        tok = Token(kw.type, "EMIT CHANGES", kw.start_pos, kw.line, kw.column)
        return ("option", "emit_changes", every or ast.Changes(pos=_at(kw)), tok)

    def emit_changes_every(
        self, kw: Token, changes: Token, number: ast.Literal, unit: Token
    ) -> tuple:
        seconds = self.duration(number, unit)
        return self.emit_changes(kw, changes, ast.Changes(every_s=seconds, pos=number.pos))

    def emit_changes_rows(self, kw: Token, changes: Token, n: ast.Literal, rows: Token) -> tuple:
        """`EVERY n ROWS`: n a whole number (0 is refused by the analysis, at the number)."""
        if not isinstance(n.value, int) or isinstance(n.value, bool):
            raise TransformError(
                f"EVERY {n.value} ROWS needs a whole number of rows", _at_pos(n.pos)
            )
        return self.emit_changes(kw, changes, ast.Changes(every_rows=n.value, pos=n.pos))

    def lifetime(self, kw: Token, seconds: float) -> tuple:
        return ("option", "lifetime", seconds, kw)

    def priority(self, kw: Token, *rest: Token) -> tuple:
        """`PRIORITY n`: a whole number in [MIN_PRIORITY, MAX_PRIORITY], refused at the number."""
        sign, num = rest if len(rest) == 2 else (None, rest[0])
        text = f"{sign or ''}{num}"
        lo, hi = ast.MIN_PRIORITY, ast.MAX_PRIORITY
        value = None
        if re.fullmatch(r"\+?\d{1,18}", text):
            value = int(text)
        if value is None or not lo <= value <= hi:
            raise TransformError(
                f"PRIORITY must be a whole number from {lo} to {hi} (got {text}); "
                f"the default is {ast.DEFAULT_PRIORITY}",
                sign or num,
            )
        return ("option", "priority", value, kw)

    # -- expressions ---------------------------------------------------------------------
    def or_expr(self, *items: ast.Expr) -> ast.Or:
        # `(a OR b) OR c` flattens too: OR is associative and the planner wants one list.
        flat = tuple(x for i in items for x in (i.items if isinstance(i, ast.Or) else (i,)))
        return ast.Or(flat, _at(*items))

    def and_expr(self, *items: ast.Expr) -> ast.And:
        flat = tuple(x for i in items for x in (i.items if isinstance(i, ast.And) else (i,)))
        return ast.And(flat, _at(*items))

    def not_(self, a: ast.Expr) -> ast.Not:
        return ast.Not(a, _at(a))

    def compare(self, a: ast.Expr, op: Token, b: ast.Expr) -> ast.Compare:
        return ast.Compare("!=" if op == "<>" else str(op), a, b, _at(a, op))

    def expr_list(self, *items: ast.Expr) -> tuple:
        return tuple(items)

    def in_list(self, a: ast.Expr, items: tuple) -> ast.InList:
        return ast.InList(a, items, pos=_at(a))

    def not_in_list(self, a: ast.Expr, items: tuple) -> ast.InList:
        return ast.InList(a, items, negated=True, pos=_at(a))

    def between(self, a: ast.Expr, lo: ast.Expr, hi: ast.Expr) -> ast.Between:
        return ast.Between(a, lo, hi, pos=_at(a))

    def not_between(self, a: ast.Expr, lo: ast.Expr, hi: ast.Expr) -> ast.Between:
        return ast.Between(a, lo, hi, negated=True, pos=_at(a))

    def is_null(self, a: ast.Expr) -> ast.IsNull:
        return ast.IsNull(a, pos=_at(a))

    def is_not_null(self, a: ast.Expr) -> ast.IsNull:
        return ast.IsNull(a, negated=True, pos=_at(a))

    def sum(self, first: ast.Expr, *rest: ast.Expr | Token) -> ast.Expr:
        return _fold_left(first, rest)

    def product(self, first: ast.Expr, *rest: ast.Expr | Token) -> ast.Expr:
        return _fold_left(first, rest)

    def neg(self, a: ast.Expr) -> ast.Expr:
        if (
            isinstance(a, ast.Literal)
            and isinstance(a.value, int | float)
            and not isinstance(a.value, bool)
        ):
            return ast.Literal(-a.value, _at(a))
        if isinstance(a, ast.Interval):
            return ast.Interval(-a.seconds, _at(a))
        return ast.Neg(a, _at(a))

    def number(self, tok: Token) -> ast.Literal:
        text = str(tok)
        if not any(c in text for c in ".eE") and len(text.lstrip("0")) <= MAX_INT_DIGITS:
            return ast.Literal(int(text), _at(tok))
        # Past BIGINT a numeral is a float (as SQL's DOUBLE), so integer results stay bounded
        # by the text: no 4,300-digit number that JSON cannot print, no per-tuple bignum work.
        value = float(text)
        if math.isinf(value):
            raise TransformError(f"number {text} is too large", tok)
        return ast.Literal(value, _at(tok))

    def interval(self, number: ast.Literal, unit: Token) -> ast.Interval:
        seconds = _seconds(number.value, unit)  # type: ignore[arg-type]
        if math.isinf(seconds):
            raise TransformError(f"duration {number.value} {unit} is too large", unit)
        return ast.Interval(seconds, _at(number, unit))

    def string(self, tok: Token) -> ast.Literal:
        return ast.Literal(str(tok)[1:-1].replace("''", "'"), _at(tok))

    def true(self) -> ast.Literal:
        return ast.Literal(True)

    def false(self) -> ast.Literal:
        return ast.Literal(False)

    def null(self) -> ast.Literal:
        return ast.Literal(None)

    def now(self) -> ast.Now:
        return ast.Now()

    def call_star(self, name: Token) -> ast.Aggregate:
        _check_function(name)
        if name.upper() != "COUNT":
            raise TransformError(f"{name.upper()}(*) is not allowed; only COUNT takes '*'", name)
        return ast.Aggregate("COUNT", None, _at(name))

    def call(self, name: Token, *args: ast.Expr) -> ast.Expr:
        func = name.upper()
        if func == "GROUPING":  # a result row's level (checked by the analysis)
            if len(args) != 1:
                raise TransformError(f"GROUPING takes one argument, got {len(args)}", name)
            return ast.Func(func, tuple(args), _at(name))
        if func not in _FUNCTIONS and len(args) == 1 and isinstance(args[0], ast.Column):
            # a parameterized measure `avg_speed(segment)` (a drill-down's HAVING) or else an
            # unknown function (`ToAst.query`)
            alias = ast.Literal(str(name))
            return ast.Func(MEASURE, (alias, args[0]), _at(name))
        _check_function(name)
        if func in ast.AGGREGATE_FUNCTIONS:
            if len(args) != 1:
                raise TransformError(f"{func} takes one argument, got {len(args)}", name)
            return ast.Aggregate(func, args[0], _at(name))
        least, most = ast.SCALAR_FUNCTIONS[func]
        if len(args) < least or (most is not None and len(args) > most):
            if most is None:
                wanted = f"at least {least} arguments"
            elif least == most:
                wanted = f"{least} argument{'s' if least != 1 else ''}"
            else:
                wanted = f"{least} to {most} arguments"
            raise TransformError(f"{func} takes {wanted}, got {len(args)}", name)
        return ast.Func(func, tuple(args), _at(name))

    def call_distinct(self, name: Token, _kw: Token, arg: ast.Expr) -> ast.Aggregate:
        _check_function(name)
        if name.upper() != "COUNT":
            raise TransformError(f"{name.upper()}(DISTINCT ...) is not supported; only COUNT", name)
        return ast.Aggregate("COUNT", arg, _at(name), distinct=True)

    def case(self, kw: Token, *parts: ast.Expr) -> ast.Case:
        whens = tuple((parts[i], parts[i + 1]) for i in range(0, len(parts) - 1, 2))
        otherwise = parts[-1] if len(parts) % 2 else None
        return ast.Case(whens, otherwise, _at(kw))

    def column(self, name: Token) -> ast.Column:
        return ast.Column(None, str(name), _at(name))

    def qualified_column(self, table: Token, name: Token) -> ast.Column:
        return ast.Column(str(table), str(name), _at(table))

    def name(self, tok: Token) -> Token:
        if tok.type == "QUOTED_NAME":
            return Token(
                "NAME", str(tok)[1:-1].replace('""', '"'), tok.start_pos, tok.line, tok.column
            )
        return tok


# Options of a union's branches: they go after the last branch and apply to every branch.
_UNION_OPTIONS = ("SAMPLE PERIOD", "LIFETIME", "PRIORITY")


def _at_pos(pos: ast.Pos, text: str = "") -> Token:
    """A token standing for a position (errors about a clause whose token is gone)."""
    line, col = pos if pos is not None else (1, 1)
    return Token("POS", text, 0, line, col)


def _union(branches: tuple[ast.Query, ...], unions: tuple[Token, ...]) -> ast.Union:
    """`q1 UNION ALL q2 ...`. Decided: SAMPLE PERIOD, LIFETIME and PRIORITY are written once,
    after the last branch, and apply to the whole union (copied into every branch); written
    inside an earlier branch they would be ambiguous, so they are refused there. EMIT EVERY and
    ORDER BY/LIMIT are refused in any branch: a branch's window takes SLIDE instead, and the
    union's rows come out in sample-time order."""
    for i, b in enumerate(branches):
        for clause in ("ORDER BY", "LIMIT"):
            pos = b.pos_of(clause)
            if pos is not None:
                raise TransformError(
                    f"{clause} is not supported in a UNION ALL: its rows come out in "
                    "sample-time order; sort per window in a query of its own",
                    _at_pos(pos),
                )
        pos = b.pos_of("EMIT CHANGES")
        if pos is not None:
            raise TransformError(
                "EMIT CHANGES is not supported in a UNION ALL: run the branch as a query of "
                "its own",
                _at_pos(pos),
            )
        pos = b.pos_of("SAMPLE EVERY")
        if pos is not None:
            raise TransformError(
                "SAMPLE EVERY n ROWS is not supported in a UNION ALL: sample each stream in a "
                "query of its own",
                _at_pos(pos),
            )
        pos = b.pos_of("EMIT EVERY") or b.pos_of("EMIT EVERY ROWS")
        if pos is not None:
            raise TransformError(
                "EMIT EVERY is not supported in a UNION ALL: give the branch's window a "
                "SLIDE instead, e.g. [RANGE 1 HOUR SLIDE 15 MINUTES]",
                _at_pos(pos),
            )
        if i == len(branches) - 1:
            break
        for clause in _UNION_OPTIONS:
            pos = b.pos_of(clause)
            if pos is not None:
                raise TransformError(
                    f"{clause} inside a UNION ALL is ambiguous: write it once, after the last "
                    "branch, where it applies to every branch",
                    _at_pos(pos),
                )
    last = branches[-1]
    opts = tuple((c, p) for c, p in last.clause_pos if c in _UNION_OPTIONS)
    copied = tuple(
        replace(
            b,
            sample_period_s=last.sample_period_s,
            lifetime_s=last.lifetime_s,
            priority=last.priority,
            clause_pos=b.clause_pos + opts,
        )
        for b in branches[:-1]
    )
    return ast.Union((*copied, last), tuple(_at(u) for u in unions))


TRANSFORMER = ToAst()


# Lark's v_args wraps a callback anew at every node it visits (the class attribute is a
# descriptor); bound once on the instance, a node costs one call: a fifth of parsing time.
for _name, _value in vars(ToAst).items():
    if not _name.startswith("_") and callable(_value):
        setattr(TRANSFORMER, _name, getattr(TRANSFORMER, _name))
