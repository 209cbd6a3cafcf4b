"""Many queries over one stream: installing and removing them keeps every shared
stage's priority exact; the batch paths give the same rows as the per-row paths."""

from __future__ import annotations

import io
import json
import random
import string
from operator import itemgetter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fjords.output as output
from fjords.compile.sql import ast
from fjords.engine import Engine
from fjords.output import NdjsonWriter, json_objects, ndjson_printer
from fjords.runtime.fjord import Fjord
from fjords.runtime.predicate_index import Atom, PredicateIndex, Projection
from fjords.schema import Schema
from gateway.results import encode_row

SCHEMA = Schema(
    [("time", "int"), ("station", "str"), ("speed", "float"), ("segment", "str")], time="time"
)
AGG = "SELECT segment, AVG(speed) AS v FROM traffic [RANGE 1 MINUTE] GROUP BY segment"


def _engine(*, fuse: bool = True) -> Engine:
    f = Engine(Fjord(), fuse=fuse)
    f.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    return f


@pytest.mark.parametrize("fuse", [True, False])
def test_shared_stage_tickets_stay_the_max_of_their_users(fuse: bool) -> None:
    """The incremental tickets (counted per stream and per shared aggregate) equal the
    maximum recomputed from scratch after every install and removal."""
    rng = random.Random(5)
    f = _engine(fuse=fuse)
    live: list[str] = []
    for step in range(200):
        if live and rng.random() < 0.35:
            qid = live.pop(rng.randrange(len(live)))
            f.fjord.remove_query(qid)
        else:
            qid = f"q{step}"
            prio = rng.choice([1, 50, 100, 300, 1000])
            sql = (
                AGG if rng.random() < 0.5 else "SELECT station, speed FROM traffic WHERE speed > 3"
            )
            f.add_query(f"{sql} PRIORITY {prio}", query_id=qid)
            live.append(qid)
        router = f.fjord.streams["traffic"].router
        want = max((f.fjord.queries[q].tickets for q in live), default=ast.DEFAULT_PRIORITY)
        assert router.tickets == want
        for shared in f.fjord._shared.values():
            top = max(f.fjord.queries[u].tickets for u in shared.users)
            assert shared.aggregate.tickets == top
            assert router._priority[shared.router_key] == top


# -- NDJSON: the column-at-a-time encoder writes json.dumps' text --------------------------------

_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
)


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    ncols=st.integers(min_value=1, max_value=4),
    typed=st.booleans(),
    long=st.sampled_from([0, 3, 64]),
)
def test_ndjson_batch_is_json_dumps_line_by_line(
    data: st.DataObject, ncols: int, typed: bool, long: int
) -> None:
    """Columns of one type (the fast path) and of mixed types give json.dumps' lines; batches
    taken apart by zip and by index (`_LONG`) alike."""
    kinds = [
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.text(max_size=6),
        st.text(alphabet=string.printable, max_size=6),  # written as it is, mostly
        st.booleans(),
    ]
    cols = [data.draw(st.sampled_from(kinds)) if typed else _VALUES for _ in range(ncols)]
    rows = data.draw(st.lists(st.tuples(*cols), min_size=1, max_size=20))
    names = tuple(f"c{i}%s" for i in range(ncols))
    output._LONG = long
    try:
        out = io.StringIO()
        ndjson_printer(7, names, out)(rows)
        expect = "".join(
            json.dumps({"query": 7, **dict(zip(names, r, strict=True))}) + "\n" for r in rows
        )
        assert out.getvalue() == expect
        # and the result streams' encoding: the dict's text, exactly (the hub's encode_row)
        objects = json_objects((*names[:-1], "query"))(rows)
        dicts = [dict(zip((*names[:-1], "query"), r, strict=True)) for r in rows]
        assert objects is None or objects == [encode_row(d) for d in dicts]
        if all(type(v) in (int, float, str, bool) for r in rows for v in r):
            assert objects is not None
    finally:
        output._LONG = 64


def test_ndjson_kept_texts_never_confuse_equal_keys() -> None:
    """The texts kept by value (floats) and the strings written as they are: 0.0 and -0.0 are
    equal keys but different texts, NaN is never equal to itself, "%" and quotes in a value."""
    out = io.StringIO()
    emit = ndjson_printer(3, ("x", "s"), out)
    batches = [
        [(0.0, "a%s"), (-0.0, 'q"'), (1.5, "a%s")],
        [(-0.0, "a%s"), (float("nan"), "\\"), (1.5, "é")],
        [(0.0, "plain"), (-1.5, "plain"), (float("-inf"), "a%s")],
    ]
    for rows in batches:
        emit(rows)
    expect = "".join(
        json.dumps({"query": 3, "x": x, "s": s}) + "\n" for rows in batches for x, s in rows
    )
    assert out.getvalue() == expect


def test_ndjson_empty_batch_is_no_text() -> None:
    out = io.StringIO()
    ndjson_printer(0, ("x", "y"), out)([])
    assert out.getvalue() == ""
    assert json_objects(("x", "y"))([]) == []


@pytest.mark.parametrize("n", [2, 100])  # taken apart by zip, and by index
def test_ndjson_rows_of_another_width_are_an_error(n: int) -> None:
    rows = [(1.5, "a")] * n
    for bad in ([*rows, (1.5,)], [*rows, (1.5, "a", 3)]):
        with pytest.raises(ValueError):
            ndjson_printer(0, ("x", "y"), io.StringIO())(bad)


def test_ndjson_value_without_an_encoder_goes_through_json_dumps() -> None:
    out = io.StringIO()
    rows = [(1.5, [1, 2]), (2.5, {"a": 1})]
    ndjson_printer(0, ("x", "y"), out)(rows)
    assert out.getvalue() == "".join(
        json.dumps({"query": 0, "x": r[0], "y": r[1]}) + "\n" for r in rows
    )
    assert json_objects(("x", "y"))(rows) is None  # the hub then uses encode_row
    assert json_objects(("x", "x"))([(1, 2)]) is None  # a dict would keep one of them


@settings(max_examples=300, deadline=None)
@given(data=st.data(), small=st.sampled_from([1, 2, 3, 256]), long=st.sampled_from([0, 4, 64]))
def test_ndjson_writer_writes_what_each_querys_printer_would(
    data: st.DataObject, small: int, long: int
) -> None:
    """`python -m fjords` encodes every query's batches of a chunk together (NdjsonWriter):
    the text is each query's printer's, batch after batch, in delivery order, to the byte;
    whatever the columns (shared, a query's own, one named "query"), the values (a type
    without an encoder: json.dumps), and where the flushes fall."""
    shapes = [("a", "b"), ("a", "b"), ("b", "a"), ("query", "b"), ("a",)]
    nq = data.draw(st.integers(min_value=1, max_value=6))
    columns = [data.draw(st.sampled_from(shapes)) for _ in range(nq)]
    values = st.one_of(_VALUES, st.just([1, 2]))
    expected, got = io.StringIO(), io.StringIO()
    writer = NdjsonWriter(got)
    output.SMALL = small  # batches as large go as they are, between the small ones together
    output._LONG = long  # and batches as long are taken apart by index, not by zip
    try:
        own = [ndjson_printer(i, c, expected) for i, c in enumerate(columns)]
        emits = [writer.printer(i, c) for i, c in enumerate(columns)]
        for _ in range(data.draw(st.integers(min_value=0, max_value=12))):
            i = data.draw(st.integers(min_value=0, max_value=nq - 1))
            rows = data.draw(
                st.lists(st.tuples(*[values] * len(columns[i])), min_size=1, max_size=5)
            )
            own[i](rows)
            emits[i](rows)
            if data.draw(st.booleans()):
                writer.flush()
        writer.flush()
    finally:
        output.SMALL, output._LONG = 256, 64
    assert got.getvalue() == expected.getvalue()


# -- the predicate index: the batch (numpy) path gives the per-row path's rows -------------------

_NUMBERS = st.one_of(
    st.integers(min_value=-30, max_value=30),
    st.sampled_from([0.5, -0.0, 2.25, 7.125, 1e-300, 2.0**53, 2**53 + 1, float("inf")]),
    st.floats(min_value=-30, max_value=30, allow_nan=False).map(lambda v: round(v * 4) / 4),
)
_READINGS = st.one_of(
    _NUMBERS,
    st.just(float("nan")),
    st.just(-float("inf")),
    st.none(),
    st.just(2**80),
    st.just(True),
    st.just("x"),
)


def _atoms_strategy() -> st.SearchStrategy[list[Atom]]:
    rng_atom = st.builds(Atom, st.just(0), st.sampled_from(["<", "<=", ">", ">="]), _NUMBERS)
    other = st.builds(Atom, st.just(1), st.sampled_from(["=", "<"]), st.integers(0, 3))
    return st.lists(st.one_of(rng_atom, rng_atom, other), max_size=3)


@settings(max_examples=300, deadline=None)
@given(
    queries=st.lists(_atoms_strategy(), min_size=1, max_size=12),
    residual_every=st.integers(0, 3),
    values=st.lists(st.tuples(_READINGS, st.integers(0, 3)), min_size=1, max_size=60),
    drop=st.integers(0, 4),
)
def test_batch_routing_equals_per_row(
    queries: list[list[Atom]], residual_every: int, values: list[tuple], drop: int
) -> None:
    """Every query gets the same rows, in arrival order, from one batch (numpy where the values
    allow) as from the rows routed one by one; also with queries removed."""

    rows = [(v, k, n) for n, (v, k) in enumerate(values)]

    def route(per_row: bool) -> dict:
        got: dict = {}
        index = PredicateIndex()
        index.batch_min = 10**9 if per_row else 0
        for i, atoms in enumerate(queries):
            res = (lambda t: t[1] != 2) if residual_every and i % residual_every == 0 else None
            deliver = (lambda k: lambda rs: got.setdefault(k, []).extend(rs))(i)
            index.add(i, atoms, res, lambda t: None, deliver)
        for i in range(min(drop, len(queries) - 1)):
            index.remove(i)
        if per_row:
            for t in rows:
                index.route_batch([t])
        else:
            index.route_batch(rows)
        return got

    batch = route(per_row=False)
    one_by_one = route(per_row=True)
    assert batch == one_by_one
    brute = {}  # and both are what testing every atom gives (NaN and None match nothing)
    for i, atoms in enumerate(queries):
        if i < min(drop, len(queries) - 1):
            continue
        res = residual_every and i % residual_every == 0
        want = [
            t for t in rows if all(a.test(t[a.field]) for a in atoms) and (not res or t[1] != 2)
        ]
        if want:
            brute[i] = want
    assert batch == brute


def _projecting(pick, take):
    """The batch target a query has besides its projection: project, then take."""
    return lambda rs: take([pick(t) for t in rs])


@settings(max_examples=200, deadline=None)
@given(
    queries=st.lists(
        st.tuples(_atoms_strategy(), st.sampled_from([None, (2, 0), (0,), (2, 0)])),
        min_size=1,
        max_size=10,
    ),
    values=st.lists(st.tuples(_READINGS, st.integers(0, 3)), min_size=1, max_size=60),
    per_row=st.booleans(),
    failing=st.integers(-1, 9),
)
def test_shared_projections_give_each_query_its_own_projected_rows(
    queries: list[tuple[list[Atom], tuple[int, ...] | None]],
    values: list[tuple],
    per_row: bool,
    failing: int,
) -> None:
    """Queries that only pick columns get them projected once per batch for all (rows shared
    between queries): each still gets exactly its rows, projected, in arrival order (numpy
    and value-by-value paths); one whose target raises is recorded, the others unharmed."""
    rows = [(v, k, n) for n, (v, k) in enumerate(values)]
    got: dict = {}
    index = PredicateIndex()
    index.batch_min = 10**9 if per_row else 0

    def target(i: int, cols: tuple[int, ...] | None):
        def take(rs: list) -> None:
            if i == failing:
                raise ValueError("boom")
            got.setdefault(i, []).extend(rs)

        return take

    for i, (atoms, cols) in enumerate(queries):
        take = target(i, cols)
        projection = None
        if cols is not None:
            pick = itemgetter(*cols) if len(cols) > 1 else (lambda t, c=cols[0]: (t[c],))
            projection = Projection(cols, pick, take)
            take = _projecting(pick, take)
        index.add(i, atoms, None, lambda t: None, take, projection)
    index.route_batch(rows)
    want = {}
    for i, (atoms, cols) in enumerate(queries):
        mine = [t for t in rows if all(a.test(t[a.field]) for a in atoms)]
        if cols is not None:
            mine = [tuple(t[c] for c in cols) for t in mine]
        if mine and i != failing:
            want[i] = mine
    assert got == want
    hit = 0 <= failing < len(queries) and any(
        all(a.test(t[a.field]) for a in queries[failing][0]) for t in rows
    )
    assert set(index.take_failures()) == ({failing} if hit else set())


def test_batch_routing_takes_the_numpy_path_for_numbers() -> None:
    index = PredicateIndex()
    index.add("a", [Atom(0, ">=", 1.5), Atom(0, "<", 3)], None, lambda t: None)
    iv = index._iv[0]
    assert iv.stab_batch([1.0, 1.5, 2.0, 3.0, float("nan")]) == (
        [iv._items["a"][4]],
        [0, 2],
        [1, 2],
    )
    assert iv.stab_batch([1, 2.5]) is not None  # ints and floats both exact as float64
    assert iv.stab_batch([None, 2.0]) is None  # value by value
    assert iv.stab_batch([2**60]) is None  # not exact as float64
    assert iv.stab_batch(["a"]) is None
