"""Expressions of the syntax tree as SQL-like labels (EXPLAIN, /queries): `AVG(speed)`, not an
aggregate's internal slot number."""

from __future__ import annotations

from fjords.compile.sql import ast
from fjords.sqltext import literal


def expr(e: ast.Expr | None) -> str:
    """An expression of the syntax tree as SQL text (for labels; not a full pretty-printer)."""
    match e:
        case None:
            return "*"
        case ast.Column(table=t, name=n):
            return f"{t}.{n}" if t else n
        case ast.Literal(value=v):
            return literal(v)
        case ast.Now():
            return "NOW"
        case ast.Interval(seconds=s):
            return f"{s:g} SECONDS"
        case ast.BinaryOp(op=op, left=left, right=right):
            return f"({expr(left)} {op} {expr(right)})"
        case ast.Neg(operand=o):
            return f"-{expr(o)}"
        case ast.Compare(op=op, left=left, right=right):
            return f"{expr(left)} {op} {expr(right)}"
        case ast.InList(expr=x, values=vs, negated=neg):
            return f"{expr(x)} {'NOT IN' if neg else 'IN'} ({', '.join(expr(v) for v in vs)})"
        case ast.Between(expr=x, low=lo, high=hi, negated=neg):
            return f"{expr(x)} {'NOT BETWEEN' if neg else 'BETWEEN'} {expr(lo)} AND {expr(hi)}"
        case ast.IsNull(expr=x, negated=neg):
            return f"{expr(x)} IS {'NOT NULL' if neg else 'NULL'}"
        case ast.And(items=items):
            return "(" + " AND ".join(expr(i) for i in items) + ")"
        case ast.Or(items=items):
            return "(" + " OR ".join(expr(i) for i in items) + ")"
        case ast.Not(operand=o):
            return f"NOT {expr(o)}"
        case ast.Aggregate(func=f, arg=a):
            return f"{f}({expr(a)})"
    return str(e)
