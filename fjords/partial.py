"""Pre-aggregated readings: one value standing for every reading of a mote's window.

A sensor proxy that pushed an `aggregate` program down to its mote receives, per window
[start, end), only the count, sum, min and max of the readings. It pushes ONE tuple with
time = start and a `Partial` in the value field; the windowed-aggregate operator merges it
into its state instead of adding it as one reading, so COUNT, SUM, AVG, MIN and MAX over
partials equal the results over the raw readings.

`Partial` is a float whose value is the window's mean (NaN when it only counts): operators
that know nothing about partials (filters, projections, the predicate index, JSON output)
see a sensible reading instead of crashing, which matters in the moment between a new
query arriving and the mote being reprogrammed. Code that cares checks
`v.__class__ is Partial` (never isinstance, which is slower and would be true for nothing else).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

__all__ = ["Partial"]

_NAN = math.nan


class Partial(float):
    """Immutable (count, sum, min, max) of a window's readings; sum/min/max None: counts only."""

    __slots__ = ("count", "sum", "min", "max")

    count: int
    sum: float | None
    min: float | None
    max: float | None

    def __new__(
        cls,
        count: int,
        sum: float | None = None,
        min: float | None = None,
        max: float | None = None,
    ) -> Partial:
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"a partial's count must be an int >= 0, not {count!r}")
        given = (sum is None, min is None, max is None)
        if any(given) and not all(given):
            raise ValueError("give sum, min and max together, or none of them (counts only)")
        if sum is not None and count == 0:
            raise ValueError("a partial of no readings has no sum, min or max")
        mean = _NAN if sum is None or count == 0 else sum / count
        self = float.__new__(cls, mean)
        object.__setattr__(self, "count", count)
        object.__setattr__(self, "sum", sum)
        object.__setattr__(self, "min", min)
        object.__setattr__(self, "max", max)
        return self

    @classmethod
    def trusted(
        cls, count: int, sum: float | None, min: float | None, max: float | None
    ) -> Partial:
        """A partial whose parts are known to agree (made from aggregates already checked,
        such as a history's cells): no validation, its slots set directly."""
        self = _new_float(cls, _NAN if sum is None else sum / count)
        _set_count(self, count)
        _set_sum(self, sum)
        _set_min(self, min)
        _set_max(self, max)
        return self

    @classmethod
    def of(cls, values: Iterable[float]) -> Partial:
        """The partial of some readings (for tests and gateway-side pre-aggregation)."""
        vs = list(values)
        if not vs:
            return cls(0)
        return cls(len(vs), sum(vs), min(vs), max(vs))

    @property
    def counts_only(self) -> bool:
        return self.sum is None

    def merge(self, other: Partial) -> Partial:
        """Both windows' readings together."""
        if not other.count:
            return self
        if not self.count:
            return other
        if self.sum is None and other.sum is None:
            return Partial(self.count + other.count)
        if self.sum is None or other.sum is None:
            raise ValueError("cannot merge a counts-only partial with one that has values")
        return Partial(
            self.count + other.count,
            self.sum + other.sum,
            self.min if self.min <= other.min else other.min,  # type: ignore[operator]
            self.max if self.max >= other.max else other.max,  # type: ignore[operator]
        )

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Partial is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("Partial is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Partial, (self.count, self.sum, self.min, self.max))

    def __repr__(self) -> str:
        if self.sum is None:
            return f"Partial(count={self.count})"
        return f"Partial(count={self.count}, sum={self.sum!r}, min={self.min!r}, max={self.max!r})"


# The slots' own setters: they bypass the immutable `__setattr__` (for `Partial.trusted`).
_new_float = float.__new__
_set_count = Partial.__dict__["count"].__set__
_set_sum = Partial.__dict__["sum"].__set__
_set_min = Partial.__dict__["min"].__set__
_set_max = Partial.__dict__["max"].__set__
