"""Compile syntax-tree expressions into Python closures over tuples.

Query text is parsed, never evaluated: each node becomes a small closure reading `t[i]` with
positions resolved once at plan time. SQL NULL is None; comparisons and arithmetic with a NULL
give NULL, and a NULL condition does not pass.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from fjords.compile.sql import ast
from fjords.errors import QueryError, QueryPlanError

Fn = Callable[[tuple], Any]  # a SQL value of the row: any kind, or None (NULL)
Resolver = Callable[[ast.Expr], "Fn | int | None"]

_CMP: dict[str, Callable[[Any, Any], Any]] = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_ARITH = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


_COLUMNS: dict[int, Fn] = {}  # position -> its reader, shared (see _column)


def _column(i: int) -> Fn:
    """`lambda t: t[i]`, one per position shared by every query that reads it: a closure is
    ~100 bytes, and thousands of installed queries read the same few columns."""
    f = _COLUMNS.get(i)
    if f is None:
        f = lambda t: t[i]  # noqa: E731  # the shape fjords.runtime.operators.aggregate recognises
        if len(_COLUMNS) < 4096:
            _COLUMNS[i] = f
    return f


def compile_expr(expr: ast.Expr, resolve: Resolver) -> Fn:
    """`resolve(node)` maps a leaf the caller knows (a Column, an Aggregate, NOW...) to a tuple
    position or a ready closure; it returns None for nodes it leaves to this compiler."""
    hit = resolve(expr)
    if isinstance(hit, int):
        return _column(hit)
    if hit is not None:
        return hit
    match expr:
        case ast.Literal(value=v) | ast.Interval(seconds=v):
            return lambda t: v
        case ast.Column():
            name = f"{expr.table}.{expr.name}" if expr.table else expr.name
            raise QueryError(f"unknown column {name!r}")
        case ast.Now():
            raise QueryError("NOW is not available here")
        case ast.Aggregate():
            raise QueryError(f"aggregate {expr.func} is not allowed here")
        case ast.Neg(operand=o):
            f = compile_expr(o, resolve)

            def neg(t: tuple) -> object:
                v = f(t)
                return None if v is None else -v

            return neg
        case ast.BinaryOp(op=op, left=left, right=right):
            fn = _ARITH[op]
            a, b = compile_expr(left, resolve), compile_expr(right, resolve)

            def arith(t: tuple) -> object:
                x, y = a(t), b(t)
                if x is None or y is None:
                    return None
                if fn is operator.truediv and y == 0:
                    return None
                return fn(x, y)

            return arith
        case ast.Compare(op=op, left=left, right=right):
            return _compile_compare(op, left, right, resolve)
        case ast.InList(expr=e, values=values, negated=negated):
            f = compile_expr(e, resolve)
            if all(isinstance(v, ast.Literal) for v in values):
                consts = frozenset(v.value for v in values)  # type: ignore[union-attr]

                def in_set(t: tuple) -> object:
                    v = f(t)
                    return None if v is None else ((v in consts) != negated)

                return in_set
            fs = [compile_expr(v, resolve) for v in values]

            def in_list(t: tuple) -> object:
                v = f(t)
                return None if v is None else (any(v == g(t) for g in fs) != negated)

            return in_list
        case ast.Between(expr=e, low=lo, high=hi, negated=negated):
            f, flo, fhi = (
                compile_expr(e, resolve),
                compile_expr(lo, resolve),
                compile_expr(hi, resolve),
            )

            def between(t: tuple) -> object:
                v, a_, b_ = f(t), flo(t), fhi(t)
                if v is None or a_ is None or b_ is None:
                    return None
                try:
                    return (a_ <= v <= b_) != negated
                except TypeError:  # kinds that do not order (a literal of another kind): NULL
                    return None

            return between
        case ast.IsNull(expr=e, negated=negated):
            f = compile_expr(e, resolve)
            return lambda t: (f(t) is None) != negated
        case ast.And(items=items):
            fs = [compile_expr(i, resolve) for i in items]

            def and_(t: tuple) -> object:
                result: object = True
                for g in fs:
                    v = g(t)
                    if v is False:
                        return False
                    if v is None:
                        result = None
                return result

            return and_
        case ast.Or(items=items):
            fs = [compile_expr(i, resolve) for i in items]

            def or_(t: tuple) -> object:
                result: object = False
                for g in fs:
                    v = g(t)
                    if v is True:
                        return True
                    if v is None:
                        result = None
                return result

            return or_
        case ast.Not(operand=o):
            f = compile_expr(o, resolve)

            def not_(t: tuple) -> object:
                v = f(t)
                return None if v is None else not v

            return not_
        case ast.Func(name=name, args=args):
            return _compile_func(name, args, resolve)
        case ast.Case(whens=whens, otherwise=otherwise):
            pairs = tuple((compile_expr(c, resolve), compile_expr(v, resolve)) for c, v in whens)
            other = compile_expr(otherwise, resolve) if otherwise is not None else None

            def case(t: tuple) -> object:
                for cond, value in pairs:
                    if cond(t) is True:  # a NULL condition is not true
                        return value(t)
                return None if other is None else other(t)

            return case
    raise QueryError(f"cannot compile expression {expr!r}")


def round_half_up(v: object, digits: int = 0) -> object:
    """SQL's ROUND as Spark computes it: half away from zero on the number's shortest decimal
    text (Python's round() rounds half to even, and on the binary value)."""
    if v is None:
        return None
    q = Decimal(1).scaleb(-digits)
    if isinstance(v, int) and not isinstance(v, bool):
        return int(Decimal(v).quantize(q, ROUND_HALF_UP)) if digits < 0 else v
    if (isinstance(v, float) and v != v) or v in (float("inf"), float("-inf")):
        return v
    return float(Decimal(repr(v)).quantize(q, ROUND_HALF_UP))


def _compile_func(name: str, args: tuple[ast.Expr, ...], resolve: Resolver) -> Fn:
    """Scalar functions; NULL in gives NULL out, except COALESCE, LEAST and GREATEST, which
    skip NULLs (as Spark and PostgreSQL do)."""
    fs = tuple(compile_expr(a, resolve) for a in args)
    if (
        name == "FLOAT"
    ):  # internal: integers among floats (fjords.compile.analysis._promote_numbers)
        f = fs[0]
        return lambda t: None if (v := f(t)) is None else float(v)
    if name == "ABS":
        f = fs[0]

        def abs_(t: tuple) -> object:
            v = f(t)
            return None if v is None else abs(v)

        return abs_
    if name == "ROUND":
        f = fs[0]
        digits = args[1].value if len(args) > 1 else 0  # type: ignore[union-attr]  # typecheck
        return lambda t: round_half_up(f(t), digits)  # type: ignore[arg-type]
    if name == "COALESCE":

        def coalesce(t: tuple) -> object:
            for g in fs:
                v = g(t)
                if v is not None:
                    return v
            return None

        return coalesce
    pick = min if name == "LEAST" else max

    def extreme(t: tuple) -> object:
        vs = [v for v in (g(t) for g in fs) if v is not None]
        return pick(vs) if vs else None

    return extreme


def _compile_compare(op: str, left: ast.Expr, right: ast.Expr, resolve: Resolver) -> Fn:
    fn = _CMP[op]
    a, b = compile_expr(left, resolve), compile_expr(right, resolve)
    # Fast path: column against a constant, the shape of nearly every sensor filter.
    li = resolve(left)
    if isinstance(li, int) and isinstance(right, ast.Literal) and right.value is not None:
        i, c = li, right.value

        def cmp_const(t: tuple) -> object:
            v = t[i]
            return None if v is None else _safe(fn, v, c)

        return cmp_const

    def cmp(t: tuple) -> object:
        x, y = a(t), b(t)
        if x is None or y is None:
            return None
        return _safe(fn, x, y)

    return cmp


def _safe(fn: Callable[[Any, Any], Any], x: object, y: object) -> object:
    try:
        return fn(x, y)
    except TypeError:  # e.g. '<' between text and a number: no match rather than a crash
        return None


def as_predicate(fn: Fn) -> Callable[[tuple], bool]:
    """A condition passes only when it is True (NULL does not pass)."""
    return lambda t: fn(t) is True


def conjuncts(expr: ast.Expr | None) -> list[ast.Expr]:
    """Split a WHERE clause at its top-level ANDs."""
    if expr is None:
        return []
    if isinstance(expr, ast.And):
        out: list[ast.Expr] = []
        for i in expr.items:
            out.extend(conjuncts(i))
        return out
    return [expr]


def walk(expr: ast.Expr):
    """Every node of an expression, depth first (parents before children, left to right).

    A stack, not nested generators: analysis walks each expression several times, and a
    generator per node was most of planning's cost at 1,000 queries."""
    stack = [expr]
    pop, extend = stack.pop, stack.extend
    while stack:
        node = pop()
        yield node
        kids = children(node)
        if kids:
            extend(reversed(kids))


_LEAVES = frozenset({ast.Column, ast.Literal, ast.Now, ast.Interval})


def children(expr: ast.Expr) -> tuple[ast.Expr, ...]:
    """The direct sub-expressions of a node."""
    if expr.__class__ in _LEAVES:  # most nodes: no pattern to try (planning 1,000 queries)
        return ()
    match expr:
        case ast.BinaryOp(left=a, right=b) | ast.Compare(left=a, right=b):
            return (a, b)
        case ast.Neg(operand=o) | ast.Not(operand=o):
            return (o,)
        case ast.InList(expr=e, values=v):
            return (e, *v)
        case ast.Between(expr=e, low=lo, high=hi):
            return (e, lo, hi)
        case ast.IsNull(expr=e):
            return (e,)
        case ast.And(items=i) | ast.Or(items=i):
            return tuple(i)
        case ast.Aggregate(arg=a):
            return () if a is None else (a,)
        case ast.Func(args=args):
            return tuple(args)
        case ast.Case(whens=whens, otherwise=o):
            kids = tuple(x for pair in whens for x in pair)
            return kids if o is None else (*kids, o)
    return ()


def coerce_literals(expr: ast.Expr, column_type: Callable[[ast.Column], str | None]) -> ast.Expr:
    """Literals compared with a column take the column's type (`station = 773869` on a text
    column), as SQL's implicit casts do. `column_type` gives a column's type, or None to leave
    it alone. Both engines (the Fjord and Spark) apply exactly this."""

    def fix(col: ast.Expr, lit: ast.Expr) -> ast.Expr:
        if not (isinstance(col, ast.Column) and isinstance(lit, ast.Literal)) or lit.value is None:
            return lit
        kind = column_type(col)
        if kind is None:
            return lit
        v = lit.value
        if kind == "str" and not isinstance(v, str):
            if isinstance(v, float) and v.is_integer():
                return ast.Literal(str(int(v)), lit.pos)
            return ast.Literal(str(v), lit.pos)
        if kind in ("int", "float") and isinstance(v, str):
            try:
                return ast.Literal(float(v) if kind == "float" else int(v), lit.pos)
            except ValueError:
                raise QueryPlanError(
                    f"cannot compare {col.name} ({kind}) with text {v!r}",
                    *(lit.pos or (None, None)),
                ) from None
        return lit

    # A condition with nothing to cast is returned as it is (no copy kept per query).
    match expr:
        case ast.Compare(op=op, left=left, right=right):
            if isinstance(left, ast.Column):
                r = fix(left, right)
                return expr if r is right else ast.Compare(op, left, r, expr.pos)
            lt = fix(right, left)
            return expr if lt is left else ast.Compare(op, lt, right, expr.pos)
        case ast.InList(expr=e, values=vals, negated=neg):
            fixed = tuple(fix(e, v) for v in vals)
            if all(a is b for a, b in zip(fixed, vals, strict=True)):
                return expr
            return ast.InList(e, fixed, neg, expr.pos)
        case ast.Between(expr=e, low=lo, high=hi, negated=neg):
            flo, fhi = fix(e, lo), fix(e, hi)
            return expr if flo is lo and fhi is hi else ast.Between(e, flo, fhi, neg, expr.pos)
    return expr
