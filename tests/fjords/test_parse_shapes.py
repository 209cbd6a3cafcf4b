"""Queries that differ only in their numbers share one parse (`fjords.compile.sql.shapes.ShapeCache`):
the shared path must give exactly the tree a fresh parse gives, positions included, whatever
the numbers stand for (a literal, a negated literal, a duration, a LIMIT, digits in a string)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fjords.compile.sql.parser import parse, parse_checked
from fjords.compile.sql.shapes import ShapeCache
from fjords.errors import QuerySyntaxError

TEMPLATES = [
    "SELECT * FROM traffic WHERE speed >= {0} AND speed < {1}",
    "SELECT * FROM traffic WHERE speed > -{0} AND speed < {1} - {2}",
    "SELECT segment, AVG(speed) FROM traffic [RANGE {i0} MINUTES] WHERE speed >= {0} "
    "GROUP BY segment HAVING AVG(speed) > {1}",
    "SELECT speed * {0} + {1} AS x FROM traffic WHERE station = '{i0}' LIMIT {i1}",
    "SELECT * FROM traffic WHERE speed IN ({0}, {1}, {0}) OR speed BETWEEN {2} AND {1}",
    "SELECT * FROM traffic\n  -- threshold {i0}\n  WHERE speed < {0} AND speed <> {1}e{i1}",
    "SELECT * FROM traffic WHERE speed >= {0} SAMPLE PERIOD {i0} s",
    "SELECT * FROM traffic WHERE CASE WHEN speed > {0} THEN {1} ELSE -{2} END > {2}",
]


def dump(node: object) -> object:
    """A tree with every position (trees compare without them)."""
    if isinstance(node, tuple):
        return tuple(dump(x) for x in node)
    if hasattr(node, "__dataclass_fields__"):
        names = node.__dataclass_fields__  # type: ignore[attr-defined]
        return (type(node).__name__, tuple((n, dump(getattr(node, n))) for n in names))
    return (type(node).__name__, node)


def fresh(text: str) -> object:
    try:
        return dump(parse_checked(text))
    except QuerySyntaxError as e:
        return ("error", str(e))


def cached(cache: ShapeCache, text: str) -> object:
    try:
        return dump(cache.parse(text))
    except QuerySyntaxError as e:
        return ("error", str(e))


numbers = st.one_of(
    st.integers(0, 10**6).map(str),
    st.sampled_from(["0", "00", "007", "1.5", "12.25", ".5", "3.", "1e3", "2.5E-2", "9e999"]),
    st.floats(0, 1000, allow_nan=False).map(lambda f: f"{f:.3f}"),
)


def same_shape(text: str, digits: list[int]) -> str:
    """`text` with its digits replaced (cycling through `digits`): the same shape."""
    it = iter(digits * (len(text) + 1))
    return "".join(str(next(it)) if ch.isdigit() else ch for ch in text)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(TEMPLATES),
    st.tuples(numbers, numbers, numbers, st.integers(1, 99), st.integers(1, 99)),
    st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=5), min_size=1, max_size=6),
)
def test_texts_of_one_shape_parse_as_a_fresh_parse_does(
    template: str, base: tuple, variants: list[list[int]]
) -> None:
    cache = ShapeCache(parse_checked)
    a, b, c, i0, i1 = base
    first = template.format(a, b, c, i0=i0, i1=i1)
    for text in [first, *(same_shape(first, d) for d in variants)]:
        assert cached(cache, text) == fresh(text), text


long_numbers = st.one_of(
    numbers,
    st.integers(10**17, 10**20).map(str),  # past 18 digits an integer numeral is a float
    st.integers(1, 10**6).map(lambda i: f"{i}.{i}"),
)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(TEMPLATES),
    st.lists(
        st.tuples(long_numbers, long_numbers, long_numbers, st.integers(1, 99), st.integers(1, 99)),
        min_size=1,
        max_size=8,
    ),
)
def test_numbers_of_other_lengths_parse_as_a_fresh_parse_does(
    template: str, bases: list[tuple]
) -> None:
    """Numerals of other lengths make other shapes of one family, which borrow the family's
    learning (which numerals are plain literals): the trees are still a fresh parse's."""
    cache = ShapeCache(parse_checked)
    for a, b, c, i0, i1 in bases:
        text = template.format(a, b, c, i0=i0, i1=i1)
        assert cached(cache, text) == fresh(text), text


def test_a_family_is_learned_once() -> None:
    """1,000 range filters came in 34 lengths of their bounds: each new length is parsed
    once (for its positions), not twice (to learn again what its family has learned)."""
    calls: list[str] = []
    cache = ShapeCache(lambda t: calls.append(t) or parse_checked(t))  # parses counted
    texts = [
        f"SELECT * FROM traffic WHERE speed >= {lo} AND speed < {hi}"
        for lo in ("1.5", "12.25", "7", "61.123456")
        for hi in ("2", "33.5", "100.125")
    ]
    for text in texts:
        assert cached(cache, text) == fresh(text)
    # an integer and a decimal numeral are not of one family: 4 families, each learned once
    # (its first text also parsed with its digits changed)
    assert len(cache.families) == 4
    assert len(calls) == len(texts) + 4


def test_the_shared_path_is_used_and_rebinds_only_literals() -> None:
    calls: list[str] = []
    cache = ShapeCache(lambda t: calls.append(t) or parse_checked(t))  # parses counted
    first = "SELECT * FROM traffic [RANGE 15 MINUTES] WHERE speed >= -12.5 AND speed < 13.75"
    cache.parse(first)
    (shape,) = cache.shapes.values()
    # 15 is a duration, 12.5 is negated: both parsed again when they change; 13.75 is rebound
    assert shape is not None and shape.bindable == (False, False, True)
    calls.clear()
    tree = cache.parse(first.replace("13.75", "42.00"))
    assert calls == []  # no Lark parse
    assert dump(tree) == fresh(first.replace("13.75", "42.00"))
    cache.parse(first.replace("15 MIN", "30 MIN"))
    assert len(calls) == 1  # a duration changed: parsed


def test_a_bad_query_of_a_known_shape_still_fails_with_its_position() -> None:
    parse("SELECT * FROM traffic WHERE speed < 12")
    with pytest.raises(QuerySyntaxError) as e:
        parse("SELECT * FROM traffic WHERE speed < 9" + "9" * 400 + ".0e999")
    assert e.value.line == 1 and e.value.column > 30
    with pytest.raises(QuerySyntaxError):
        parse("SELECT * FROM traffic WHERE speed < 12 12")


def test_the_cache_is_bounded() -> None:
    cache = ShapeCache(parse_checked, max_shapes=4)
    for i in range(10):
        cache.parse(f"SELECT * FROM traffic WHERE speed < 1{' ' * i}")
    assert len(cache.shapes) <= 4


def test_the_tree_classes_can_be_copied_field_by_field() -> None:
    """`_rebind` copies a node field by field, without calling its __init__: right only
    while no syntax tree class has a __post_init__ or a field left out of __init__."""
    import dataclasses

    from fjords.compile.sql import ast

    classes = [c for c in vars(ast).values() if isinstance(c, type) and dataclasses.is_dataclass(c)]
    assert len(classes) > 15
    for cls in classes:
        assert not hasattr(cls, "__post_init__"), cls
        assert all(f.init for f in dataclasses.fields(cls)), cls
