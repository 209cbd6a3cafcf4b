"""Evaluate the filters of many queries at once (the grouped filter of CACQ/PSoup).

Each query registers the simple predicates of its WHERE clause (`field op constant`). One of them,
the anchor, is indexed; the query's other conditions become a residual checked only when the anchor
matches. Equality and IN anchors go into a hash map per field; range anchors (all range predicates
of the query on one field, combined into one interval) go into an interval index per field. A tuple
then costs one lookup per indexed field, about log(n) for the intervals, plus its matches, instead
of n predicate calls.

A batch of rows (the router's) is routed in one step per indexed field. Where a range field's
values in the batch are all numbers the index holds exactly as float64 (`IntervalIndex.
stab_batch`, the usual case), numpy maps every value to its elementary segment at once
(`searchsorted` over the sorted endpoints), sorts the batch by segment, and an interval's rows
are then one contiguous slice: a query costs O(1) numpy work per batch plus its matches, and
readings in no query's range cost nothing in Python. Other values (text, None, mixed kinds,
huge integers) go value by value through the same index; `tests/fjords/test_multi_query.py`
checks that both give the same rows.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from operator import itemgetter
from typing import NamedTuple

from fjords.runtime.interval_index import BATCH_MIN, IntervalIndex

Target = Callable[[tuple], None]


BatchTarget = Callable[[list[tuple]], None]


Residual = Callable[[tuple], bool] | None


RANGE_OPS = ("<", "<=", ">", ">=")


INDEXABLE_OPS = ("=", "in", *RANGE_OPS)


class Projection(NamedTuple):
    """What a filter query does first with its rows, when it only picks columns: queries
    picking the same `columns` share one projection of the batch (`getter` on each row hit,
    once for all of them: a row's projected tuple is then shared, not made per query), and
    `target` takes the projected rows instead of the batch target."""

    columns: Hashable
    getter: Callable[[tuple], tuple]
    target: BatchTarget


@dataclass(frozen=True, slots=True)
class Atom:
    """An indexable predicate on one field: `t[field] op value` (`value` is a frozenset for 'in')."""

    field: int
    op: str
    value: object

    def test(self, v: object) -> bool:
        if v is None:
            return False
        c = self.value
        try:
            match self.op:
                case "=":
                    return v == c
                case "in":
                    return v in c  # type: ignore[operator]
                case "<":
                    return v < c  # type: ignore[operator]
                case "<=":
                    return v <= c  # type: ignore[operator]
                case ">":
                    return v > c  # type: ignore[operator]
                case ">=":
                    return v >= c  # type: ignore[operator]
        except TypeError:
            return False
        raise ValueError(f"not an indexable operator: {self.op!r}")


class PredicateIndex:
    """All queries' filters over one stream; `route_batch(rows)` delivers each query the rows it
    satisfies, as one list per query per batch (`route(t)` for one row).

    An entry is `(check, target, key, batch_target, projection)`: `check` is the residual
    (None: the anchor alone decides), `target` takes one row, `batch_target` a list of rows
    in arrival order, `projection` (or None) a `Projection` that may stand for it.
    """

    def __init__(self) -> None:
        self._eq: dict[int, dict[object, list[tuple]]] = {}
        self._iv: dict[int, IntervalIndex] = {}
        self._always: list[tuple] = []
        self._where: dict[Hashable, tuple[str, int, tuple, tuple]] = {}
        self._eq_items: list[tuple[int, dict]] = []
        self._iv_items: list[tuple[int, IntervalIndex]] = []
        # Checks or targets that raised, by key (the first exception each): the caller takes
        # them (`take_failures`) and fails those queries; the others are still routed.
        self.failures: dict[Hashable, Exception] = {}
        # Batches at least this long take the numpy path for range fields (0: always, for
        # tests; a huge number: never).
        self.batch_min = BATCH_MIN

    def __len__(self) -> int:
        return len(self._where)

    def build(self) -> None:
        """Build the range indexes a change left to be rebuilt lazily."""
        for iv in self._iv.values():
            iv.build()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._where

    def add(
        self,
        key: Hashable,
        atoms: Iterable[Atom],
        residual: Residual,
        target: Target | None,
        batch_target: BatchTarget | None = None,
        projection: Projection | None = None,
    ) -> str:
        """Register a query's filter. Returns how it was indexed ('eq', 'interval' or 'scan').

        `batch_target`, if given, receives each batch's rows for this query as one list (else
        `target` is called per row: one of them is needed). With `projection`, the rows of a range query without a
        residual may go, projected, to `projection.target` instead (the same result)."""
        if key in self._where:
            raise KeyError(f"{key!r} is already registered")
        atoms = list(atoms)
        anchor, rest = _choose_anchor(atoms)
        check = _residual(rest, residual)
        if batch_target is None:
            if target is None:
                raise ValueError("a query's filter needs a target")
            batch_target = _per_row(target)
        entry = (check, target, key, batch_target, projection if check is None else None)
        if anchor is None:
            self._always.append(entry)
            self._where[key] = ("scan", -1, (), entry)
            return "scan"
        if anchor[0] == "eq":
            _, field, values = anchor
            m = self._eq.setdefault(field, {})
            for v in values:
                m.setdefault(v, []).append(entry)
            self._where[key] = ("eq", field, tuple(values), entry)
            kind = "eq"
        else:
            _, field, (lo, lo_incl, hi, hi_incl) = anchor
            self._iv.setdefault(field, IntervalIndex()).add(key, lo, lo_incl, hi, hi_incl, entry)
            self._where[key] = ("interval", field, (), entry)
            kind = "interval"
        self._refresh()
        return kind

    def remove(self, key: Hashable) -> None:
        kind, field, values, entry = self._where.pop(key)
        if kind == "scan":
            self._always.remove(entry)
        elif kind == "eq":
            m = self._eq[field]
            for v in values:
                lst = m[v]
                lst.remove(entry)
                if not lst:
                    del m[v]
            if not m:
                del self._eq[field]
        else:
            iv = self._iv[field]
            iv.remove(key)
            if not len(iv):
                del self._iv[field]
        self._refresh()

    def _refresh(self) -> None:
        self._eq_items = list(self._eq.items())
        self._iv_items = list(self._iv.items())

    def route(self, t: tuple) -> int:
        """Deliver `t` to every matching query; return the number of deliveries."""
        return self.route_batch([t])

    def route_batch(self, rows: list[tuple], defer: list | None = None) -> int:
        """Deliver each query the rows it satisfies, in arrival order, as ONE call of its batch
        target; return the number of rows delivered (summed over queries).

        The index is consulted once per distinct value of each indexed field in the batch;
        per row there is one dict lookup per indexed field and one append per match. A
        query's residual runs over its candidate rows, then its target over the survivors.
        One query's check or target that raises is recorded and skipped (`failures`); the
        rows still reach every other query. With `defer`, the targets are not called: each
        query's `(key, batch_target, rows)` (after its residual) is appended to it instead."""
        if not rows:
            return 0
        pending: dict[Hashable, tuple[tuple, list[tuple]]] = {}

        def appender(entry: tuple) -> Callable[[tuple], None]:
            got = pending.get(entry[2])
            if got is None:
                got = pending[entry[2]] = (entry, [])
            return got[1].append

        for field, m in self._eq_items:
            cache: dict[object, tuple] = {}
            for t in rows:
                v = t[field]
                apps = cache.get(v)
                if apps is None:
                    apps = cache[v] = tuple(appender(e) for e in m.get(v, ()))
                for a in apps:
                    a(t)
        hits: list[tuple[list[tuple], list[int], list[int]]] = []
        for field, iv in self._iv_items:
            if len(rows) >= self.batch_min:
                stabbed = iv.stab_batch(list(map(itemgetter(field), rows)))
                if stabbed is not None:
                    hits.append(stabbed)
                    continue
            hits.append(_stab_each(iv, rows, field))
        n = 0
        failures = self.failures
        # try costs nothing until something raises (CPython 3.11).
        for check, _, key, target, _ in self._always:
            n += _deliver(check, key, target, list(rows), failures, defer)
        for (check, _, key, target, _), theirs in pending.values():
            n += _deliver(check, key, target, theirs, failures, defer)
        # columns -> every row projected (None: some row cannot be; each query then projects
        # its own rows, and fails alone, as it would without sharing)
        projected: dict[Hashable, list[tuple] | None] = {}
        for entries, bounds, positions in hits:
            got: list[tuple] | None = None
            shared: dict[Hashable, list[tuple]] = {}  # columns -> the hit rows, projected
            for k, entry in enumerate(entries):
                p = entry[4]
                pgot = None if p is None else shared.get(p.columns)
                if pgot is None and p is not None:
                    if p.columns not in projected:
                        projected[p.columns] = _project_all(p.getter, rows)
                    whole = projected[p.columns]
                    if whole is not None:
                        pgot = shared[p.columns] = list(map(whole.__getitem__, positions))
                if pgot is None:
                    if got is None:
                        got = list(map(rows.__getitem__, positions))
                    rows_k = got[bounds[k] : bounds[k + 1]]
                    n += _deliver(entry[0], entry[2], entry[3], rows_k, failures, defer)
                    continue
                n += _deliver(
                    None, entry[2], p.target, pgot[bounds[k] : bounds[k + 1]], failures, defer
                )
        return n

    def take_failures(self) -> dict[Hashable, Exception]:
        """The keys whose checks raised since the last call, with the first exception each."""
        out, self.failures = self.failures, {}
        return out

    def matches(self, t: tuple) -> list[Hashable]:
        """The keys `t` would be delivered to (for tests and EXPLAIN; route() is the hot path)."""
        out: list[Hashable] = []
        for check, _, key, *_ in self._always:
            if check is None or check(t):
                out.append(key)
        for field, m in self._eq_items:
            for check, _, key, *_ in m.get(t[field], ()):
                if check is None or check(t):
                    out.append(key)
        for field, iv in self._iv_items:
            v = t[field]
            if v is not None:
                for check, _, key, *_ in iv.stab(v):
                    if check is None or check(t):
                        out.append(key)
        return out


def _project_all(getter: Callable[[tuple], tuple], rows: list[tuple]) -> list[tuple] | None:
    try:
        return list(map(getter, rows))
    except Exception:  # noqa: BLE001 - a malformed row: the queries project their own
        return None


def _stab_each(
    iv: IntervalIndex, rows: list[tuple], field: int
) -> tuple[list[tuple], list[int], list[int]]:
    """`IntervalIndex.stab_batch`'s answer, found value by value (`stab`, once per distinct
    value): the intervals hit, and each one's row positions in arrival order."""
    found: dict[Hashable, tuple[tuple, list[int]]] = {}

    def appender(entry: tuple) -> Callable[[int], None]:
        got = found.get(entry[2])
        if got is None:
            got = found[entry[2]] = (entry, [])
        return got[1].append

    cache: dict[object, tuple] = {}
    for i, t in enumerate(rows):
        v = t[field]
        apps = cache.get(v)
        if apps is None:
            apps = cache[v] = () if v is None else tuple(appender(e) for e in iv.stab(v))
        for a in apps:
            a(i)
    entries, bounds, positions = [], [0], []
    for entry, at in found.values():
        entries.append(entry)
        positions += at
        bounds.append(len(positions))
    return entries, bounds, positions


def _deliver(
    check: Residual,
    key: Hashable,
    target: BatchTarget,
    rows: list[tuple],
    failures: dict[Hashable, Exception],
    defer: list | None,
) -> int:
    """One query's rows of a batch: its residual `check`, then its batch `target` (or, with
    `defer`, kept there for the caller to hand over); the rows delivered."""
    try:
        if check is not None:
            rows = [t for t in rows if check(t)]
            if not rows:
                return 0
        if defer is not None:
            defer.append((key, target, rows))
        else:
            target(rows)
    except Exception as e:  # noqa: BLE001 - recorded, the query fails
        failures.setdefault(key, e)
        return 0
    return len(rows)


def _per_row(target: Target) -> BatchTarget:
    def each(rows: list[tuple]) -> None:
        for t in rows:
            target(t)

    return each


def _choose_anchor(atoms: list[Atom]) -> tuple[tuple | None, list[Atom]]:
    """Equality/IN is the most selective anchor; else all range atoms on one field as an interval."""
    eqs = [a for a in atoms if a.op in ("=", "in")]
    if eqs:
        best = min(eqs, key=lambda a: 1 if a.op == "=" else len(a.value))  # type: ignore[arg-type]
        values = (best.value,) if best.op == "=" else tuple(best.value)  # type: ignore[arg-type]
        if all(isinstance(v, Hashable) for v in values):
            return ("eq", best.field, values), [a for a in atoms if a is not best]
    by_field: dict[int, list[Atom]] = {}
    for a in atoms:
        if a.op in RANGE_OPS:
            by_field.setdefault(a.field, []).append(a)
    if not by_field:
        return None, atoms
    field, group = max(by_field.items(), key=lambda kv: len(kv[1]))
    lo: object = None
    hi: object = None
    lo_incl = hi_incl = False
    try:
        for a in group:
            c = a.value
            if a.op in (">", ">="):
                incl = a.op == ">="
                if lo is None or c > lo or (c == lo and not incl):  # type: ignore[operator]
                    lo, lo_incl = c, incl
            else:
                incl = a.op == "<="
                if hi is None or c < hi or (c == hi and not incl):  # type: ignore[operator]
                    hi, hi_incl = c, incl
    except TypeError:
        return None, atoms
    return ("interval", field, (lo, lo_incl, hi, hi_incl)), [a for a in atoms if a not in group]


def _residual(rest: list[Atom], residual: Residual) -> Residual:
    checks = [_atom_check(a) for a in rest]
    if residual is not None:
        checks.append(residual)
    if not checks:
        return None
    if len(checks) == 1:
        return checks[0]
    return lambda t: all(c(t) for c in checks)


def _atom_check(a: Atom) -> Callable[[tuple], bool]:
    i, test = a.field, a.test
    return lambda t: test(t[i])
