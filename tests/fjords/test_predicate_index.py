"""The predicate index gives exactly the matches of evaluating every predicate, one by one."""

from __future__ import annotations

import random

import pytest

from fjords.runtime.predicate_index import Atom, PredicateIndex

OPS = ["=", "<", "<=", ">", ">=", "in"]


def _random_atoms(rng: random.Random) -> list[Atom]:
    atoms = []
    for _ in range(rng.randint(0, 3)):
        field = rng.randint(0, 2)
        op = rng.choice(OPS)
        if field == 2:  # a text field: equality and IN only
            op = rng.choice(["=", "in"])
            value = (
                frozenset(rng.sample("abcde", rng.randint(1, 3)))
                if op == "in"
                else rng.choice("abcde")
            )
        elif op == "in":
            value = frozenset(rng.randint(0, 20) for _ in range(rng.randint(1, 4)))
        else:
            value = rng.choice([rng.randint(0, 20), rng.randint(0, 40) / 2])
        atoms.append(Atom(field, op, value))
    return atoms


@pytest.mark.parametrize("seed", range(8))
def test_index_equals_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    index = PredicateIndex()
    queries: dict[int, tuple[list[Atom], object]] = {}
    delivered: list[int] = []
    for q in range(300):
        atoms = _random_atoms(rng)
        residual = None
        if rng.random() < 0.2:
            residual = (lambda m: lambda t: t[0] % m == 0)(rng.randint(1, 3))
        queries[q] = (atoms, residual)
        index.add(q, atoms, residual, lambda t, q=q: delivered.append(q))
    # Remove some while we go, as queries come and go in a running Fjord.
    for q in rng.sample(sorted(queries), 60):
        index.remove(q)
        del queries[q]
    for _ in range(400):
        t = (
            rng.randint(-2, 22),
            rng.choice([rng.randint(0, 20), rng.randint(0, 40) / 2, None]),
            rng.choice("abcdef"),
        )
        expected = sorted(
            q
            for q, (atoms, res) in queries.items()
            if all(a.test(t[a.field]) for a in atoms) and (res is None or res(t))
        )
        delivered.clear()
        n = index.route(t)
        assert sorted(delivered) == expected, t
        assert sorted(index.matches(t)) == expected
        assert n == len(expected)


def test_each_query_gets_a_tuple_once_even_with_in_lists() -> None:
    index = PredicateIndex()
    got = []
    index.add("q", [Atom(0, "in", frozenset({"S05", "S14"}))], None, got.append)
    index.route(("S05",))
    index.route(("S14",))
    index.route(("S99",))
    assert got == [("S05",), ("S14",)]


def test_anchor_kinds() -> None:
    index = PredicateIndex()
    assert index.add(1, [Atom(0, "<", 30), Atom(1, "=", "773869")], None, print) == "eq"
    assert index.add(2, [Atom(0, ">", 10), Atom(0, "<=", 20)], None, print) == "interval"
    assert index.add(3, [], lambda t: True, print) == "scan"
    with pytest.raises(KeyError):
        index.add(1, [], None, print)


def test_interval_bounds_are_exact() -> None:
    index = PredicateIndex()
    index.add("open", [Atom(0, ">", 10), Atom(0, "<", 20)], None, lambda t: None)
    index.add("closed", [Atom(0, ">=", 10), Atom(0, "<=", 20)], None, lambda t: None)
    assert index.matches((10,)) == ["closed"]
    assert sorted(index.matches((15,))) == ["closed", "open"]
    assert index.matches((20,)) == ["closed"]
    assert index.matches((20.0001,)) == []
    assert index.matches((None,)) == []


def test_many_queries_matching_none_touch_no_query() -> None:
    index = PredicateIndex()
    calls = []
    for i in range(10_000):
        index.add(
            i, [Atom(0, ">=", i), Atom(0, "<", i + 0.5)], lambda t: calls.append(1) or True, print
        )
    index.route((-5,))
    index.route((100.75,))
    assert calls == []  # no residual was even evaluated: the index pruned everything


def test_values_between_the_same_endpoints_share_one_result_and_the_value_cache_is_untracked() -> (
    None
):
    """A stab's result is kept per code (values between the same two endpoints), not per value:
    readings take thousands of distinct values, and a result list per value would be most of
    what a running gateway's full garbage collections visit. Value -> code is a dict of numbers to
    ints, which the collector does not track."""
    import gc

    index = PredicateIndex()
    for lo in range(0, 60, 5):
        index.add(f"q{lo}", [Atom(0, ">=", lo), Atom(0, "<", lo + 10)], None, lambda t: None)
    (iv,) = index._iv.values()
    results = [iv.stab(12.0 + i / 1000) for i in range(500)]  # all between 10 and 15
    assert all(r is results[0] for r in results)
    assert sorted(e[2] for e in results[0]) == ["q10", "q5"]
    assert iv.stab(10) is not results[0] and sorted(e[2] for e in iv.stab(10)) == ["q10", "q5"]
    assert sorted(index.matches((14.999,))) == ["q10", "q5"]
    assert len(iv._cache) == 502 and not gc.is_tracked(iv._cache)
    assert len(iv._at_code) == 2
    index.add("q_new", [Atom(0, ">=", 12.5), Atom(0, "<", 13)], None, lambda t: None)
    assert sorted(index.matches((12.7,))) == ["q10", "q5", "q_new"]  # a change starts over
    assert sorted(index.matches((12.1,))) == ["q10", "q5"]
