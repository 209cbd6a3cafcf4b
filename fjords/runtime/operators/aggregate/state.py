"""The state algebra of an aggregate: one group's state, its updates, merges and values.

A state is a list: `[rows, then per value slot: count, sum, min, max]`. Every path that adds
readings (`adds`, `dense`), merges panes or partial rows (`window`, `merge`) and finishes a
group (`finish`, `finisher`) goes through these few functions, so they agree exactly.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from fjords.partial import Partial
from fjords.runtime.queues import Queue

Fn = Callable[[tuple], object]


Finalize = Callable[[tuple], "tuple | None"]  # a group row to its result row, or None (HAVING)
BatchFinalize = Callable[[list[tuple]], list[tuple]]  # the same over a window's rows at once


FUNCS = ("COUNT", "SUM", "AVG", "MIN", "MAX")


@dataclass(frozen=True, slots=True)
class AggSpec:
    """One output aggregate: `func` over argument slot `slot` (None for COUNT(*))."""

    func: str
    slot: int | None
    label: str | None = field(default=None, compare=False)  # `AVG(speed)`, for describe()


def new_state(n_slots: int) -> list:
    # [rows, then per slot: count, sum, min, max]
    return [0] + [0, 0, None, None] * n_slots


def merge_state(into: list, other: Sequence) -> None:
    """Add `other` into `into`. A min/max of None is unknown (an aggregate that no one asks
    for MIN/MAX may not keep them: `WindowAggregate._add_columns`) and merges as nothing."""
    into[0] += other[0]
    for b in range(1, len(into), 4):
        n = other[b]
        if not n:
            continue
        into[b] += n
        into[b + 1] += other[b + 1]
        mn, mx = other[b + 2], other[b + 3]
        if mn is not None and (into[b + 2] is None or mn < into[b + 2]):
            into[b + 2] = mn
        if mx is not None and (into[b + 3] is None or mx > into[b + 3]):
            into[b + 3] = mx


def finish(state: Sequence, specs: Sequence[AggSpec]) -> tuple:
    """The aggregate values of a (merged) state, in `specs` order; empty inputs give NULL (COUNT 0)."""
    out = []
    for s in specs:
        if s.slot is None:
            out.append(state[0])
            continue
        b = 1 + 4 * s.slot
        n = state[b]
        if s.func == "COUNT":
            out.append(n)
        elif not n:
            out.append(None)
        elif s.func == "SUM":
            out.append(state[b + 1])
        elif s.func == "AVG":
            out.append(state[b + 1] / n)
        elif s.func == "MIN":
            out.append(state[b + 2])
        else:
            out.append(state[b + 3])
    return tuple(out)


def value_fn(s: AggSpec) -> Callable[[Sequence], object]:
    """One aggregate's value of a state, exactly as `finish` computes it."""
    return value_of(s.func, s.slot)


@lru_cache(maxsize=1024)  # one per (func, slot), shared by every query (closures are ~200 B)
def value_of(func: str, slot: int | None) -> Callable[[Sequence], object]:
    if slot is None:
        return operator.itemgetter(0)
    b = 1 + 4 * slot
    if func == "COUNT":
        return operator.itemgetter(b)
    if func == "AVG":
        return lambda st: st[b + 1] / st[b] if st[b] else None
    j = b + 1 if func == "SUM" else b + 2 if func == "MIN" else b + 3
    return lambda st: st[j] if st[b] else None


def finisher(specs: Sequence[AggSpec]) -> Callable[[Sequence], tuple]:
    """`finish` for fixed `specs`, compiled once (a window's rows are built without looping
    over the specs per group)."""
    if any(s.func not in FUNCS for s in specs):
        return lambda st: finish(st, specs)
    return _finisher_of(tuple((s.func, s.slot) for s in specs))


@lru_cache(maxsize=1024)  # one per aggregate list, shared by every query that has it
def _finisher_of(shape: tuple[tuple[str, int | None], ...]) -> Callable[[Sequence], tuple]:
    fns = tuple(value_of(func, slot) for func, slot in shape)
    if len(fns) == 1:
        f = fns[0]
        return lambda st: (f(st),)
    return lambda st: tuple([f(st) for f in fns])


def finished_rows(
    groups: dict[tuple, list],
    specs: Sequence[AggSpec],
    finalize: Finalize | None,
    ws: float,
    we: float,
) -> list[tuple]:
    """One finished row per group (`key + aggregates + (ws, we)`, through `finalize`)."""
    out = []
    for key, st in groups.items():
        row = (*key, *finish(st, specs), ws, we)
        if finalize is not None:
            done = finalize(row)
            if done is None:
                continue
            row = done
        out.append(row)
    return out


def put_finished(
    out: Queue,
    groups: dict[tuple, list],
    specs: Sequence[AggSpec],
    finalize: Finalize | None,
    ws: float,
    we: float,
) -> int:
    """Put one finished row per group (`key + aggregates + (ws, we)`, through `finalize`)."""
    n = 0
    for key, st in groups.items():
        row = (*key, *finish(st, specs), ws, we)
        if finalize is not None:
            done = finalize(row)
            if done is None:
                continue
            row = done
        out.put(row)
        n += 1
    return n


def add_partial(st: list, b: int, p: Partial) -> None:
    """Merge a mote's pre-aggregated window into slot base `b` (rows are counted by the caller)."""
    if p.sum is None:  # counts only: no values to aggregate
        return
    st[b] += p.count
    st[b + 1] += p.sum
    if st[b + 2] is None or p.min < st[b + 2]:
        st[b + 2] = p.min
    if st[b + 3] is None or p.max > st[b + 3]:
        st[b + 3] = p.max


def updater(arg_fns: Sequence[Fn]) -> Callable[[list, tuple], None]:
    """A specialised per-tuple update (one argument, the common case, gets a tight closure).

    A `Partial` value (fjords.partial) stands for `count` rows: it is merged, not added.
    """
    if not arg_fns:

        def update0(st: list, t: tuple) -> None:
            # COUNT(*) alone reads no field, so look for a partial anywhere in the tuple.
            for v in t:
                if v.__class__ is Partial:
                    st[0] += v.count
                    return
            st[0] += 1

        return update0
    if len(arg_fns) == 1:
        f = arg_fns[0]

        def update1(st: list, t: tuple) -> None:
            v = f(t)
            if v is None:
                st[0] += 1
                return
            if v.__class__ is Partial:
                st[0] += v.count
                add_partial(st, 1, v)
                return
            st[0] += 1
            st[1] += 1
            try:
                st[2] += v
            except (
                TypeError
            ):  # text: COUNT, MIN and MAX still apply (SUM/AVG are refused at plan time)
                pass
            if st[3] is None or v < st[3]:
                st[3] = v
            if st[4] is None or v > st[4]:
                st[4] = v

        return update1
    fns = tuple(enumerate(arg_fns))

    def update(st: list, t: tuple) -> None:
        rows = 1
        for j, f in fns:
            v = f(t)
            if v is not None:
                b = 1 + 4 * j
                if v.__class__ is Partial:
                    rows = v.count
                    add_partial(st, b, v)
                    continue
                st[b] += 1
                try:
                    st[b + 1] += v
                except TypeError:  # text (see update1)
                    pass
                if st[b + 2] is None or v < st[b + 2]:
                    st[b + 2] = v
                if st[b + 3] is None or v > st[b + 3]:
                    st[b + 3] = v
        st[0] += rows

    return update


# How a coarser group's value merges its finer groups' finished values (`merge_finished`):
# COUNT and SUM add, MIN and MAX keep the least and greatest; AVG is recomputed from the SUM and
# COUNT beside it. Other aggregates (COUNT(DISTINCT)) do not merge: the planner refuses them.
MERGEABLE = ("COUNT", "SUM", "MIN", "MAX", "AVG")


def merge_finished(acc: list, values: Sequence, kinds: Sequence[str]) -> None:
    """Merge a finer group's finished aggregate `values` into `acc` (NULL merges as nothing)."""
    for j, kind in enumerate(kinds):
        v = values[j]
        if v is None:
            continue
        a = acc[j]
        if a is None:
            acc[j] = v
        elif kind == "MIN":
            if v < a:
                acc[j] = v
        elif kind == "MAX":
            if v > a:
                acc[j] = v
        elif kind != "AVG":  # COUNT, SUM
            acc[j] = a + v
