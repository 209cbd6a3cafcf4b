"""Range conditions over one field, all queries' at once: sorted endpoints and stabbing queries,
per value or (with numpy) per batch of values.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Hashable
from typing import Literal

import numpy as np

# Batches at least this long are routed by numpy where the values allow (`stab_batch`); a
# shorter one costs less value by value.
BATCH_MIN = 32


EXACT = 2.0**53  # integers below this in magnitude are exact as float64


class IntervalIndex:
    """Intervals on one field, stabbed by a value in O(log n + K + matches), in O(n) memory.

    The sorted distinct endpoints cut the line into elementary segments (codes): the open gap
    before each endpoint (2i), the endpoint itself (2i+1), and the gap after the last one. An
    interval covers a contiguous run of codes, so it is stored as two events: it starts at its
    first code and ends after its last. Every `K`-th code keeps a checkpoint, the intervals
    covering it; a stab starts from the checkpoint at or before its code and applies at most
    `K - 1` codes' events. Memory grows with the number of intervals (plus checkpoints of
    the overlap every K codes), not with how much they overlap: storing each interval in every
    segment it covers grew as n times the overlap.

    Adding or removing an interval whose endpoints are already known updates its events and
    the few checkpoints it covers in place; a new or vanished endpoint shifts the codes, so the
    events are rebuilt once, lazily, at the next stab (many installs cost one rebuild).
    """

    __slots__ = (
        "_items",
        "_points",
        "_refs",
        "_starts",
        "_ends",
        "_snaps",
        "_dirty",
        "_k",
        "_cache",
        "_at_code",
        "_arrays",
    )

    K = 32  # least number of codes between checkpoints
    CACHE = 4096  # values whose code is kept until the intervals change

    def __init__(self) -> None:
        self._items: dict[Hashable, tuple[object, bool, object, bool, tuple]] = {}
        self._points: list = []
        self._refs: dict[object, int] = {}
        self._starts: dict[int, list[tuple]] = {}  # code -> entries covering from it on
        self._ends: dict[int, list[tuple]] = {}  # code -> entries no longer covering it
        self._snaps: list[list[tuple]] = [[]]  # checkpoint j: entries covering code j*k
        self._dirty = False
        self._k = self.K
        # Readings repeat their values: a value's code is kept until the index changes (at
        # most CACHE values; then it starts over), and the result per code (values between
        # the same endpoints share it). Value -> code is a dict of numbers or strings to ints,
        # which the garbage collector does not track: a result list per value was most of
        # what a running gateway's full passes visited.
        self._cache: dict[object, int] = {}
        self._at_code: dict[int, list[tuple]] = {}
        # The batch path's arrays (`_numeric`), built at the first batch after a change; False
        # while some endpoint is not a number float64 holds exactly.
        self._arrays: tuple | Literal[False] | None = None

    def __len__(self) -> int:
        return len(self._items)

    def _code(self, v: object) -> int:
        pts = self._points
        i = bisect_left(pts, v)
        return 2 * i + 1 if i < len(pts) and pts[i] == v else 2 * i

    def _add_point(self, p: object) -> bool:
        """Count one more use of endpoint `p`; True when it is new (the codes shift)."""
        n = self._refs.get(p, 0)
        if not n:
            i = bisect_left(self._points, p)  # raises TypeError for an incomparable value
            self._points.insert(i, p)
        self._refs[p] = n + 1
        return not n

    def _drop_point(self, p: object) -> bool:
        n = self._refs[p] - 1
        if n:
            self._refs[p] = n
            return False
        del self._refs[p]
        del self._points[bisect_left(self._points, p)]
        return True

    def _span(self, lo: object, lo_incl: bool, hi: object, hi_incl: bool) -> tuple[int, int]:
        """The first and last code the interval covers (first > last: it covers nothing)."""
        first = 0 if lo is None else (self._code(lo) if lo_incl else self._code(lo) + 1)
        last = (
            2 * len(self._points)
            if hi is None
            else (self._code(hi) if hi_incl else self._code(hi) - 1)
        )
        return first, last

    def add(
        self, key: Hashable, lo: object, lo_incl: bool, hi: object, hi_incl: bool, entry: tuple
    ) -> None:
        if key in self._items:
            raise KeyError(f"{key!r} is already in the interval index")
        added = []
        try:
            for p in (lo, hi):
                if p is not None and self._add_point(p):
                    added.append(p)
        except TypeError:
            for p in added:
                self._drop_point(p)
            raise
        self._items[key] = (lo, lo_incl, hi, hi_incl, entry)
        self._cache, self._at_code = {}, {}
        self._arrays = None
        if added or self._dirty:
            self._dirty = True
            return
        self._place(lo, lo_incl, hi, hi_incl, entry, add=True)

    def remove(self, key: Hashable) -> None:
        item = self._items.pop(key, None)
        if item is None:
            return
        lo, lo_incl, hi, hi_incl, entry = item
        self._cache, self._at_code = {}, {}
        self._arrays = None
        if not self._dirty:
            self._place(lo, lo_incl, hi, hi_incl, entry, add=False)
        for p in (lo, hi):
            if p is not None and self._drop_point(p):
                self._dirty = True

    def _place(
        self, lo: object, lo_incl: bool, hi: object, hi_incl: bool, entry: tuple, *, add: bool
    ) -> None:
        """Add or remove one interval's events and checkpoint entries (codes unchanged)."""
        first, last = self._span(lo, lo_incl, hi, hi_incl)
        if first > last:
            return
        k = self._k
        for events, code in ((self._starts, first), (self._ends, last + 1)):
            if add:
                events.setdefault(code, []).append(entry)
            else:
                lst = events[code]
                lst.remove(entry)
                if not lst:
                    del events[code]
        for j in range(-(-first // k), last // k + 1):
            if add:
                self._snaps[j].append(entry)
            else:
                self._snaps[j].remove(entry)

    def _rebuild(self) -> None:
        starts: dict[int, list[tuple]] = {}
        ends: dict[int, list[tuple]] = {}
        for lo, lo_incl, hi, hi_incl, entry in self._items.values():
            first, last = self._span(lo, lo_incl, hi, hi_incl)
            if first <= last:
                starts.setdefault(first, []).append(entry)
                ends.setdefault(last + 1, []).append(entry)
        codes = 2 * len(self._points) + 1
        # Checkpoints together at most about as large as the intervals are many: k is the
        # mean span (codes covered summed over codes, divided by the intervals).
        covered = active_n = 0
        for c in range(codes):
            active_n += len(starts.get(c, ())) - len(ends.get(c, ()))
            covered += active_n
        k = max(IntervalIndex.K, -(-covered // max(len(self._items), 1)))
        snaps: list[list[tuple]] = []
        active: dict[Hashable, tuple] = {}
        for c in range(codes):
            for e in ends.get(c, ()):
                del active[e[2]]
            for e in starts.get(c, ()):
                active[e[2]] = e
            if c % k == 0:
                snaps.append(list(active.values()))
        self._starts, self._ends, self._snaps, self._k = starts, ends, snaps, k
        self._dirty = False

    def build(self) -> None:
        """Rebuild now what the next stab (and the next large batch) would (e.g. before the
        caller sets it aside as long-lived), not at the first reading after a change."""
        if self._dirty:
            self._rebuild()
        self._numeric()

    def stab(self, v: object) -> list[tuple]:
        """The entries of every interval holding `v` (entries are `(check, target, key, ...)`)."""
        try:
            c = self._cache.get(v)
        except TypeError:  # unhashable: not cached
            return self._stab(v)
        if c is None:
            c = self._code_of(v)
            if c is None:
                return []
            if len(self._cache) >= self.CACHE:
                self._cache = {}
            self._cache[v] = c
        got = self._at_code.get(c)
        if got is None:
            got = self._at_code[c] = self._entries_at(c)
        return got

    def _stab(self, v: object) -> list[tuple]:
        c = self._code_of(v)
        return [] if c is None else self._entries_at(c)

    def _code_of(self, v: object) -> int | None:
        """`v`'s code, the index rebuilt first if a change left it dirty; None for a value no
        interval can hold (NaN: no comparison holds; a value not comparable with the ends)."""
        if self._dirty:
            self._rebuild()
        if v.__class__ is float and v != v:
            return None
        try:
            return self._code(v)
        except TypeError:
            return None

    def _entries_at(self, c: int) -> list[tuple]:
        """The entries of every interval covering code `c`."""
        j, r = divmod(c, self._k)
        snap = self._snaps[j]
        if not r:
            return list(snap)
        starts, ends = self._starts, self._ends
        active = {e[2]: e for e in snap}
        for cc in range(c - r + 1, c + 1):
            for e in ends.get(cc, ()):
                del active[e[2]]
            for e in starts.get(cc, ()):
                active[e[2]] = e
        return list(active.values())

    def stab_batch(self, values: list) -> tuple[list[tuple], list[int], list[int]] | None:
        """Every interval holding some of `values`, at once: `(entries, bounds, positions)`,
        where the k-th entry's values are at `positions[bounds[k]:bounds[k + 1]]`, ascending.
        None when the values are not all numbers held exactly as float64 (text, None, bool,
        integers of 2**53 or more, NaN among integers) or an endpoint is not: then the caller
        stabs value by value.

        Sorted, the values of an interval are one slice: from the first value of its first
        code (`_code`: the elementary segment) to the first of the code after its last, both
        found by `searchsorted` of the endpoints in the sorted values. The slices of the
        intervals hit are laid end to end and each sorted back into arrival order."""
        arrays = self._numeric()
        if arrays is None:
            return None
        points, firsts, ends, entries = arrays
        kinds = set(map(type, values))
        if not kinds <= {int, float}:
            return None
        try:
            a = np.array(values, dtype=np.float64)
        except OverflowError:
            return None
        if int in kinds and not (np.abs(a) < EXACT).all():  # (NaN fails this too)
            return None
        # The values sorted (NaN last); starts[c]: how many have a code below c, i.e. for
        # code 2i (the gap before endpoint i) those below it, for 2i+1 (the endpoint) those
        # below it too, for 2i+2 those up to it; NaN holds no code (after 2n, the last).
        order = np.argsort(a)
        ordered = a[order]
        n = len(points)
        starts = np.empty(2 * n + 3, dtype=np.intp)
        starts[0] = 0
        starts[1 : 2 * n + 1 : 2] = np.searchsorted(ordered, points, "left")
        starts[2 : 2 * n + 2 : 2] = np.searchsorted(ordered, points, "right")
        starts[2 * n + 1] = len(a) - np.count_nonzero(np.isnan(a))
        starts[2 * n + 2] = len(a)
        lo, hi = starts[firsts], starts[ends]
        hit = np.flatnonzero(hi > lo)
        if not len(hit):
            return [], [0], []
        lo = lo[hit]
        lens = hi[hit] - lo
        bounds = np.zeros(len(hit) + 1, dtype=np.intp)
        np.cumsum(lens, out=bounds[1:])
        # Element j of the k-th slice is order[lo[k] + j]; the slice's key k * n + position
        # sorts the slices apart and each into arrival order, at once.
        at = order[np.arange(bounds[-1]) + np.repeat(lo - bounds[:-1], lens)]
        base = np.repeat(np.arange(len(hit), dtype=np.int64) * len(values), lens)
        key = base + at
        key.sort()
        key -= base
        return [entries[i] for i in hit.tolist()], bounds.tolist(), key.tolist()

    def _numeric(self) -> tuple | None:
        """(endpoints as float64, each interval's first code, the code after its last, the
        entries), or None when some endpoint is not a number float64 holds exactly."""
        arrays = self._arrays
        if arrays is None:
            if self._dirty:
                self._rebuild()
            built = self._build_arrays()
            arrays = self._arrays = built if built is not None else False
        return arrays if arrays is not False else None

    def _build_arrays(self) -> tuple | None:
        pts = self._points
        for p in pts:
            cls = p.__class__
            if not (cls is float or (cls is int and -EXACT < p < EXACT)) or p != p:
                return None
        firsts, ends, entries = [], [], []
        for lo, lo_incl, hi, hi_incl, entry in self._items.values():
            first, last = self._span(lo, lo_incl, hi, hi_incl)
            if first <= last:
                firsts.append(first)
                ends.append(last + 1)
                entries.append(entry)
        return (
            np.array(pts, dtype=np.float64),
            np.array(firsts, dtype=np.intp),
            np.array(ends, dtype=np.intp),
            entries,
        )
