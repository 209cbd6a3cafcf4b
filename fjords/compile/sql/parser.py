"""Parse the SQL dialect into the syntax tree of fjords.compile.sql.ast (Lark, LALR).

Query text is only ever parsed, never evaluated. Every error, from a stray character to an
unknown function, becomes a QuerySyntaxError with the line, the column and what was expected.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from dataclasses import fields, replace
from importlib.resources import files
from typing import Any

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import (
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
    VisitError,
)

from fjords.compile.sql import ast
from fjords.errors import QuerySyntaxError

_UNITS = {
    "MILLISECOND": 0.001,
    "SECOND": 1.0,
    "MINUTE": 60.0,
    "HOUR": 3600.0,
    "DAY": 86400.0,
    "WEEK": 604800.0,
}

# Human names for the grammar's terminals in "expected ..." lists.
_TOKEN_NAMES = {
    "NAME": "identifier",
    "QUOTED_NAME": "identifier",
    "NUMBER": "number",
    "INT": "integer",
    "STRING": "string",
    "UNIT": "time unit (MILLISECONDS, SECONDS, MINUTES, HOURS, DAYS, WEEKS)",
    "COMP_OP": "comparison",
    "ADD_OP": "'+' or '-'",
    "MUL_OP": "'*' or '/'",
    "LPAR": "'('",
    "RPAR": "')'",
    "COMMA": "','",
    "DOT": "'.'",
    "STAR": "'*'",
    "LSQB": "'['",
    "RSQB": "']'",
    "SEMICOLON": "';'",
    "MINUS": "'-'",
    "$END": "end of query",
}


def _cache_file() -> str | bool:
    """Where the built parser is kept between runs, or False (none).

    Building the LALR tables is about half a second of every start (`python -m fjords`, each
    CLI command); loaded from the cache it is a few milliseconds. Lark checks the file
    against a hash of the grammar, options and versions, and rebuilds on a mismatch. The
    file is a pickle, so it lives in the user's own cache directory (never a shared
    temporary one), and only if that directory is the user's."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    d = os.path.join(base, "fjords-gateway")
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        st = os.stat(d)
    except OSError:
        return False
    if st.st_uid != os.getuid() or st.st_mode & 0o022 or not os.access(d, os.W_OK):
        return False
    return os.path.join(d, "sql-parser.lark")


_PARSER = Lark(
    files("fjords.compile.sql").joinpath("grammar.lark").read_text(),
    parser="lalr",
    maybe_placeholders=False,
    cache=_cache_file(),
    # No propagate_positions: it doubled the parse time of long IN lists. Expression nodes get
    # their position from their first token instead (`_at`).
)

# Deeper expressions are refused: the transformer and everything downstream that walks the
# tree (hashing, planning, evaluation) recurse, and a hostile query must not exhaust the stack.
MAX_DEPTH = 100
MAX_INT_DIGITS = 18  # an integer numeral fits a signed 64-bit integer


def _token_name(name: str) -> str:
    if name in _TOKEN_NAMES:
        return _TOKEN_NAMES[name]
    return name.lstrip("_").upper()


class _Error(Exception):
    """Raised inside the transformer; carries a token for the position."""

    def __init__(self, message: str, token: Token | None, expected: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.message, self.token, self.expected = message, token, expected


_FUNCTIONS = (*ast.AGGREGATE_FUNCTIONS, *ast.SCALAR_FUNCTIONS)


def _check_function(name: Token) -> None:
    if name.upper() not in _FUNCTIONS:
        known = ", ".join(_FUNCTIONS)
        raise _Error(f"unknown function {name}; the functions are {known}", name, _FUNCTIONS)


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


def _seconds(number: float | int, unit: Token) -> float:
    u = unit.upper().rstrip("S")
    return float(number) * _UNITS[u]


@v_args(inline=True)
class _ToAst(Transformer):
    def start(self, query: ast.Statement) -> ast.Statement:
        return query

    def set_op(self, kw: Token, *all_: Token) -> Token:
        if not all_:
            raise _Error(
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
        having = None
        options: dict[str, float] = {}
        positions: list[tuple[str, ast.Pos]] = []
        for part in rest:
            if isinstance(part, ast.TableRef):
                sources.append(part)
            elif isinstance(part, tuple) and part and part[0] == "where":
                where = part[1]
            elif isinstance(part, tuple) and part and part[0] == "group":
                group_by = part[1]
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
                    raise _Error(f"{token.upper()} is given twice", token)
                options[key] = value
                positions.append((str(token).upper(), _at(token)))
        if distinct is not None:
            positions.append(("DISTINCT", _at(distinct)))
        return ast.Query(
            select=select,  # type: ignore[arg-type]
            sources=tuple(sources),
            where=where,
            group_by=group_by,
            having=having,
            sample_period_s=options.get("sample_period"),
            emit_every_s=options.get("emit_every"),
            lifetime_s=options.get("lifetime"),
            priority=options.get("priority"),  # type: ignore[arg-type]  # an int (`priority`)
            distinct=distinct is not None,
            order_by=order_by,
            limit=limit,
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
                    raise _Error(f"{name} has two windows", name)
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
            raise _Error(f"duration {number.value} {unit} is too large", unit)
        return seconds

    # -- clauses -------------------------------------------------------------------------
    def where_clause(self, expr: ast.Expr) -> tuple:
        return ("where", expr)

    def group_clause(self, kw: Token, *exprs: ast.Expr) -> tuple:
        return ("group", tuple(exprs), _at(kw))

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
            raise _Error(f"LIMIT {n} is too large", n)
        return ("limit", int(n), _at(kw))

    def sample_period(self, kw: Token, seconds: float) -> tuple:
        return (
            "option",
            "sample_period",
            seconds,
            Token(kw.type, "SAMPLE PERIOD", kw.start_pos, kw.line, kw.column),
        )

    def emit_every(self, kw: Token, seconds: float) -> tuple:
        return (
            "option",
            "emit_every",
            seconds,
            Token(kw.type, "EMIT EVERY", kw.start_pos, kw.line, kw.column),
        )

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
            raise _Error(
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
            raise _Error(f"number {text} is too large", tok)
        return ast.Literal(value, _at(tok))

    def interval(self, number: ast.Literal, unit: Token) -> ast.Interval:
        seconds = _seconds(number.value, unit)  # type: ignore[arg-type]
        if math.isinf(seconds):
            raise _Error(f"duration {number.value} {unit} is too large", unit)
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
            raise _Error(f"{name.upper()}(*) is not allowed; only COUNT takes '*'", name)
        return ast.Aggregate("COUNT", None, _at(name))

    def call(self, name: Token, *args: ast.Expr) -> ast.Expr:
        _check_function(name)
        func = name.upper()
        if func in ast.AGGREGATE_FUNCTIONS:
            if len(args) != 1:
                raise _Error(f"{func} takes one argument, got {len(args)}", name)
            return ast.Aggregate(func, args[0], _at(name))
        least, most = ast.SCALAR_FUNCTIONS[func]
        if len(args) < least or (most is not None and len(args) > most):
            if most is None:
                wanted = f"at least {least} arguments"
            elif least == most:
                wanted = f"{least} argument{'s' if least != 1 else ''}"
            else:
                wanted = f"{least} to {most} arguments"
            raise _Error(f"{func} takes {wanted}, got {len(args)}", name)
        return ast.Func(func, tuple(args), _at(name))

    def call_distinct(self, name: Token, _kw: Token, arg: ast.Expr) -> ast.Aggregate:
        _check_function(name)
        if name.upper() != "COUNT":
            raise _Error(f"{name.upper()}(DISTINCT ...) is not supported; only COUNT", name)
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
                raise _Error(
                    f"{clause} is not supported in a UNION ALL: its rows come out in "
                    "sample-time order; sort per window in a query of its own",
                    _at_pos(pos),
                )
        pos = b.pos_of("EMIT EVERY")
        if pos is not None:
            raise _Error(
                "EMIT EVERY is not supported in a UNION ALL: give the branch's window a "
                "SLIDE instead, e.g. [RANGE 1 HOUR SLIDE 15 MINUTES]",
                _at_pos(pos),
            )
        if i == len(branches) - 1:
            break
        for clause in _UNION_OPTIONS:
            pos = b.pos_of(clause)
            if pos is not None:
                raise _Error(
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


_TRANSFORMER = _ToAst()
# Lark's v_args wraps a callback anew at every node it visits (the class attribute is a
# descriptor); bound once on the instance, a node costs one call: a fifth of parsing time.
for _name, _value in vars(_ToAst).items():
    if not _name.startswith("_") and callable(_value):
        setattr(_TRANSFORMER, _name, getattr(_TRANSFORMER, _name))


def parse(text: str) -> ast.Statement:
    """Parse one query (or a UNION ALL of queries, an `ast.Union`); raises QuerySyntaxError (line, column, expected) on any bad input."""
    if not isinstance(text, str):
        raise QuerySyntaxError("a query must be text", 1, 1)
    if not text.strip():
        raise QuerySyntaxError("empty query", 1, 1, ("SELECT",))
    _check_encodable(text)
    _check_unsupported(text)
    return _SHAPES.parse(text)


def _parse_checked(text: str) -> ast.Statement:
    """The Lark parse and the transform of a text that passed parse()'s checks."""
    try:
        tree = _PARSER.parse(text)
    except UnexpectedInput as e:
        raise _syntax_error(e, text) from None
    _check_depth(tree)
    try:
        return _TRANSFORMER.transform(tree)
    except VisitError as e:
        inner = e.orig_exc
        if isinstance(inner, _Error):
            tok = inner.token
            line, col = (
                (tok.line, tok.column or 1) if tok is not None and tok.line is not None else (1, 1)
            )
            raise QuerySyntaxError(inner.message, line, col, inner.expected) from None
        raise QuerySyntaxError(f"cannot read query: {inner}", 1, 1) from None


def _check_depth(tree: Tree) -> None:
    """Refuse trees nested deeper than MAX_DEPTH, walking iteratively (no recursion yet)."""
    stack: list[tuple[Tree | Token, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, Tree):
            continue
        # A flat `a + b + c` chain becomes len//2 nested BinaryOps in the syntax tree.
        depth += max(1, len(node.children) // 2) if node.data in ("sum", "product") else 1
        if depth > MAX_DEPTH:
            line, col = _first_position(node)
            raise QuerySyntaxError(
                f"expression nested more than {MAX_DEPTH} levels deep", line, col
            )
        stack.extend((child, depth) for child in node.children)


def _first_position(node: Tree) -> tuple[int, int]:
    """The line and column of the first token under `node` (iteratively)."""
    stack: list[Tree | Token] = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, Token):
            if n.line is not None:
                return n.line, n.column or 1
            continue
        stack.extend(reversed(n.children))
    return 1, 1


def _check_encodable(text: str) -> None:
    """Query text is stored (SQLite) and echoed (JSON, MQTT): it must be valid UTF-8, so a lone
    surrogate (`"\\ud800"` in JSON) is refused here, before anything is installed or saved."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        before = text[: e.start]
        line = before.count("\n") + 1
        col = e.start - (before.rfind("\n") + 1) + 1
        raise QuerySyntaxError(
            f"the query is not valid UTF-8 text (a lone surrogate {text[e.start]!r})", line, col
        ) from None


def _expected(e: UnexpectedInput, text: str, fallback: Iterable[str]) -> tuple[str, ...]:
    """The terminals that may really come next at the error.

    Lark's own list is read after the bad token already forced some reductions, and LALR merges
    lookaheads across contexts, so it both misses (`AND` after `a = 1`) and over-reports. Only
    on this error path, re-run the parse up to the bad token (linear: no per-token copies) and
    ask that state which terminals it accepts.
    """
    names: Iterable[str] = fallback
    bad_pos: int | None = None
    if isinstance(e, UnexpectedToken) and e.token.type != "$END":
        bad_pos = e.token.start_pos
    try:
        names = _accepts_before_error(text, bad_pos)
    except Exception:  # noqa: BLE001 -- only a nicer hint is lost; keep Lark's own list
        names = fallback
    return tuple(
        sorted({_token_name(t) for t in names or () if not t.startswith("__") and "<" not in t})
    )


def _accepts_before_error(text: str, bad_pos: int | None) -> set[str]:
    """Re-feed the tokens before `bad_pos` (None: all of them, the error was at the end)."""
    parser = _PARSER.parse_interactive(text)
    try:
        for tok in parser.lexer_thread.lex(parser.parser_state):
            if tok.start_pos == bad_pos:
                break
            parser.feed_token(tok)
    except UnexpectedInput:  # the lexer failed, so nothing was fed: the state is exact
        pass
    return parser.accepts()


_JOIN_HINT = (
    "JOIN ... ON is not supported; list the sources in FROM separated by commas and put the "
    "join condition in WHERE (FROM traffic AS s, incidents AS i WHERE i.segment = s.segment)"
)
_SET_HINT = "is not supported (yet); UNION ALL is"
# SQL words the dialect reserves but does not have: the message for each, at the word.
_UNSUPPORTED = {
    "OFFSET": "OFFSET is not supported (yet)",
    "FETCH": "FETCH is not supported (yet)",
    "ALL": "ALL is not supported (yet)",
    "INTERSECT": f"INTERSECT {_SET_HINT}",
    "EXCEPT": f"EXCEPT {_SET_HINT}",
    "MINUS": f"MINUS {_SET_HINT}",
    "JOIN": _JOIN_HINT,
    "ON": _JOIN_HINT,
    "USING": _JOIN_HINT,
    "INNER": _JOIN_HINT,
    "OUTER": _JOIN_HINT,
    "LEFT": _JOIN_HINT,
    "RIGHT": _JOIN_HINT,
    "FULL": _JOIN_HINT,
    "CROSS": _JOIN_HINT,
    "NATURAL": _JOIN_HINT,
    "WITH": "WITH (common table expressions) is not supported",
    "OVER": "window functions (OVER) are not supported; put a window on the stream, "
    "e.g. FROM traffic [RANGE 15 MINUTES]",
    "PARTITION": "PARTITION BY is not supported; GROUP BY in a window on the stream instead",
    "WINDOW": "a WINDOW clause is not supported; put the window after the stream, "
    "e.g. FROM traffic [RANGE 15 MINUTES]",
    "INTO": "SELECT ... INTO is not supported: a query's results are published, not stored",
    "VALUES": "VALUES is not supported: a query reads sensor streams and tables",
    "INSERT": "only SELECT queries are supported",
    "UPDATE": "only SELECT queries are supported",
    "DELETE": "only SELECT queries are supported",
}
# Strings, quoted names and comments are skipped; a bare unsupported word is group 1. ASCII
# only, as the grammar's words are: with Unicode rules IGNORECASE took 'İnto' for INTO (and
# the message lookup then failed with a KeyError).
_SCAN = re.compile(
    r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|\b(" + "|".join(_UNSUPPORTED) + r")\b",
    re.IGNORECASE | re.ASCII,
)


_AFTER_UNION = re.compile(r"\bUNION\s*$", re.IGNORECASE | re.ASCII)
_WORD = re.compile(r"\w+", re.ASCII)


def _check_unsupported(text: str) -> None:
    """A reserved-but-unsupported word gets its own message at the word, wherever it is: the
    LALR parse alone would read `x = 1 ORDER BY x` as `x = 1 OR DER ...` and blame `BY`."""
    # Most queries have none of the words anywhere: their words, in capitals, tell so at a
    # fifth of the scan's cost.
    if not _UNSUPPORTED.keys().isdisjoint(map(str.upper, _WORD.findall(text))):
        _scan_unsupported(text)


def _scan_unsupported(text: str) -> None:
    for m in _SCAN.finditer(text):
        if m.group(1) is None:
            continue
        if m.group(1).upper() == "ALL" and _AFTER_UNION.search(text, 0, m.start()):
            continue  # UNION ALL
        before = text[: m.start()]
        line = before.count("\n") + 1
        col = m.start() - (before.rfind("\n") + 1) + 1
        raise QuerySyntaxError(_UNSUPPORTED[m.group(1).upper()], line, col)


def _syntax_error(e: UnexpectedInput, text: str) -> QuerySyntaxError:
    line, col = max(e.line, 1), max(e.column, 1)
    if isinstance(e, UnexpectedCharacters):
        at = e.pos_in_stream
        ch = text[at] if at is not None and at < len(text) else ""
        if ch == "'":
            return QuerySyntaxError("unterminated string", line, col, ("closing '",))
        if ch == '"':
            if text.startswith('""', e.pos_in_stream):
                return QuerySyntaxError("empty quoted identifier", line, col, ("identifier",))
            return QuerySyntaxError("unterminated quoted identifier", line, col, ('closing "',))
        return QuerySyntaxError(
            f"unexpected character {ch!r}", line, col, _expected(e, text, e.allowed)
        )
    if isinstance(e, UnexpectedToken):
        tok = e.token
        expected = _expected(e, text, e.expected)
        if tok.type == "$END":
            if tok.end_line is None:  # no token at all: only comments
                return QuerySyntaxError("empty query", 1, 1, ("SELECT",))
            # Lark's $END borrows the last token's position; point just past that token.
            return QuerySyntaxError(
                "unexpected end of query", tok.end_line, tok.end_column, expected
            )
        if "identifier" in expected and re.fullmatch(r"[A-Za-z_]+", str(tok)):
            # a reserved word where a name may stand (`SELECT x AS union`)
            return QuerySyntaxError(
                f"unexpected {str(tok)!r}: {str(tok).upper()} is a reserved word; quote it "
                f'("{tok}") to use it as a name',
                line,
                col,
                expected,
            )
        return QuerySyntaxError(f"unexpected {str(tok)!r}", line, col, expected)
    if isinstance(e, UnexpectedEOF):
        return QuerySyntaxError(
            "unexpected end of query", line, col, _expected(e, text, e.expected)
        )
    return QuerySyntaxError(str(e).splitlines()[0], line, col)


# -- queries that differ only in their numbers share one parse ------------------------------------

# A number where the lexer sees a NUMBER token (not inside a name; inside a string or a comment
# it is found too, but then no Literal sits at its position and it is not rebound).
_NUMERAL = re.compile(r"(?<![\w.])(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?(?![\w.])")
_DIGIT = re.compile(r"\d")
_DIGITS = re.compile(r"\d+")
_MISSING = object()


class _Shape:
    """The parses of one text shape: its numerals' digits masked, so each numeral keeps its
    length and every position in the text stays where it was."""

    __slots__ = ("bindable", "trees")

    def __init__(self, bindable: tuple[bool, ...]) -> None:
        self.bindable = bindable  # per numeral: a Literal of exactly its value sits at it
        # The other numerals' texts (a RANGE's `15`, a folded `-5`) -> the tree parsed for
        # them, and where its rebindable Literals are (`_paths`).
        self.trees: dict[tuple[str, ...], tuple[ast.Statement, dict | None]] = {}

    def keep(self, others: tuple[str, ...], text: str, spans: list, tree: ast.Statement) -> None:
        bound = {
            _position(text, start)
            for (start, _), bind in zip(spans, self.bindable, strict=True)
            if bind
        }
        self.trees[others] = (tree, _paths(tree, bound) if bound else None)


class _ShapeCache:
    """Queries that differ only in their numeric literals (a thousand range filters, a
    dashboard's thresholds) share one Lark parse: the cached tree gets the new values at the
    literals' positions. A numeral is rebound only where the first parse of its shape, and a
    second one with every numeral changed, both put a Literal of exactly that numeral's value
    at its position: a folded `-5`, a duration or anything else that reads the value is
    parsed again (its text is part of the key). Bounded: past `max_shapes` shapes it starts
    afresh."""

    def __init__(self, max_shapes: int = 256, max_trees: int = 64) -> None:
        self.max_shapes, self.max_trees = max_shapes, max_trees
        self.shapes: dict[str, _Shape | None] = {}
        # The same text but for the numerals' lengths (`99.9` and `99.999` alike) -> which
        # numerals were learned to be plain literals (a range filter's bounds come in many
        # lengths: 1,000 of them made 34 shapes, each learned by a second parse).
        self.families: dict[str, tuple[bool, ...]] = {}

    def parse(self, text: str) -> ast.Statement:
        spans = [m.span() for m in _NUMERAL.finditer(text)]
        key = _masked(text, spans)
        shape = self.shapes.get(key, _MISSING)
        if shape is _MISSING:
            tree = _parse_checked(text)  # raises for a bad query: nothing is cached
            if len(self.shapes) >= self.max_shapes:
                self.shapes.clear()
                self.families.clear()
            family = _masked(text, spans, _DIGITS)
            shape = _borrow(self.families.get(family), text, spans, tree)
            if shape is None:
                shape = _learn(text, spans, tree)
                if shape is not None:
                    self.families[family] = shape.bindable
            self.shapes[key] = shape
            if shape is not None:
                shape.keep(_others(text, spans, shape), text, spans, tree)
            return tree
        if shape is None:  # a shape whose numerals cannot be rebound
            return _parse_checked(text)
        assert isinstance(shape, _Shape)
        others = _others(text, spans, shape)
        kept = shape.trees.get(others)
        if kept is None:
            tree = _parse_checked(text)
            if len(shape.trees) < self.max_trees:
                shape.keep(others, text, spans, tree)
            return tree
        tree, trie = kept
        if trie is None:
            return tree
        values: dict[ast.Pos, object] = {}
        for (start, end), bind in zip(spans, shape.bindable, strict=True):
            if bind:
                value = _numeral(text[start:end])
                if value is None:  # too large: the full parse says so, at its position
                    return _parse_checked(text)
                values[_position(text, start)] = value
        return _rebind(tree, trie, values)


def _masked(text: str, spans: list[tuple[int, int]], digits: re.Pattern = _DIGIT) -> str:
    if not spans:
        return text
    out, last = [], 0
    for start, end in spans:
        out.append(text[last:start])
        out.append(digits.sub("9", text[start:end]))
        last = end
    out.append(text[last:])
    return "".join(out)


def _others(text: str, spans: list[tuple[int, int]], shape: _Shape) -> tuple[str, ...]:
    return tuple(text[s:e] for (s, e), bind in zip(spans, shape.bindable, strict=True) if not bind)


def _numeral(text: str) -> int | float | None:
    """A numeral's value as `_ToAst.number` gives it (None: too large)."""
    if not any(c in text for c in ".eE") and len(text.lstrip("0")) <= MAX_INT_DIGITS:
        return int(text)
    value = float(text)
    return None if math.isinf(value) else value


def _position(text: str, offset: int) -> tuple[int, int]:
    line_start = text.rfind("\n", 0, offset) + 1
    return (text.count("\n", 0, offset) + 1, offset - line_start + 1)


def _borrow(
    bindable: tuple[bool, ...] | None, text: str, spans: list[tuple[int, int]], tree: ast.Statement
) -> _Shape | None:
    """A new shape of a known family: the same numerals are plain literals (the parser reads
    a numeral's value only through its token, and the family's own learning changed every
    digit), checked on this text's own tree; None where any is not (then it is learned)."""
    if bindable is None or len(bindable) != len(spans):
        return None
    here = _literals(tree)
    for (start, end), bind in zip(spans, bindable, strict=True):
        if bind and not _same(
            here.get(_position(text, start), _MISSING), _numeral(text[start:end])
        ):
            return None
    return _Shape(bindable)


def _learn(text: str, spans: list[tuple[int, int]], tree: ast.Statement) -> _Shape | None:
    """Which numerals of `text` are plain Literals of their own value: checked on `tree` and
    on a parse with every numeral changed (distinct non-zero digits, same lengths), so that
    a value the parser transformed (negated, a duration) is never taken for a literal."""
    if not spans:
        return _Shape(())
    changed_text = []
    last = 0
    for i, (start, end) in enumerate(spans):
        changed_text.append(text[last:start])
        changed_text.append(_DIGIT.sub(str(1 + i % 9), text[start:end]))
        last = end
    changed_text.append(text[last:])
    changed = "".join(changed_text)
    try:
        other = _parse_checked(changed)
    except QuerySyntaxError:
        return None
    here, there = _literals(tree), _literals(other)
    bindable = []
    for start, end in spans:
        pos = _position(text, start)
        a, b = here.get(pos, _MISSING), there.get(pos, _MISSING)
        new = changed[start:end]
        bindable.append(_same(a, _numeral(text[start:end])) and _same(b, _numeral(new)))
    return _Shape(tuple(bindable))


def _same(a: object, b: object) -> bool:
    return a is not _MISSING and b is not None and type(a) is type(b) and a == b


def _literals(tree: object) -> dict[ast.Pos, object]:
    """Position -> value of every numeric Literal in `tree` (_MISSING where two disagree)."""
    out: dict[ast.Pos, object] = {}
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Literal):
            if node.pos is not None and isinstance(node.value, int | float):
                seen = out.get(node.pos, node.value)
                same = type(seen) is type(node.value) and seen == node.value
                out[node.pos] = node.value if same else _MISSING
        elif isinstance(node, tuple):
            stack.extend(node)
        elif hasattr(node, "__dataclass_fields__"):
            stack.extend(getattr(node, f) for f in _fields_of(type(node)))
    return out


_FIELDS: dict[type, tuple[str, ...]] = {}


def _fields_of(cls: type) -> tuple[str, ...]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in fields(cls))
    return names


def _paths(node: Any, positions: set[tuple[int, int]]) -> dict | None:
    """Where in `node` the Literals at `positions` are: a trie of field names and tuple
    indices whose leaves are the Literals' positions (None: none there)."""
    if isinstance(node, ast.Literal):
        return {None: node.pos} if node.pos in positions else None
    if isinstance(node, tuple):
        keys: Any = enumerate(node)
    elif hasattr(node, "__dataclass_fields__"):
        keys = ((name, getattr(node, name)) for name in _fields_of(type(node)))
    else:
        return None
    trie = {}
    for key, child in keys:
        sub = _paths(child, positions)
        if sub is not None:
            trie[key] = sub
    return trie or None


def _rebind(node: Any, trie: dict, values: dict[ast.Pos, object]) -> Any:
    """`node` with new values for the Literals `trie` leads to (the rest shared)."""
    if None in trie:
        pos = trie[None]
        return ast.Literal(values[pos], pos)  # type: ignore[arg-type]
    if isinstance(node, tuple):
        items = list(node)
        for i, sub in trie.items():
            items[i] = _rebind(items[i], sub, values)
        return tuple(items)
    # A copy with the new children, field by field: the syntax tree's classes are frozen
    # dataclasses with neither __post_init__ nor init=False fields (checked in the tests),
    # and dataclasses.replace validated its arguments at ~3x the cost of the copy.
    new = object.__new__(type(node))
    for name in _fields_of(type(node)):
        sub = trie.get(name)
        value = getattr(node, name)
        _set(new, name, value if sub is None else _rebind(value, sub, values))
    return new


_set = object.__setattr__


_SHAPES = _ShapeCache()
