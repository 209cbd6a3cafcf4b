"""What one sensor must deliver, from the demands of every query over its stream (pure).

The planner gives each query a `fjords.compile.planner.Demand`. A proxy folds those of the queries
that actually need ITS sensor into one `SensorDemand`: a query whose conditions on static
attributes (segment IN (...), station = ...) exclude this sensor does not count. What the
sensor may leave out is what no interested query can see: readings outside the union of the
queries' value ranges, or the individual readings of a window that every query only
aggregates.

Everything here errs on the safe side: when a condition is not understood the query needs
every reading, so a pushed-down program never changes a query's answer.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, reduce
from typing import overload

from fjords.demand import Demand
from fjords.runtime.predicate_index import Atom

__all__ = [
    "PUSHABLE_AGGREGATES",
    "Fold",
    "QueryIds",
    "QueryNeeds",
    "Range",
    "SensorDemand",
    "SensorView",
    "analyse",
    "concerns",
    "finish",
    "fold",
    "merge",
    "sensor_demand",
    "union_ranges",
]

#: (lo, hi), both inclusive; None is an open end.
Range = tuple[float | None, float | None]
PUSHABLE_AGGREGATES = frozenset({"COUNT", "SUM", "AVG", "MIN", "MAX"})
_RANGE_OPS = ("<", "<=", ">", ">=", "=", "in")


@dataclass(frozen=True)
class SensorView:
    """What demand analysis needs to know about one sensor.

    `static` maps every column that is fixed for this sensor (its id column and static
    attributes) to its value as it appears in tuples; `value_field` is the reading's column;
    `kind` is "scalar" (a reading per sample) or "pair" (a loop-detector pair: vehicles).
    """

    static: Mapping[str, object]
    value_field: str
    kind: str = "scalar"
    time_field: str = "time"


@dataclass(frozen=True)
class QueryNeeds:
    """One query's demand, analysed once and reused for every sensor of the stream."""

    query_id: str
    demand: Demand
    static_atoms: tuple[tuple[str, str, object], ...]  # conditions on columns other than value
    value_ranges: tuple[Range, ...] | None  # None: every value; () : no value at all
    aggregate_window_ms: tuple[int, int] | None  # (range, slide) if pushable as partials
    counts_only: bool  # only COUNT(*), no condition on readings: pair `count` suffices


class QueryIds(Sequence[str]):
    """Query ids as a shared part and a sensor's own, in that order: the sensors of a stream
    share the tuple of its stream-wide queries instead of each copying it, and two lists that
    share it compare in the time of their own parts."""

    __slots__ = ("own", "shared")

    def __init__(self, shared: Sequence[str] = (), own: tuple[str, ...] = ()) -> None:
        self.shared = shared
        self.own = own

    def __len__(self) -> int:
        return len(self.shared) + len(self.own)

    def __iter__(self) -> Iterator[str]:
        return itertools.chain(self.shared, self.own)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[str, ...]: ...
    def __getitem__(self, i: int | slice) -> str | tuple[str, ...]:
        return tuple(self)[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, QueryIds):
            if other.shared is self.shared:
                return self.own == other.own
        elif not isinstance(other, tuple):
            return NotImplemented
        return len(other) == len(self) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))


@dataclass(frozen=True)
class SensorDemand:
    """What the sensor must deliver so that every interested query gets its exact answer."""

    queries: Sequence[str] = ()  # a tuple, or `QueryIds`
    sample_period_s: float | None = None  # shortest asked for; None: no query asked
    fields: tuple[str, ...] = ()
    ranges: tuple[Range, ...] | None = None  # union of value ranges; None: every value
    window_s: float | None = None  # aggregate pushdown window W; None: not pushable
    needs: str | None = None  # pairs: "counts" | "vehicles"; scalars: None
    lifetime_s: float | None = None  # tightest LIFETIME
    # SAMPLE EVERY n ROWS of every query: the sensor may sample this many times slower
    # (the gcd of their n); None: some query needs each reading at the sensor's own rate.
    sample_every_rows: int | None = None
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def idle(self) -> bool:
        return not self.queries

    def asks_same(self, other: SensorDemand) -> bool:
        """Whether the sensor must deliver the same for both (whichever queries ask)."""
        return self.idle == other.idle and (
            self.sample_period_s,
            self.fields,
            self.ranges,
            self.window_s,
            self.needs,
            self.lifetime_s,
            self.sample_every_rows,
        ) == (
            other.sample_period_s,
            other.fields,
            other.ranges,
            other.window_s,
            other.needs,
            other.lifetime_s,
            other.sample_every_rows,
        )


def analyse(query_id: str, demand: Demand, view: SensorView) -> QueryNeeds:
    """The parts of a query's demand that do not depend on which sensor it is."""
    value = view.value_field
    static_atoms = tuple(a for a in demand.atoms if a[0] != value)
    value_atoms = [a for a in demand.atoms if a[0] == value]
    ranges: tuple[Range, ...] | None
    if not demand.filtered_only_by_atoms or demand.sample_every_rows:
        # A residual condition may need any reading; SAMPLE EVERY n ROWS counts every reading
        # before its filter (the router's count would miss those a mote filtered out).
        ranges = None
    elif not value_atoms:
        ranges = None
    else:
        ranges = _ranges_of(value_atoms)
    dynamic = {value, view.time_field} - set(view.static)
    conditions_on_readings = bool(value_atoms) or not demand.filtered_only_by_atoms
    window = demand.window
    aggregate_ms: tuple[int, int] | None = None
    counts_only = False
    plain_aggregate = (
        not demand.sample_every_rows  # the router counts each reading: no partials
        and window is not None
        and bool(demand.aggregates)
        and not conditions_on_readings
        and all(g in view.static for g in demand.group_by)
        and all(f in view.static or f == value for f in demand.fields)
        and not any(a[0] in dynamic for a in demand.atoms)
    )
    if plain_aggregate:
        assert window is not None
        rng_ms, slide_ms = round(window[0] * 1000), round(window[1] * 1000)
        exact_ms = math.isclose(rng_ms, window[0] * 1000, abs_tol=1e-6) and math.isclose(
            slide_ms, window[1] * 1000, abs_tol=1e-6
        )
        if exact_ms and rng_ms > 0 and slide_ms > 0:
            if all(
                f in PUSHABLE_AGGREGATES and (arg is None or arg == value)
                for f, arg in demand.aggregates
            ):
                aggregate_ms = (rng_ms, slide_ms)
            counts_only = all(f == "COUNT" and arg is None for f, arg in demand.aggregates)
    return QueryNeeds(
        query_id, demand, static_atoms, ranges, aggregate_ms, counts_only and bool(aggregate_ms)
    )


def _ranges_of(atoms: list[tuple[str, str, object]]) -> tuple[Range, ...] | None:
    """The value set a conjunction of atoms on one field allows, as inclusive intervals."""
    current: list[tuple[float, float]] = [(-math.inf, math.inf)]
    for _, op, c in atoms:
        if op not in _RANGE_OPS:
            return None
        if op == "in":
            if not isinstance(c, Iterable):
                return None
            try:
                pts = sorted({float(x) for x in c})
            except (TypeError, ValueError):
                return None
            allowed = [(p, p) for p in pts]
        else:
            if isinstance(c, bool) or not isinstance(c, int | float):
                return None
            x = float(c)
            # Strict bounds become inclusive ones: a superset, and the query re-checks them.
            allowed = [
                {
                    "<": (-math.inf, x),
                    "<=": (-math.inf, x),
                    ">": (x, math.inf),
                    ">=": (x, math.inf),
                    "=": (x, x),
                }[op]
            ]
        current = [
            (max(a, c0), min(b, c1))
            for a, b in current
            for c0, c1 in allowed
            if max(a, c0) <= min(b, c1)
        ]
        if not current:
            return ()
    return tuple(_open(lo, hi) for lo, hi in current)


def _open(lo: float, hi: float) -> Range:
    return (None if lo == -math.inf else lo, None if hi == math.inf else hi)


def union_ranges(ranges: Iterable[Range]) -> tuple[Range, ...] | None:
    """Merge overlapping inclusive intervals; None when they cover every value."""
    items = sorted(
        (-math.inf if lo is None else lo, math.inf if hi is None else hi) for lo, hi in ranges
    )
    merged: list[list[float]] = []
    for lo, hi in items:
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    if len(merged) == 1 and merged[0] == [-math.inf, math.inf]:
        return None
    return tuple(_open(lo, hi) for lo, hi in merged)


def _excludes(needs: QueryNeeds, static: Mapping[str, object]) -> bool:
    """True when one of the query's conditions on a static column is false for this sensor."""
    for name, op, c in needs.static_atoms:
        if name not in static:
            continue
        if not Atom(0, op, c).test(static[name]):
            return True
    return False


def _gcd_ms(values: Iterable[int]) -> int:
    return reduce(math.gcd, values, 0)


def sensor_demand(
    queries: Iterable[QueryNeeds],
    view: SensorView,
    *,
    default_period_s: float | None = None,
) -> SensorDemand:
    """Fold the analysed queries of the sensor's stream into what this sensor must deliver."""
    seq: dict[str, int] = {}  # a query's branches share its place
    items = [
        (seq.setdefault(q.query_id, len(seq)), i, q)
        for i, q in enumerate(queries)
        if concerns(q, view.static)
    ]
    items.sort(key=lambda item: item[:2])
    return finish(fold(items), view.kind, default_period_s=default_period_s)


def concerns(needs: QueryNeeds, static: Mapping[str, object]) -> bool:
    """Whether the query can see readings of a sensor with these static attributes."""
    return needs.value_ranges != () and not _excludes(needs, static)


@dataclass(frozen=True)
class Fold:
    """Some queries' needs folded, in a form two folds merge (`merge`) and `finish` turns into
    a `SensorDemand`: a stream's queries that concern every sensor are folded once, and each
    sensor merges in only its own (`proxies.demand_index`)."""

    queries: Sequence[str] = ()  # in the order folded, each once: a tuple or `QueryIds`
    fields: tuple[tuple[tuple[int, int, int], str], ...] = ()  # (first asked, field), sorted
    period_s: float | None = None  # shortest asked for
    lifetime_s: float | None = None  # tightest
    every_value: bool = False  # some query may need any reading
    ranges: tuple[Range, ...] = ()  # union of the others' value ranges (merged, sorted)
    pushable: bool = True  # every query aggregates windows that can run on the sensor
    window_ms: int = 0  # gcd of those windows' range and slide
    counts_only: bool = True
    every_rows: int = 0  # gcd of the queries' SAMPLE EVERY n ROWS (1 for a query without)

    @cached_property
    def ids(self) -> frozenset[str]:
        return frozenset(self.queries)


def fold(items: Iterable[tuple[int, int, QueryNeeds]]) -> Fold:
    """Fold (seq, branch, needs) items, in ascending (seq, branch) order: the seq orders the
    fields by who asked first (a query's branches share it)."""
    queries: dict[str, None] = {}
    fields: dict[str, tuple[int, int, int]] = {}
    periods: list[float] = []
    lifetimes: list[float] = []
    every_value = False
    ranges: list[Range] = []
    pushable = counts_only = True
    windows: list[int] = []
    every_rows = 0
    for seq, branch, q in items:
        queries[q.query_id] = None
        d = q.demand
        every_rows = math.gcd(every_rows, d.sample_every_rows or 1)
        for j, f in enumerate(d.fields):
            fields.setdefault(f, (seq, branch, j))
        if d.sample_period_s:
            periods.append(d.sample_period_s)
        if d.lifetime_s:
            lifetimes.append(d.lifetime_s)
        if q.value_ranges is None:
            every_value = True
        else:
            ranges.extend(q.value_ranges)
        if q.aggregate_window_ms is None:
            pushable = False
        else:
            windows.extend(q.aggregate_window_ms)
        counts_only = counts_only and q.counts_only
    merged = union_ranges(ranges)
    return Fold(
        queries=tuple(queries),
        fields=tuple(sorted((k, f) for f, k in fields.items())),
        period_s=min(periods) if periods else None,
        lifetime_s=min(lifetimes) if lifetimes else None,
        every_value=every_value or merged is None,
        ranges=merged or (),
        pushable=pushable,
        window_ms=_gcd_ms(windows) if pushable else 0,
        counts_only=counts_only,
        every_rows=every_rows,
    )


def merge(a: Fold, b: Fold, *, share: bool = False) -> Fold:
    """The fold of both folds' queries, `a`'s first. `b` should be the small one (a sensor's
    own queries, a new query): the cost is `b`'s size, plus a copy of `a`'s query ids unless
    `share` (then the result's ids are a `QueryIds` holding `a`'s)."""
    if not b.queries:
        return a
    if not a.queries:
        return b
    firsts = {f: k for k, f in a.fields}
    for k, f in b.fields:
        if f not in firsts or k < firsts[f]:
            firsts[f] = k
    every_value = a.every_value or b.every_value
    ranges: tuple[Range, ...] = ()
    if not every_value:
        merged = union_ranges(a.ranges + b.ranges) if b.ranges else a.ranges
        every_value, ranges = merged is None, merged or ()
    pushable = a.pushable and b.pushable
    seen = a.ids
    new = b.queries  # a query in both (branches of a union): once
    if not seen.isdisjoint(new):
        new = tuple(q for q in new if q not in seen)
    return Fold(
        queries=QueryIds(a.queries, tuple(new)) if share else (*a.queries, *new),
        fields=tuple(sorted((k, f) for f, k in firsts.items())),
        period_s=_least(a.period_s, b.period_s),
        lifetime_s=_least(a.lifetime_s, b.lifetime_s),
        every_value=every_value,
        ranges=ranges,
        pushable=pushable,
        window_ms=math.gcd(a.window_ms, b.window_ms) if pushable else 0,
        counts_only=a.counts_only and b.counts_only,
        every_rows=math.gcd(a.every_rows, b.every_rows),
    )


def _least(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def finish(f: Fold, kind: str, *, default_period_s: float | None = None) -> SensorDemand:
    """What a sensor of `kind` must deliver for the folded queries."""
    if not f.queries:
        return SensorDemand()
    notes: list[str] = []
    window_s: float | None = None
    if f.pushable:
        if f.window_ms > 0:
            window_s = f.window_ms / 1000.0
    else:
        notes.append("no aggregate pushdown: some query needs individual readings")
    needs = None
    if kind == "pair":
        if window_s is not None and f.counts_only:
            needs = "counts"
        else:
            needs = "vehicles"
            window_s = None
    return SensorDemand(
        queries=f.queries,
        sample_period_s=f.period_s if f.period_s is not None else default_period_s,
        fields=tuple(name for _, name in f.fields),
        ranges=None if f.every_value else f.ranges,
        window_s=window_s,
        needs=needs,
        lifetime_s=f.lifetime_s,
        sample_every_rows=f.every_rows if f.every_rows > 1 else None,
        notes=tuple(notes),
    )
