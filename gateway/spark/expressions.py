"""The project's SQL expressions as Spark Columns, and the column names the compiled stages use.

An expression compiles bottom-up (`compile_expr`); a *leaf* function resolves what depends on
where the expression runs: a column reference and NOW. Stage A resolves them on the stream's own
columns (`stream_leaf`), a stream-stream join on each side's (`side_leaf`), stage B on the
joined rows, where a stream column is `s__<name>`, a table's `t__<name>` and the window's
start and end are `__ws` and `__we` (`joined_leaf`). NULL logic is SQL's, as in the Fjord's
closures: a comparison with NULL is NULL, and so is a division by zero.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fjords.compile.analysis import STREAM, BoundQuery
from fjords.compile.sql import ast
from fjords.errors import QueryError
from gateway.spark.errors import SparkUnsupportedError

if TYPE_CHECKING:  # pyspark is imported lazily: compiling (and its errors) needs no JVM
    from pyspark.sql import Column

TS = "__ts"  # event time as a Spark timestamp (window() and the watermark need one)
WS, WE = "__ws", "__we"  # window start/end, epoch seconds (double), like the Fjord's rows


def s_name(name: str) -> str:
    """A stream column's name once joined (with a table, or as a join's first stream)."""
    return f"s__{name}"


def t_name(name: str) -> str:
    """A table column's name once joined."""
    return f"t__{name}"


def r_name(name: str) -> str:
    """A column of the second stream of a stream-stream join, once joined."""
    return f"r__{name}"


def duration(seconds: float) -> str:
    return f"{round(seconds * 1e6)} microseconds"


def stream_leaf(node: ast.Expr, b: BoundQuery, now: Column) -> Column | None:
    from pyspark.sql import functions as F

    if isinstance(node, ast.Column):
        r = b.ref(node)
        if r is None or r.side != STREAM:
            raise QueryError(f"column {node.name!r} of a table is not available here")
        return F.col(r.name)
    if isinstance(node, ast.Now):
        return now
    return None


def side_leaf(
    node: ast.Expr, b: BoundQuery, side: str | None, *, plain: bool = False
) -> Column | None:
    """Columns of a stream-stream join: of one side (`side`), before the join under their own
    names (`plain`), or of either side after it (prefixed `s__` / `r__`)."""
    from pyspark.sql import functions as F

    if isinstance(node, ast.Column):
        r = b.ref(node)
        if r is None or (side is not None and r.side != side):
            raise QueryError(f"column {node.name!r} is not available here")
        if plain:
            return F.col(r.name)
        return F.col(s_name(r.name) if r.side == STREAM else r_name(r.name))
    return None


def joined_leaf(node: ast.Expr, b: BoundQuery, now: Column) -> Column | None:
    from pyspark.sql import functions as F

    if isinstance(node, ast.Column):
        slot = b.window_slot(node)
        if slot is not None:
            return F.col(WS if slot == "window_start" else WE)
        r = b.ref(node)
        assert r is not None
        return F.col(s_name(r.name) if r.side == STREAM else t_name(r.name))
    if isinstance(node, ast.Now):
        return now
    return None


def compile_expr(expr: ast.Expr, leaf: Callable[[ast.Expr], Any]) -> Column:
    """An expression as a Spark Column; NULL logic is SQL's, as in the Fjord's closures."""
    from pyspark.sql import functions as F

    hit = leaf(expr)
    if hit is not None:
        return hit
    rec = lambda e: compile_expr(e, leaf)  # noqa: E731
    match expr:
        case ast.Literal(value=v):
            return F.lit(v)
        case ast.Interval(seconds=s):
            return F.lit(s)
        case ast.Neg(operand=o):
            return -rec(o)
        case ast.BinaryOp(op=op, left=a, right=b):
            x, y = rec(a), rec(b)
            if op == "+":
                return x + y
            if op == "-":
                return x - y
            if op == "*":
                return x * y
            # Division by zero is NULL in the Fjord; never an error, whatever spark.sql.ansi says.
            return F.when(y != 0, x.cast("double") / y)
        case ast.Compare(op=op, left=a, right=b):
            x, y = rec(a), rec(b)
            return {
                "=": x == y,
                "!=": x != y,
                "<": x < y,
                "<=": x <= y,
                ">": x > y,
                ">=": x >= y,
            }[op]
        case ast.InList(expr=e, values=vals, negated=neg):
            c = rec(e).isin(*[rec(v) for v in vals])
            return ~c if neg else c
        case ast.Between(expr=e, low=lo, high=hi, negated=neg):
            x = rec(e)
            c = (x >= rec(lo)) & (x <= rec(hi))
            return ~c if neg else c
        case ast.IsNull(expr=e, negated=neg):
            return rec(e).isNotNull() if neg else rec(e).isNull()
        case ast.And(items=items):
            out = rec(items[0])
            for i in items[1:]:
                out = out & rec(i)
            return out
        case ast.Or(items=items):
            out = rec(items[0])
            for i in items[1:]:
                out = out | rec(i)
            return out
        case ast.Not(operand=o):
            return ~rec(o)
        case ast.Func(name=name, args=args):
            cols = [rec(a) for a in args]
            if name == "FLOAT":  # internal: an integer among floats (fjords.compile.analysis)
                return cols[0].cast("double")
            if name == "ABS":
                return F.abs(cols[0])
            if name == "ROUND":
                # HALF_UP, as the Fjord's round_half_up; the digits are a literal (typecheck)
                digits = args[1].value if len(args) > 1 else 0  # type: ignore[union-attr]
                return F.round(cols[0], digits)  # type: ignore[arg-type]
            if name == "COALESCE":
                return F.coalesce(*cols)
            return (F.least if name == "LEAST" else F.greatest)(*cols)
        case ast.Case(whens=whens, otherwise=o):

            def test(cond: ast.Expr) -> Column:
                c = rec(cond)
                if isinstance(cond, ast.Literal) and cond.value is None:
                    c = c.cast("boolean")  # WHEN NULL: never true (Spark wants a typed NULL)
                return c

            (first, then), *rest = whens  # the parser requires one WHEN at least
            chain = F.when(test(first), rec(then))
            for cond, value in rest:
                chain = chain.when(test(cond), rec(value))
            return chain.otherwise(rec(o)) if o is not None else chain
        case ast.Column():
            raise QueryError(f"unknown column {expr.name!r}")
        case ast.Now():
            raise QueryError("NOW is not available here")
        case ast.Aggregate():
            raise QueryError(f"aggregate {expr.func} is not allowed here")
    raise SparkUnsupportedError(f"cannot translate expression {expr!r} to Spark")
