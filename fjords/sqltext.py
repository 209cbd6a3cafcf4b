"""Values and indexed predicates as SQL writes them (EXPLAIN, /queries): `segment IN ('S05',
'S14')`, not Python's `frozenset({...})`. Shared by the runtime's descriptions and the
compiler's labels (`fjords.compile.sql.text`)."""

from __future__ import annotations

from collections.abc import Iterable

_OPS = {"in": "IN", "not in": "NOT IN", "==": "=", "<>": "!="}


def literal(value: object) -> str:
    """A value as a SQL literal: strings quoted (quotes doubled), NULL, TRUE/FALSE, sets as lists."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, frozenset | set | tuple | list):
        items: Iterable[object] = value
        if isinstance(value, frozenset | set):
            items = sorted(value, key=lambda v: (type(v).__name__, str(v)))
        return "(" + ", ".join(literal(v) for v in items) + ")"
    return str(value)


def atom(field: str, op: str, value: object) -> str:
    """One indexed predicate `(field, op, value)` as SQL: `segment IN ('S05', 'S14')`."""
    return f"{field} {_OPS.get(op.lower(), op)} {literal(value)}"
