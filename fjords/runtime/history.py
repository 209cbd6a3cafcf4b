"""A stream's transient segment: the last `keep_s` seconds of event time of every reading it
accepted, kept in memory column by column, with aggregates per time bucket and sensor key.

Seed 004 (prefix aggregate trees) splits a stream into a historical segment (the archive) and a
transient one kept online so that ad hoc aggregates over any grouping and selection are exact
and cost time in proportion to the cells they touch. Here the tree has two levels, time bucket
then *key*: the tuple of a reading's static columns (for `traffic`: station, latitude,
longitude, segment; by default every text or boolean column), interned once. A reading costs
its time (8 bytes), its key (4) and 8 bytes per measured column; a bucket that has gone quiet
is compacted into numpy arrays sorted by key, with each key's count, sum, min and max of every
measure (its cells). An aggregate over a time range takes the cells of the buckets wholly
inside it and scans the readings of the (at most two) buckets cut by its ends.

Missing measured values are kept as NaN and given back as None (a NaN a sensor sent comes back
as None too); integer columns are kept as float64, exact to 2**53.
"""

from __future__ import annotations

import logging
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fjords.partial import Partial
from fjords.schema import Schema

__all__ = [
    "AggregateSource",
    "Historical",
    "HistoricalAggregates",
    "HistoricalSource",
    "History",
    "KeyCells",
]

log = logging.getLogger("fjords.history")

#: A bucket is compacted once the stream's newest reading is this many buckets past its end.
QUIET_BUCKETS = 2
#: A compacted bucket keeps cells when it holds this many readings per key id (up to its
#: largest): then they cost at most a few bytes a reading.
CELL_READINGS = 4


@dataclass(frozen=True, slots=True)
class KeyCells:
    """Per key (index into `History.keys`): rows, and per measure the count of values, their
    sum, min and max (NaN where a key has no value), over some time range."""

    rows: np.ndarray  # int64[n_keys]
    count: np.ndarray  # int64[n_measures, n_keys]
    sum: np.ndarray  # float64[n_measures, n_keys]
    min: np.ndarray
    max: np.ndarray


class _Bucket:
    """One bucket's readings: a compacted part (numpy, sorted by key, with its cells where
    they pay) and a tail of chunks as they came, which appends go to."""

    __slots__ = ("cells", "first", "keys", "last", "measures", "n", "tail", "times")

    #: Chunks a tail holds before they are merged into one (each costs a few array headers).
    MAX_CHUNKS = 64
    #: Readings a tail reaches before it may be compacted.
    MIN_COMPACT = 16_384

    def __init__(self, n_measures: int) -> None:
        self.times = np.empty(0)
        self.keys = np.empty(0, dtype=np.uint32)
        self.measures = np.empty((n_measures, 0))
        #: per key 0..k-1 (dense): rows, and per measure count, sum, min, max
        self.cells: tuple[np.ndarray, ...] | None = None
        self.tail: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.n = 0
        self.first = math.inf  # earliest and latest time held
        self.last = -math.inf

    def append(self, times: np.ndarray, keys: np.ndarray, measures: np.ndarray) -> None:
        self.tail.append((times, keys, measures))
        self.n += len(times)
        self.first = min(self.first, float(times.min()))
        self.last = max(self.last, float(times.max()))
        if len(self.tail) > self.MAX_CHUNKS:
            self.tail = [self._tail()]
        # The tail is kept no larger than the compacted part (past a minimum): what a query
        # reads of a bucket one by one stays a fraction of it, at a sort per doubling.
        tail_rows = self.n - len(self.times)
        if tail_rows >= max(len(self.times), self.MIN_COMPACT):
            self.compact()

    def _tail(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The tail's chunks as one (kept so: the next read takes it as it is)."""
        if len(self.tail) > 1:
            self.tail = [
                (
                    np.concatenate([c[0] for c in self.tail]),
                    np.concatenate([c[1] for c in self.tail]),
                    np.concatenate([c[2] for c in self.tail], axis=1),
                )
            ]
        return self.tail[0]

    def compact(self) -> None:
        """Move the tail into the sorted part and compute the cells (where they pay)."""
        if not self.tail:
            return
        times, keys, measures = self.columns()
        order = np.argsort(keys, kind="stable")  # arrival order kept within a key
        self.times, self.keys, self.measures = times[order], keys[order], measures[:, order]
        self.tail = []
        # Cells (one per key id up to the largest here) pay for themselves where there are
        # several readings per key; else the readings are about as few, and read instead.
        n_keys = int(self.keys[-1]) + 1 if len(self.keys) else 0
        dense = len(self.keys) >= CELL_READINGS * n_keys
        self.cells = _cells(self.keys, self.measures, n_keys) if dense else None

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Times, keys and measures of every reading held."""
        if not self.tail:
            return self.times, self.keys, self.measures
        t, k, m = self._tail()
        if not len(self.times):
            return t, k, m
        return (
            np.concatenate([self.times, t]),
            np.concatenate([self.keys, k]),
            np.concatenate([self.measures, m], axis=1),
        )

    def nbytes(self) -> int:
        tail = sum(c[0].nbytes + c[1].nbytes + c[2].nbytes for c in self.tail)
        cells = 0 if self.cells is None else sum(a.nbytes for a in self.cells)
        return self.times.nbytes + self.keys.nbytes + self.measures.nbytes + tail + cells


def _cells(keys: np.ndarray, measures: np.ndarray, n_keys: int) -> tuple[np.ndarray, ...]:
    """Per key 0..n_keys-1: rows, and per measure count, sum, min (inf where none), max."""
    rows = np.bincount(keys, minlength=n_keys).astype(np.int64)
    nm = measures.shape[0]
    count = np.zeros((nm, n_keys), np.int64)
    total = np.zeros((nm, n_keys))
    lo = np.full((nm, n_keys), np.inf)
    hi = np.full((nm, n_keys), -np.inf)
    for j in range(nm):
        m = measures[j]
        valid = ~np.isnan(m)
        k, v = (keys, m) if valid.all() else (keys[valid], m[valid])
        count[j] = np.bincount(k, minlength=n_keys)
        total[j] = np.bincount(k, weights=v, minlength=n_keys)
        np.minimum.at(lo[j], k, v)
        np.maximum.at(hi[j], k, v)
    return rows, count, total, lo, hi


@dataclass
class Historical:
    """What a historical source has of a range: `count` readings, made into stream tuples (in
    any order) by `tuples()`, once the caller has checked the count against its limits."""

    count: int
    tuples: Callable[[], list[tuple]]
    complete: bool  # every reading asked for was there (none lost, nothing unreadable)
    skipped: tuple[str, ...] = ()  # what could not be read (segment names), if any


class HistoricalSource(Protocol):
    """The readings of a stream older than what its history holds completely."""

    def readings(
        self, stream: str, start: float, end: float, before: float, fields: frozenset[str]
    ) -> Historical | None:
        """The readings of `[start, end)` that `stream`'s history does not hold: those with
        time < `before` (the history's `complete_from`) among the ones it was given, and any
        it was never given (accepted before the history began). `fields`: the columns the
        query reads (the others may be None). None: nothing is known of this stream."""
        ...


@dataclass
class HistoricalAggregates:
    """What an aggregating historical source has of a range: per sensor key, aggregates of one
    measured column, from `groups()` (blocking; it may run in a worker thread), one row per
    key: (*the key's static values, readings, values, sum, min, max), sum/min/max None where
    the key has no value; and `readings`, the stream tuples it gives one by one (few)."""

    groups: Callable[[], list[tuple]]
    readings: list[tuple]
    complete: bool  # every reading asked for was there (none lost, nothing unreadable)
    skipped: tuple[str, ...] = ()  # what could not be read (segment names), if any


class AggregateSource(Protocol):
    """A `HistoricalSource` that aggregates per sensor key where it is (a batch job over the
    archive) instead of handing over every reading; `name` names it in answers and refusals."""

    name: str

    def aggregates(
        self,
        stream: str,
        start: float,
        end: float,
        before: float,
        static: tuple[str, ...],
        measure: str,
    ) -> HistoricalAggregates | None:
        """The readings of `[start, end)` that `stream`'s history does not hold (as
        `HistoricalSource.readings` chooses them), grouped by the `static` columns, with
        `measure` aggregated. None: nothing is known of this stream."""
        ...


class History:
    """The transient segment of one stream; see the module docstring.

    `keep_s`: event time kept behind the newest reading. `max_rows`: past it the oldest buckets
    are evicted early (counted in `evicted_early`, logged the first time). Readings older than
    what is kept are not taken (`too_old`)."""

    def __init__(
        self,
        name: str,
        schema: Schema,
        *,
        keep_s: float = 3600.0,
        max_rows: int = 50_000_000,
        bucket_s: float = 60.0,
        static: Sequence[str] | None = None,
    ) -> None:
        if schema.time is None:
            raise ValueError(f"stream {name!r} has no time field")
        self.name = name
        self.schema = schema
        self.keep_s = keep_s
        self.max_rows = max_rows
        self.bucket_s = bucket_s
        ti = schema.index(schema.time)
        self.time_index = ti
        if static is None:
            static = [f.name for f in schema.fields if f.type in ("str", "bool")]
        self.static_names = tuple(n for n in schema.names if n in set(static) and n != schema.time)
        self.static_index = tuple(schema.index(n) for n in self.static_names)
        self.measure_names = tuple(
            n for n in schema.names if n != schema.time and n not in self.static_names
        )
        self.measure_index = tuple(schema.index(n) for n in self.measure_names)
        for n in self.measure_names:
            if schema.type_of(n) not in ("float", "int"):
                raise ValueError(f"history of {name!r}: column {n!r} must be numeric or static")
        self._ints = tuple(schema.type_of(n) == "int" for n in self.measure_names)
        self._static_of: Callable[[tuple], object] = (
            operator.itemgetter(*self.static_index) if self.static_index else lambda t: ()
        )
        self._one_static = len(self.static_index) == 1
        #: the distinct static tuples seen, in order; a reading stores its index
        self.keys: list[tuple] = []
        self._key_id: dict[object, int] = {}
        self._buckets: dict[int, _Bucket] = {}
        self.rows = 0
        self.newest = -math.inf
        self.too_old = 0
        self.aggregated = 0  # pre-aggregated windows of motes, not kept (no raw readings)
        self.evicted = 0  # rows that aged out of keep_s
        self.evicted_early = 0  # rows evicted before their time (max_rows)
        #: readings at or after it are all held; before it some were evicted or refused
        self.complete_from = -math.inf

    # -- taking readings -----------------------------------------------------------------------
    def add_many(self, rows: Sequence[tuple]) -> None:
        """Keep `rows` (stream tuples, any order), column by column."""
        n = len(rows)
        if not n:
            return
        times = np.array([t[self.time_index] for t in rows], dtype=float)
        keep = None
        newest = max(self.newest, float(times.max()))
        horizon = newest - self.keep_s
        if times.min() < horizon:
            keep = times >= horizon
            self._refused_too_old(times[~keep])
        key_id = self._key_id
        ids = list(map(key_id.get, map(self._static_of, rows)))
        if None in ids:
            for i, k in enumerate(ids):
                if k is None:
                    s = self._static_of(rows[i])
                    ids[i] = key_id.get(s)
                    if ids[i] is None:
                        ids[i] = self._new_key(s)
        keys = np.array(ids, dtype=np.uint32)
        columns = []
        for i in self.measure_index:
            col = [t[i] for t in rows]
            kinds = set(map(type, col))
            if Partial in kinds:
                partial = np.array([v.__class__ is Partial for v in col])
                self._aggregated(times[partial])
                keep = ~partial if keep is None else keep & ~partial
            columns.append(np.array(col, dtype=float))  # None -> NaN
        measures = np.array(columns).reshape(len(columns), n)
        if keep is not None:
            times, keys, measures = times[keep], keys[keep], measures[:, keep]
            if not len(times):
                return
        self.newest = newest
        buckets = np.floor(times / self.bucket_s)
        lo, hi = int(buckets.min()), int(buckets.max())
        if lo == hi:
            self._bucket(lo).append(times, keys, measures)
        else:
            order = np.argsort(buckets, kind="stable")
            times, keys, measures, buckets = (
                times[order], keys[order], measures[:, order], buckets[order]
            )  # fmt: skip
            cuts = np.flatnonzero(buckets[1:] != buckets[:-1]) + 1
            for part in np.split(np.arange(len(times)), cuts):
                at = slice(int(part[0]), int(part[-1]) + 1)
                self._bucket(int(buckets[at.start])).append(times[at], keys[at], measures[:, at])
        self.rows += len(times)
        self._maintain()

    def _bucket(self, b: int) -> _Bucket:
        bucket = self._buckets.get(b)
        if bucket is None:
            bucket = self._buckets[b] = _Bucket(len(self.measure_index))
        return bucket

    def _refused_too_old(self, times: np.ndarray) -> None:
        self.too_old += len(times)
        self.complete_from = max(self.complete_from, math.nextafter(float(times.max()), math.inf))

    def add(self, row: tuple) -> None:
        """Keep one reading (a late one: the router hands those over one by one)."""
        self.add_many((row,))

    def _aggregated(self, times: np.ndarray) -> None:
        """A mote's pre-aggregated window (fjords.partial) is no reading: not kept, counted."""
        if not self.aggregated:
            log.warning(
                "history of %s: a sensor sends pre-aggregated windows (no demand for its raw "
                "readings): they are not kept, and snapshots miss them (counted as aggregated)",
                self.name,
            )
        self.aggregated += len(times)
        self.complete_from = max(self.complete_from, math.nextafter(float(times.max()), math.inf))

    def _new_key(self, s: object) -> int:
        k = len(self.keys)
        key: tuple = (s,) if self._one_static else s  # type: ignore[assignment]
        self.keys.append(key)
        self._key_id[s] = k
        return k

    def _maintain(self) -> None:
        """Evict what aged out (or what max_rows cannot hold), compact quiet buckets."""
        if not self._buckets:
            return
        newest_b = math.floor(self.newest / self.bucket_s)
        oldest_kept = math.floor((self.newest - self.keep_s) / self.bucket_s)
        for b in sorted(self._buckets):
            if b >= oldest_kept and self.rows <= self.max_rows:
                break
            gone = self._buckets.pop(b)
            self.rows -= gone.n
            self.complete_from = max(self.complete_from, (b + 1) * self.bucket_s)
            if b < oldest_kept:
                self.evicted += gone.n
            else:
                if not self.evicted_early:
                    log.warning(
                        "history of %s: more than max_rows=%d readings; evicting the oldest "
                        "before keep_s=%.0f s (counted as evicted_early)",
                        self.name,
                        self.max_rows,
                        self.keep_s,
                    )
                self.evicted_early += gone.n
        quiet = newest_b - QUIET_BUCKETS
        for b, bucket in self._buckets.items():
            if b < quiet and bucket.tail:
                bucket.compact()

    # -- reading it ----------------------------------------------------------------------------
    @property
    def oldest(self) -> float | None:
        """The earliest time held (None when empty)."""
        return min((b.first for b in self._buckets.values()), default=None)

    def nbytes(self) -> int:
        keys = sum(64 + 8 * len(k) for k in self.keys)
        return sum(b.nbytes() for b in self._buckets.values()) + keys

    def stats(self) -> dict[str, float | int | None]:
        return {
            "rows": self.rows,
            "bytes": self.nbytes(),
            "oldest": self.oldest,
            "newest": None if self.newest == -math.inf else self.newest,
            "keys": len(self.keys),
            "too_old": self.too_old,
            "aggregated": self.aggregated,
            "evicted": self.evicted,
            "evicted_early": self.evicted_early,
            "complete_from": None if self.complete_from == -math.inf else self.complete_from,
        }

    def _in_range(self, t0: float, t1: float):
        bs = self.bucket_s
        for b in sorted(self._buckets):
            start, end = b * bs, (b + 1) * bs
            if end <= t0 or start >= t1:
                continue
            yield self._buckets[b], t0 <= start and end <= t1

    def count(self, t0: float, t1: float) -> int:
        """How many readings have `t0 <= time < t1`."""
        n = 0
        for bucket, whole in self._in_range(t0, t1):
            if whole:
                n += bucket.n
            else:
                times = bucket.columns()[0]
                n += int(np.count_nonzero((times >= t0) & (times < t1)))
        return n

    def columns(self, t0: float, t1: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Times, keys and measures of the readings with `t0 <= time < t1`, in time order."""
        parts = []
        for bucket, whole in self._in_range(t0, t1):
            times, keys, measures = bucket.columns()
            if not whole:
                mask = (times >= t0) & (times < t1)
                times, keys, measures = times[mask], keys[mask], measures[:, mask]
            parts.append((times, keys, measures))
        if not parts:
            return np.empty(0), np.empty(0, np.uint32), np.empty((len(self.measure_index), 0))
        times = np.concatenate([p[0] for p in parts])
        order = np.argsort(times, kind="stable")
        keys = np.concatenate([p[1] for p in parts])[order]
        measures = np.concatenate([p[2] for p in parts], axis=1)[:, order]
        return times[order], keys, measures

    def tuples(self, t0: float, t1: float) -> list[tuple]:
        """The readings with `t0 <= time < t1` as stream tuples, in time order."""
        return self.as_tuples(self.columns(t0, t1))

    def as_tuples(self, columns: tuple[np.ndarray, np.ndarray, np.ndarray]) -> list[tuple]:
        """What `columns` returned, as stream tuples."""
        times, keys, measures = columns
        n = len(times)
        cols: list[list] = [[]] * len(self.schema)
        cols[self.time_index] = times.tolist()
        klist = keys.tolist()
        for j, i in enumerate(self.static_index):
            values = [k[j] for k in self.keys]
            cols[i] = [values[k] for k in klist]
        for j, i in enumerate(self.measure_index):
            col = measures[j].tolist()
            if self._ints[j]:
                col = [None if v != v else int(v) for v in col]
            elif np.isnan(measures[j]).any():
                col = [None if v != v else v for v in col]
            cols[i] = col
        return list(zip(*cols, strict=True)) if n else []

    def cells(self, t0: float, t1: float) -> KeyCells:
        """Every key's aggregates over `t0 <= time < t1`: whole buckets from their cells, the
        buckets cut by the range's ends from their readings."""
        nk, nm = len(self.keys), len(self.measure_index)
        rows = np.zeros(nk, np.int64)
        count = np.zeros((nm, nk), np.int64)
        total = np.zeros((nm, nk))
        lo = np.full((nm, nk), np.inf)
        hi = np.full((nm, nk), -np.inf)
        parts: list[tuple[np.ndarray, ...]] = []  # cells of whole buckets
        loose: list[tuple[np.ndarray, np.ndarray]] = []  # readings to make cells of, at once
        for bucket, whole in self._in_range(t0, t1):
            if whole and bucket.cells is not None:
                parts.append(bucket.cells)
                if bucket.tail:
                    loose.append(bucket._tail()[1:])
            else:
                times, keys, measures = bucket.columns()
                if not whole:
                    mask = (times >= t0) & (times < t1)
                    keys, measures = keys[mask], measures[:, mask]
                loose.append((keys, measures))
        if loose:
            keys = np.concatenate([k for k, _ in loose])
            measures = np.concatenate([m for _, m in loose], axis=1)
            parts.append(_cells(keys, measures, nk))
        for r, n, sm, mn, mx in parts:
            k = len(r)
            rows[:k] += r
            count[:, :k] += n
            total[:, :k] += sm
            np.minimum(lo[:, :k], mn, out=lo[:, :k])
            np.maximum(hi[:, :k], mx, out=hi[:, :k])
        lo[lo == np.inf] = np.nan
        hi[hi == -np.inf] = np.nan
        return KeyCells(rows, count, total, lo, hi)
