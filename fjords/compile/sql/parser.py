"""`parse`: query text to its syntax tree, or a QuerySyntaxError with line, column and what
may come there.
"""

from __future__ import annotations

from lark import Token, Tree
from lark.exceptions import (
    UnexpectedInput,
    VisitError,
)

from fjords.compile.sql import ast
from fjords.compile.sql.grammar import LARK
from fjords.compile.sql.messages import check_encodable, check_unsupported, syntax_error
from fjords.compile.sql.shapes import ShapeCache
from fjords.compile.sql.transform import TRANSFORMER, TransformError
from fjords.errors import QuerySyntaxError

# Deeper expressions are refused: the transformer and everything downstream that walks the
# tree (hashing, planning, evaluation) recurse, and a hostile query must not exhaust the stack.
MAX_DEPTH = 100


def parse(text: str) -> ast.Statement:
    """Parse one query (or a UNION ALL of queries, an `ast.Union`); raises QuerySyntaxError (line, column, expected) on any bad input."""
    if not isinstance(text, str):
        raise QuerySyntaxError("a query must be text", 1, 1)
    if not text.strip():
        raise QuerySyntaxError("empty query", 1, 1, ("SELECT",))
    check_encodable(text)
    check_unsupported(text)
    return _SHAPES.parse(text)


def parse_checked(text: str) -> ast.Statement:
    """The Lark parse and the transform of a text that passed parse()'s checks."""
    try:
        tree = LARK.parse(text)
    except UnexpectedInput as e:
        raise syntax_error(e, text) from None
    _check_depth(tree)
    try:
        return TRANSFORMER.transform(tree)
    except VisitError as e:
        inner = e.orig_exc
        if isinstance(inner, TransformError):
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


_SHAPES = ShapeCache(parse_checked)
