"""Evaluate the filters of many queries at once (the grouped filter of CACQ/PSoup).

Each query registers the simple predicates of its WHERE clause (`field op constant`). One of them,
the anchor, is indexed; the query's other conditions become a residual checked only when the anchor
matches. Equality and IN anchors go into a hash map per field; range anchors (all range predicates
of the query on one field, combined into one interval) go into an interval index per field. A tuple
then costs one lookup per indexed field, about log(n) for the intervals, plus its matches, instead
of n predicate calls.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

Target = Callable[[tuple], None]
Residual = Callable[[tuple], bool] | None

RANGE_OPS = ("<", "<=", ">", ">=")
INDEXABLE_OPS = ("=", "in", *RANGE_OPS)


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


class IntervalIndex:
    """Intervals on one field, stabbed by a value in O(log n + matches).

    The sorted distinct endpoints cut the line into elementary segments: the open gap before
    each endpoint, the endpoint itself, and the gap after the last one. Every value inside one
    segment matches the same intervals, so each segment keeps its match list. A stab is one
    bisect and one list lookup. Adding an interval splits at most two segments and appends to
    the segments it covers; removing it does the reverse, so queries come and go while tuples
    flow without any rebuild.
    """

    __slots__ = ("_items", "_points", "_refs", "_segs")

    def __init__(self) -> None:
        self._items: dict[Hashable, tuple[object, bool, object, bool, tuple]] = {}
        self._points: list = []
        self._refs: dict[object, int] = {}
        self._segs: list[list[tuple]] = [[]]  # segment 2i: gap before point i; 2i+1: point i

    def __len__(self) -> int:
        return len(self._items)

    def _code(self, v: object) -> int:
        pts = self._points
        i = bisect_left(pts, v)
        return 2 * i + 1 if i < len(pts) and pts[i] == v else 2 * i

    def _add_point(self, p: object) -> None:
        n = self._refs.get(p, 0)
        self._refs[p] = n + 1
        if n:
            return
        i = bisect_left(self._points, p)
        self._points.insert(i, p)
        gap = self._segs[2 * i]
        self._segs[2 * i : 2 * i + 1] = [gap, list(gap), list(gap)]

    def _drop_point(self, p: object) -> None:
        n = self._refs[p] - 1
        if n:
            self._refs[p] = n
            return
        del self._refs[p]
        i = bisect_left(self._points, p)
        del self._points[i]
        # No interval ends here any more: gap, point and next gap hold the same entries.
        del self._segs[2 * i + 1 : 2 * i + 3]

    def _span(self, lo: object, lo_incl: bool, hi: object, hi_incl: bool) -> range:
        first = 0 if lo is None else (self._code(lo) if lo_incl else self._code(lo) + 1)
        last = (
            len(self._segs) - 1
            if hi is None
            else (self._code(hi) if hi_incl else self._code(hi) - 1)
        )
        return range(first, last + 1)

    def add(
        self, key: Hashable, lo: object, lo_incl: bool, hi: object, hi_incl: bool, entry: tuple
    ) -> None:
        if key in self._items:
            raise KeyError(f"{key!r} is already in the interval index")
        self._items[key] = (lo, lo_incl, hi, hi_incl, entry)
        for p in (lo, hi):
            if p is not None:
                self._add_point(p)
        for c in self._span(lo, lo_incl, hi, hi_incl):
            self._segs[c].append(entry)

    def remove(self, key: Hashable) -> None:
        item = self._items.pop(key, None)
        if item is None:
            return
        lo, lo_incl, hi, hi_incl, entry = item
        for c in self._span(lo, lo_incl, hi, hi_incl):
            self._segs[c].remove(entry)
        for p in (lo, hi):
            if p is not None:
                self._drop_point(p)

    def stab(self, v: object) -> list[tuple]:
        pts = self._points
        try:
            i = bisect_left(pts, v)
        except TypeError:
            return []
        if i < len(pts) and pts[i] == v:
            return self._segs[2 * i + 1]
        return self._segs[2 * i]


class PredicateIndex:
    """All queries' filters over one stream; `route(t)` delivers `t` to every query it satisfies."""

    def __init__(self) -> None:
        self._eq: dict[int, dict[object, list[tuple]]] = {}
        self._iv: dict[int, IntervalIndex] = {}
        self._always: list[tuple] = []
        self._where: dict[Hashable, tuple[str, int, tuple, tuple]] = {}
        self._eq_items: list[tuple[int, dict]] = []
        self._iv_items: list[tuple[int, IntervalIndex]] = []
        # Residual checks that raised, by key (the first exception each): the caller takes them
        # (`take_failures`) and fails those queries; the others are still routed.
        self.failures: dict[Hashable, Exception] = {}

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._where

    def add(self, key: Hashable, atoms: Iterable[Atom], residual: Residual, target: Target) -> str:
        """Register a query's filter. Returns how it was indexed ('eq', 'interval' or 'scan')."""
        if key in self._where:
            raise KeyError(f"{key!r} is already registered")
        atoms = list(atoms)
        anchor, rest = _choose_anchor(atoms)
        check = _residual(rest, residual)
        entry = (check, target, key)
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
        """Deliver `t` to every matching query's target; return the number of deliveries."""
        n = 0
        # try costs nothing until something raises (CPython 3.11): one query's residual that
        # raises is recorded and skipped; the tuple still reaches every other query.
        for check, target, key in self._always:
            try:
                if check is None or check(t):
                    target(t)
                    n += 1
            except Exception as e:  # noqa: BLE001 - recorded, the query fails
                self.failures.setdefault(key, e)
        for field, m in self._eq_items:
            lst = m.get(t[field])
            if lst:
                for check, target, key in lst:
                    try:
                        if check is None or check(t):
                            target(t)
                            n += 1
                    except Exception as e:  # noqa: BLE001
                        self.failures.setdefault(key, e)
        for field, iv in self._iv_items:
            v = t[field]
            if v is not None:
                for check, target, key in iv.stab(v):
                    try:
                        if check is None or check(t):
                            target(t)
                            n += 1
                    except Exception as e:  # noqa: BLE001
                        self.failures.setdefault(key, e)
        return n

    def take_failures(self) -> dict[Hashable, Exception]:
        """The keys whose checks raised since the last call, with the first exception each."""
        out, self.failures = self.failures, {}
        return out

    def matches(self, t: tuple) -> list[Hashable]:
        """The keys `t` would be delivered to (for tests and EXPLAIN; route() is the hot path)."""
        out: list[Hashable] = []
        for check, _, key in self._always:
            if check is None or check(t):
                out.append(key)
        for field, m in self._eq_items:
            for check, _, key in m.get(t[field], ()):
                if check is None or check(t):
                    out.append(key)
        for field, iv in self._iv_items:
            v = t[field]
            if v is not None:
                for check, _, key in iv.stab(v):
                    if check is None or check(t):
                        out.append(key)
        return out


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
