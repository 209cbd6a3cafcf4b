"""WHERE split by where it runs: indexable atoms for the stream router's predicate index,
residual conditions, equi-join keys, and the second stream's own filters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from fjords.compile.analysis.bound import RIGHT, STREAM, TABLE, ColumnRef, StreamJoinSide
from fjords.compile.analysis.scope import Scope
from fjords.compile.sql import ast
from fjords.runtime.predicate_index import Atom


def second_stream(
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
    atoms, residual = split_atoms(own, refs)
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


_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "="}


def split_atoms(exprs: list[ast.Expr], refs: Mapping) -> tuple[list[Atom], list[ast.Expr]]:
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


def split_join_keys(
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
