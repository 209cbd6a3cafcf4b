"""Queries that differ only in their numeric literals share one parse (`ShapeCache`)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from fjords.compile.sql import ast
from fjords.compile.sql.transform import MAX_INT_DIGITS
from fjords.errors import QuerySyntaxError

FullParse = Callable[[str], ast.Statement]

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


class ShapeCache:
    """Queries that differ only in their numeric literals (a thousand range filters, a
    dashboard's thresholds) share one Lark parse: the cached tree gets the new values at the
    literals' positions. A numeral is rebound only where the first parse of its shape, and a
    second one with every numeral changed, both put a Literal of exactly that numeral's value
    at its position: a folded `-5`, a duration or anything else that reads the value is
    parsed again (its text is part of the key). Bounded: past `max_shapes` shapes it starts
    afresh."""

    def __init__(self, full_parse: FullParse, max_shapes: int = 256, max_trees: int = 64) -> None:
        self.full_parse = full_parse  # a text's Lark parse and transform (`parser.parse_checked`)
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
            tree = self.full_parse(text)  # raises for a bad query: nothing is cached
            if len(self.shapes) >= self.max_shapes:
                self.shapes.clear()
                self.families.clear()
            family = _masked(text, spans, _DIGITS)
            shape = _borrow(self.families.get(family), text, spans, tree)
            if shape is None:
                shape = _learn(text, spans, tree, self.full_parse)
                if shape is not None:
                    self.families[family] = shape.bindable
            self.shapes[key] = shape
            if shape is not None:
                shape.keep(_others(text, spans, shape), text, spans, tree)
            return tree
        if shape is None:  # a shape whose numerals cannot be rebound
            return self.full_parse(text)
        assert isinstance(shape, _Shape)
        others = _others(text, spans, shape)
        kept = shape.trees.get(others)
        if kept is None:
            tree = self.full_parse(text)
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
                    return self.full_parse(text)
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
    """A numeral's value as `ToAst.number` gives it (None: too large)."""
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


def _learn(
    text: str, spans: list[tuple[int, int]], tree: ast.Statement, full_parse: FullParse
) -> _Shape | None:
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
        other = full_parse(changed)
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
