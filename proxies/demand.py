"""What one sensor must deliver, from the demands of every query over its stream (pure).

The planner gives each query a `fjords.planner.Demand`. A proxy folds those of the queries
that actually need ITS sensor into one `SensorDemand`: a query whose conditions on static
attributes (segment IN (...), station = ...) exclude this sensor does not count. What the
sensor may leave out is what no interested query can see: readings outside the union of the
queries' value ranges, or the individual readings of a window that every query only
aggregates.

Everything here errs on the safe side: when a condition is not understood the query needs
every reading, so a pushed-down program never changes a query's answer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import reduce

from fjords.planner import Demand
from fjords.predicate_index import Atom

__all__ = [
    "PUSHABLE_AGGREGATES",
    "QueryNeeds",
    "Range",
    "SensorDemand",
    "SensorView",
    "analyse",
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


@dataclass(frozen=True)
class SensorDemand:
    """What the sensor must deliver so that every interested query gets its exact answer."""

    queries: tuple[str, ...] = ()
    sample_period_s: float | None = None  # shortest asked for; None: no query asked
    fields: tuple[str, ...] = ()
    ranges: tuple[Range, ...] | None = None  # union of value ranges; None: every value
    window_s: float | None = None  # aggregate pushdown window W; None: not pushable
    needs: str | None = None  # pairs: "counts" | "vehicles"; scalars: None
    lifetime_s: float | None = None  # tightest LIFETIME
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def idle(self) -> bool:
        return not self.queries


def analyse(query_id: str, demand: Demand, view: SensorView) -> QueryNeeds:
    """The parts of a query's demand that do not depend on which sensor it is."""
    value = view.value_field
    static_atoms = tuple(a for a in demand.atoms if a[0] != value)
    value_atoms = [a for a in demand.atoms if a[0] == value]
    ranges: tuple[Range, ...] | None
    if not demand.filtered_only_by_atoms:
        ranges = None  # a residual condition may need any reading
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
        window is not None
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
            try:
                pts = sorted({float(x) for x in c})  # type: ignore[union-attr]
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
    interested = [q for q in queries if not _excludes(q, view.static) and q.value_ranges != ()]
    if not interested:
        return SensorDemand()
    periods = [q.demand.sample_period_s for q in interested if q.demand.sample_period_s]
    lifetimes = [q.demand.lifetime_s for q in interested if q.demand.lifetime_s]
    fields: list[str] = []
    for q in interested:
        for f in q.demand.fields:
            if f not in fields:
                fields.append(f)
    notes: list[str] = []
    ranges: tuple[Range, ...] | None
    if any(q.value_ranges is None for q in interested):
        ranges = None
    else:
        ranges = union_ranges(r for q in interested for r in q.value_ranges or ())
    window_s: float | None = None
    if all(q.aggregate_window_ms is not None for q in interested):
        w = _gcd_ms(v for q in interested for v in q.aggregate_window_ms or ())
        if w > 0:
            window_s = w / 1000.0
    else:
        notes.append("no aggregate pushdown: some query needs individual readings")
    needs = None
    if view.kind == "pair":
        if window_s is not None and all(q.counts_only for q in interested):
            needs = "counts"
        else:
            needs = "vehicles"
            window_s = None
    return SensorDemand(
        queries=tuple(dict.fromkeys(q.query_id for q in interested)),  # a union: once
        sample_period_s=min(periods) if periods else default_period_s,
        fields=tuple(fields),
        ranges=ranges,
        window_s=window_s,
        needs=needs,
        lifetime_s=min(lifetimes) if lifetimes else None,
        notes=tuple(notes),
    )
