"""Type every expression of a query at plan time, from the stream's and tables' schemas.

Compiled expressions run inside shared operators on every sample: a `TypeError` there (text plus
a number) would fail the query on its first tuple, and `text * 2000000` would grow without bound.
So arithmetic takes numbers only, comparisons take two values of one kind, conditions are
boolean, and SUM/AVG take numbers; anything else is a `QueryTypeError` naming the expression,
its line and column, before anything is installed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from fjords.compile.sql import ast
from fjords.errors import QueryTypeError

# Kinds: "int", "float", "str", "bool", and "null" (a NULL literal: fits anywhere).
NUMERIC = frozenset({"int", "float"})
# Integer arithmetic is exact and unbounded in Python: `a * a * ...` of big numerals could make
# numbers of thousands of digits per tuple (slow, and JSON refuses past 4,300). Integer results
# are bounded by this many digits, worked out from the expression; floats are not affected.
MAX_INT_DIGITS = 40
_COLUMN_DIGITS = 19  # a 64-bit integer column
ColumnType = Callable[[ast.Column], str]


def _fail(expr: ast.Expr, message: str) -> QueryTypeError:
    line, col = expr.pos if expr.pos is not None else (None, None)
    return QueryTypeError(message, ast.to_sql(expr), line, col)


def _describe(expr: ast.Expr, kind: str) -> str:
    if kind == "null":
        return "NULL"
    shown = ast.to_sql(expr)
    return f"{shown} ({_KIND_NAMES[kind]})"


_KIND_NAMES = {"int": "integer", "float": "number", "str": "text", "bool": "boolean"}


class TypeChecker:
    """`column_type(col)` gives a resolved column's schema type (int, float, str or bool)."""

    def __init__(self, column_type: ColumnType) -> None:
        self.column_type = column_type

    def check_query(
        self,
        select: Iterable[ast.Expr],
        where: Iterable[ast.Expr],
        group_by: Iterable[ast.Expr],
        having: ast.Expr | None,
    ) -> None:
        for e in select:
            self.infer(e)
        for e in group_by:
            self.infer(e)
        for e in where:
            self.condition(e, "WHERE")
        if having is not None:
            self.condition(having, "HAVING")

    def condition(self, expr: ast.Expr, clause: str) -> None:
        kind = self.infer(expr)
        if kind not in ("bool", "null"):
            raise _fail(expr, f"{clause} needs a condition; {_describe(expr, kind)} is not one")

    def infer(self, expr: ast.Expr) -> str:
        """The kind of `expr`'s values; raises QueryTypeError where kinds do not fit."""
        match expr:
            case ast.Literal(value=v):
                if v is None:
                    return "null"
                if isinstance(v, bool):
                    return "bool"
                if isinstance(v, int):
                    return "int"
                return "float" if isinstance(v, float) else "str"
            case ast.Column():
                return self.column_type(expr)
            case ast.Now() | ast.Interval():
                return "float"
            case ast.Aggregate(func=func, arg=arg):
                if arg is None:
                    return "int"
                kind = self.infer(arg)
                if func == "COUNT":
                    return "int"
                if func in ("SUM", "AVG"):
                    if kind not in NUMERIC and kind != "null":
                        raise _fail(
                            expr,
                            f"{func} needs numbers; {_describe(arg, kind)} is not "
                            "(COUNT, MIN and MAX work on any kind)",
                        )
                    return "float" if func == "AVG" else kind
                return kind
            case ast.BinaryOp(op=op, left=a, right=b):
                ka, kb = self.infer(a), self.infer(b)
                for side, kind in ((a, ka), (b, kb)):
                    if kind not in NUMERIC and kind != "null":
                        other = b if side is a else a
                        raise _fail(
                            expr,
                            f"'{op}' takes numbers; {_describe(side, kind)} is not "
                            f"(with {_describe(other, kb if side is a else ka)})",
                        )
                if "null" in (ka, kb):
                    return "null"
                if op == "/" or "float" in (ka, kb):
                    return "float"
                digits = _int_digits(expr)
                if digits > MAX_INT_DIGITS:
                    raise _fail(
                        expr,
                        f"integer results could reach {digits} digits (at most {MAX_INT_DIGITS}); "
                        "use a decimal number (e.g. 1.0 * ...) for a float result",
                    )
                return "int"
            case ast.Neg(operand=o):
                kind = self.infer(o)
                if kind not in NUMERIC and kind != "null":
                    raise _fail(expr, f"'-' takes a number; {_describe(o, kind)} is not")
                return kind
            case ast.Compare(left=a, right=b):
                self._comparable(expr, a, b)
                return "bool"
            case ast.InList(expr=e, values=values):
                for item in values:
                    self._comparable(expr, e, item)
                return "bool"
            case ast.Between(expr=e, low=lo, high=hi):
                self._comparable(expr, e, lo)
                self._comparable(expr, e, hi)
                return "bool"
            case ast.IsNull(expr=e):
                self.infer(e)
                return "bool"
            case ast.And(items=items) | ast.Or(items=items):
                word = "AND" if isinstance(expr, ast.And) else "OR"
                for i in items:
                    kind = self.infer(i)
                    if kind not in ("bool", "null"):
                        raise _fail(
                            expr, f"{word} joins conditions; {_describe(i, kind)} is not one"
                        )
                return "bool"
            case ast.Not(operand=o):
                kind = self.infer(o)
                if kind not in ("bool", "null"):
                    raise _fail(expr, f"NOT takes a condition; {_describe(o, kind)} is not one")
                return "bool"
            case ast.Func(name=name, args=args):
                return self._func(expr, name, args)
            case ast.Case(whens=whens, otherwise=otherwise):
                for cond, _ in whens:
                    kind = self.infer(cond)
                    if kind not in ("bool", "null"):
                        raise _fail(
                            cond, f"CASE WHEN needs a condition; {_describe(cond, kind)} is not one"
                        )
                results = [v for _, v in whens] + ([otherwise] if otherwise is not None else [])
                return self._common(expr, "CASE results", results)
        raise _fail(expr, "cannot type this expression")

    def _func(self, expr: ast.Expr, name: str, args: tuple[ast.Expr, ...]) -> str:
        if name == "GROUPING":  # 1 where the column is rolled up in the row, else 0
            self.infer(args[0])
            return "int"
        if name == "FLOAT":  # internal (fjords.compile.analysis): an integer made a float
            self.infer(args[0])
            return "float"
        if name in ("ABS", "ROUND"):
            kind = self.infer(args[0])
            if kind not in NUMERIC and kind != "null":
                raise _fail(expr, f"{name} takes a number; {_describe(args[0], kind)} is not")
            if len(args) > 1:
                d = args[1]
                if not (
                    isinstance(d, ast.Literal)
                    and isinstance(d.value, int)
                    and not isinstance(d.value, bool)
                    and -30 <= d.value <= 30
                ):
                    raise _fail(
                        expr,
                        "ROUND's digits must be a whole number from -30 to 30, e.g. ROUND(x, 1)",
                    )
            return kind
        return self._common(expr, f"{name}'s arguments", list(args))

    def _common(self, expr: ast.Expr, what: str, values: list[ast.Expr]) -> str:
        """The one kind of several values (numbers mix: a float among them makes a float)."""
        kinds = [self.infer(v) for v in values]
        known = [k for k in kinds if k != "null"]
        if not known:
            return "null"
        if all(k in NUMERIC for k in known):
            return "float" if "float" in known else "int"
        first = next(v for v, k in zip(values, kinds, strict=True) if k != "null")
        for v, k in zip(values, kinds, strict=True):
            if k != "null" and k != known[0]:
                raise _fail(
                    expr,
                    f"{what} must be of one kind; {_describe(first, known[0])} and "
                    f"{_describe(v, k)} are not",
                )
        return known[0]

    def _comparable(self, where: ast.Expr, a: ast.Expr, b: ast.Expr) -> None:
        ka, kb = self.infer(a), self.infer(b)
        if ka == kb or "null" in (ka, kb) or (ka in NUMERIC and kb in NUMERIC):
            return
        # A literal against a column of another kind is SQL's implicit cast (coerce_literals);
        # it never raises at run time (a failed comparison is NULL), so it is let through.
        if isinstance(a, ast.Literal) or isinstance(b, ast.Literal):
            return
        raise _fail(where, f"cannot compare {_describe(a, ka)} with {_describe(b, kb)}")


def _int_digits(expr: ast.Expr) -> int:
    """An upper bound on the decimal digits of an integer expression's values."""
    match expr:
        case ast.Literal(value=v) if isinstance(v, int) and not isinstance(v, bool):
            return len(str(abs(v)))
        case ast.BinaryOp(op="*", left=a, right=b):
            return _int_digits(a) + _int_digits(b)
        case ast.BinaryOp(left=a, right=b):
            return max(_int_digits(a), _int_digits(b)) + 1
        case ast.Neg(operand=o):
            return _int_digits(o)
        case ast.Aggregate(func="SUM", arg=a) if a is not None:
            return _int_digits(a) + 10  # up to 10^10 rows
        case ast.Func(name="ABS" | "ROUND", args=args):
            return _int_digits(args[0]) + 1
        case ast.Func(args=args):
            return max(_int_digits(a) for a in args)
        case ast.Case(whens=whens, otherwise=o):
            values = [v for _, v in whens] + ([o] if o is not None else [])
            return max(_int_digits(v) for v in values)
    return _COLUMN_DIGITS
