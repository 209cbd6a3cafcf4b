"""Windowed aggregates: COUNT, SUM, AVG, MIN, MAX over time (RANGE/SLIDE) or row (ROWS) windows.

Incremental, by panes: the timeline is cut into panes of gcd(range, slide); each tuple updates one
partial (rows, and count/sum/min/max per aggregated expression) of its pane and group; a window is
the merge of its range/pane panes. Tumbling windows (slide == range) are single panes. Windows
start at multiples of the slide since the epoch (event time) and close when the stream's watermark
passes their end; only windows holding data are emitted.

`WindowAggregate` emits either finished rows (through `finalize`, which applies HAVING and the
SELECT list) or partial rows for a later `GroupMerge` (how a windowed aggregate is joined with a
static table: aggregate by the join key first, join the few partial rows, then regroup).

A reading may be a `fjords.partial.Partial` (a mote's pre-aggregated window, pushed by its
proxy): it is merged into the state as the `count` rows it stands for.
"""

from __future__ import annotations

import math
import operator
import sys
from bisect import bisect_left, insort
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from fjords.limits import DEFAULT_LIMITS, Limits
from fjords.operators.base import Operator
from fjords.partial import Partial
from fjords.progress import Watermark
from fjords.queues import Queue

Fn = Callable[[tuple], object]
Finalize = Callable[[tuple], "tuple | None"]

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


def _value_fn(s: AggSpec) -> Callable[[Sequence], object]:
    """One aggregate's value of a state, exactly as `finish` computes it."""
    return _value_of(s.func, s.slot)


@lru_cache(maxsize=1024)  # one per (func, slot), shared by every query (closures are ~200 B)
def _value_of(func: str, slot: int | None) -> Callable[[Sequence], object]:
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
    fns = tuple(_value_of(func, slot) for func, slot in shape)
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
        row: tuple | None = (*key, *finish(st, specs), ws, we)
        if finalize is not None:
            row = finalize(row)
            if row is None:
                continue
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
        row: tuple | None = (*key, *finish(st, specs), ws, we)
        if finalize is not None:
            row = finalize(row)
            if row is None:
                continue
        out.put(row)
        n += 1
    return n


def _add_partial(st: list, b: int, p: Partial) -> None:
    """Merge a mote's pre-aggregated window into slot base `b` (rows are counted by the caller)."""
    if p.sum is None:  # counts only: no values to aggregate
        return
    st[b] += p.count
    st[b + 1] += p.sum
    if st[b + 2] is None or p.min < st[b + 2]:
        st[b + 2] = p.min
    if st[b + 3] is None or p.max > st[b + 3]:
        st[b + 3] = p.max


def _column_ref(i: int) -> Fn:
    return lambda t: t[i]


def _key1_ref(f: Fn) -> Callable[[tuple], tuple]:
    return lambda t: (f(t),)


_COLUMN_CODE = _column_ref(0).__code__.co_code
_KEY1_CODE = _key1_ref(_column_ref(0)).__code__.co_code


def column_index(f: object) -> int | None:
    """The field index `i` when `f` is a compiled plain column (`lambda t: t[i]`), else None."""
    code = getattr(f, "__code__", None)
    cells = getattr(f, "__closure__", None)
    if code is not None and cells and len(cells) == 1 and code.co_code == _COLUMN_CODE:
        i = cells[0].cell_contents
        if isinstance(i, int):
            return i
    return None


def fast_fn(f: Fn) -> Fn:
    """`f`, or a C-level `itemgetter` when `f` is a compiled plain column (`lambda t: t[i]`)."""
    i = column_index(f)
    return f if i is None else _getter(i)


@lru_cache(maxsize=1024)  # one itemgetter per position, shared by every query
def _getter(i: int) -> Fn:
    return operator.itemgetter(i)


def single_column(key_fn: Callable[[tuple], tuple]) -> Fn | None:
    """The one column function of a one-column GROUP BY key (`lambda t: (f(t),)`), else None."""
    code = getattr(key_fn, "__code__", None)
    cells = getattr(key_fn, "__closure__", None)
    if code is not None and cells and len(cells) == 1 and code.co_code == _KEY1_CODE:
        f = cells[0].cell_contents
        if callable(f):
            return f
    return None


def single_key(key_fn: Callable[[tuple], tuple]) -> Fn | None:
    """The one column function of a one-column GROUP BY key (`lambda t: (f(t),)`), else None:
    then the bare value can be the group's dict key (no tuple per reading)."""
    f = single_column(key_fn)
    return None if f is None else fast_fn(f)


def _first_at(u: int) -> float:
    """The least float `x` with `x * 1000 >= u` in float arithmetic (`u` in milliseconds).

    `x * 1000` is monotonic in `x`, so `_first_at(a) <= ts < _first_at(b)` holds exactly when
    `a <= ts * 1000 < b`, that is when `a <= floor(ts * 1000) < b` for integers a and b: a
    reading's pane is checked by two comparisons instead of a product, a floor and a division.
    Exact for int and float times alike (Python compares an int with a float exactly)."""
    x = u / 1000
    while x * 1000 >= u:
        x = math.nextafter(x, -math.inf)
    while x * 1000 < u:
        x = math.nextafter(x, math.inf)
    return x


# Pane bounds beyond this many milliseconds are not cached (times near 2**53 lose exactness).
_EXACT_U = 1 << 50
_NO_PANE: tuple[None, float, float] = (None, math.inf, -math.inf)  # every time misses it


def _updater(arg_fns: Sequence[Fn]) -> Callable[[list, tuple], None]:
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
                _add_partial(st, 1, v)
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
                    _add_partial(st, b, v)
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


class WindowAggregate(Operator):
    """Grouped, windowed aggregation of one input.

    Output rows are `key + aggregates + (window_start, window_end)` passed through `finalize`
    (which may drop the row: HAVING), or, with `partial=True`, `key + (window_start, window_end,
    state)` for a GroupMerge. Time windows use `range_s`/`slide_s` seconds; row windows set
    `rows=True` and give `range_s`/`slide_s` as row counts (their window_start and window_end are
    the sample times of the window's first and last rows).
    """

    kind = "window_aggregate"
    # One per windowed query with its own filter: past about 30 attributes an instance dict
    # is a large combined table (~1.6 KB), slots are 8 bytes each. An attribute not named
    # here still works (Operator keeps a lazy __dict__), it only costs that dict.
    __slots__ = (
        "window_marks",
        "rows",
        "_range_u",
        "_slide_u",
        "_pane_u",
        "_rp",
        "_sp",
        "_scale",
        "range_s",
        "slide_s",
        "key_fn",
        "_bare",
        "_keyf",
        "specs",
        "_finish",
        "_value1",
        "_n_slots",
        "_update",
        "_cur",
        "_key_col",
        "_arg_col",
        "_minmax",
        "_lean",
        "time_index",
        "finalize",
        "partial",
        "start_time",
        "_panes",
        "_pane_times",
        "_pane_keys",
        "_next_k",
        "_row_no",
        "_row_shift",
        "late",
        "windows_emitted",
        "limits",
        "_bytes",
        "_state_bytes",
        "_pending_close",
        "_backlog",
        "direct",
        "after_transition",
    )

    def __init__(
        self,
        input: Queue,
        output: Queue,
        *,
        key_fn: Callable[[tuple], tuple],
        arg_fns: Sequence[Fn],
        specs: Sequence[AggSpec],
        time_index: int,
        range_s: float,
        slide_s: float | None = None,
        rows: bool = False,
        finalize: Finalize | None = None,
        partial: bool = False,
        start_time: float = -math.inf,
        group_fns: Sequence[Fn] | None = None,
        window_marks: bool = False,
        **kw: Any,
    ) -> None:
        super().__init__([input], [output], **kw)
        # After each finished window, a Watermark at its end: tells a per-window operator
        # downstream (fjords.operators.topk) that the window's rows are all out.
        self.window_marks = window_marks
        slide_s = range_s if slide_s is None else slide_s
        if range_s <= 0 or slide_s <= 0:
            raise ValueError("window range and slide must be positive")
        self.rows = rows
        scale = 1 if rows else 1000  # coordinates: row numbers, or milliseconds of event time
        self._range_u = round(range_s * scale)
        self._slide_u = round(slide_s * scale)
        if self._range_u < 1 or self._slide_u < 1:
            raise ValueError("windows must be at least 1 ms (or 1 row)")
        self._pane_u = math.gcd(self._range_u, self._slide_u)
        self._rp = self._range_u // self._pane_u  # window length in panes
        self._sp = self._slide_u // self._pane_u  # slide in panes
        self._scale = scale
        self.range_s, self.slide_s = range_s, slide_s
        self.key_fn = key_fn
        # One group column (`group_fns`, or recognised in `key_fn`): groups are keyed by the
        # bare value, made a 1-tuple only when a window is emitted.
        one = (
            fast_fn(group_fns[0])
            if group_fns is not None and len(group_fns) == 1
            else (single_key(key_fn) if group_fns is None else None)
        )
        self._bare = one is not None
        self._keyf: Callable[[tuple], object] = one if one is not None else key_fn
        self.specs = tuple(specs)
        self._finish = finisher(self.specs)
        # One plain aggregate: its value function, so a group's row is built in one step.
        self._value1 = (
            _value_fn(self.specs[0])
            if len(self.specs) == 1 and self.specs[0].func in FUNCS
            else None
        )
        self._n_slots = len(arg_fns)
        self._update = _updater([fast_fn(f) for f in arg_fns])
        # The fast path's cache: the groups of the pane last added to, and the times it holds
        # (lo <= time < hi; see _first_at). _NO_PANE when nothing is cached.
        self._cur: tuple[dict | None, float, float] = _NO_PANE
        # Query 1's shape (one plain GROUP BY column, one aggregate over a plain column):
        # `_add_columns`, a loop with the fields read and the update inlined.
        self._key_col = (
            column_index(single_column(key_fn))
            if group_fns is None
            else (column_index(group_fns[0]) if len(group_fns) == 1 else None)
        )
        self._arg_col = column_index(arg_fns[0]) if len(arg_fns) == 1 else None
        # MIN and MAX need not be kept when no one reads them (merge_state takes None), nor
        # the row count without COUNT(*): `_add_columns` then adds only a value's count and sum.
        self._minmax = partial or not all(s.func in ("COUNT", "SUM", "AVG") for s in specs)
        self._lean = not self._minmax and all(s.slot is not None for s in specs)
        self.time_index = time_index
        self.finalize = finalize
        self.partial = partial
        self.start_time = start_time
        self._panes: dict[int, dict[tuple, list]] = {}
        self._pane_times: dict[int, list[float]] = {}  # rows mode: first/last sample time
        self._pane_keys: list[int] = []
        self._next_k: int | None = None
        self._row_no = 0
        self._row_shift = self._range_u % self._slide_u if rows else 0
        self.late = 0
        self.windows_emitted = 0
        # Run-time limits (groups, state) and the bound on work per transition; the planner
        # sets the Fjord's Limits, checked at plan time where the window alone tells.
        self.limits: Limits = DEFAULT_LIMITS
        self._bytes = 0  # estimated bytes of all groups' states and keys
        self._state_bytes = 200 + 40 * self._n_slots  # a rough size of one group's state
        self._pending_close: float | None = None  # a close cut short, resumed next transition
        self._backlog: list = []  # input read before that close, handled after it
        # Fused output (set by the Fjord): each emitted window's rows, and the end-of-input
        # watermark, as one list to this callable instead of one queue put per row; it must
        # not raise. `after_transition` runs when a transition's work is done (the Fjord
        # fails there the queries whose part of the fused output raised).
        self.direct: Callable[[list], None] | None = None
        self.after_transition: Callable[[], None] | None = None

    def has_input(self) -> bool:
        return self._pending_close is not None or bool(self._backlog) or super().has_input()

    def release_state(self) -> None:
        """Drop every open window (the query using it failed or ended)."""
        self._panes.clear()
        self._pane_times.clear()
        self._pane_keys.clear()
        self._backlog = []
        self._pending_close = None
        self._bytes = 0
        self._cur = _NO_PANE

    # -- per tuple ---------------------------------------------------------------
    def _add(self, t: tuple) -> None:
        ts = t[self.time_index]
        if self.rows:
            # Shifted so that row windows END at multiples of the slide: "the last n rows,
            # every m rows".
            coord = self._row_no + self._row_shift
            self._row_no += 1
        else:
            coord = math.floor(ts * 1000)
        p = coord // self._pane_u
        if self._next_k is not None and p // self._sp < self._next_k:
            self.late += 1  # every window holding it has been emitted already
            return
        groups = self._panes.get(p)
        if groups is None:
            groups = self._panes[p] = {}
            keys = self._pane_keys
            if not keys or p > keys[-1]:
                keys.append(p)
            else:
                insort(keys, p)
            if self.rows:
                self._pane_times[p] = [ts, ts]
        elif self.rows:
            self._pane_times[p][1] = ts
        key = self._keyf(t)
        st = groups.get(key)
        if st is None:
            st = groups[key] = new_state(self._n_slots)
            self._new_state(key, len(groups))
        self._update(st, t)

    def add_rows(self, rows: list[tuple]) -> None:
        """Fold one batch of tuples in, directly (a fused delivery from the stream router: no
        queue, no scheduler step). Time windows take the fast path: the current pane's groups
        and time bounds are cached, so a reading costs two comparisons, one dict lookup and
        the update. Control items still come through the input queue (`transition`)."""
        self.tuples_in += len(rows)
        if self.rows:
            for t in rows:
                self._add(t)
            if self._pending_close is None:
                self._close(self._row_no + self._row_shift)
            return
        if self._key_col is not None and self._arg_col is not None:
            self._add_columns(rows)
            return
        ti, update, keyf = self.time_index, self._update, self._keyf
        n_slots = self._n_slots
        locate = self._locate
        groups, lo, hi = self._cur
        for t in rows:
            ts = t[ti]
            if not lo <= ts < hi:
                groups, lo, hi = locate(ts)
                if groups is None:
                    self.late += 1  # every window holding it has been emitted already
                    continue
            key = keyf(t)
            st = groups.get(key)
            if st is None:
                st = groups[key] = new_state(n_slots)
                self._new_state(key, len(groups))
            update(st, t)
        self._cur = (groups, lo, hi)

    def _add_columns(self, rows: list[tuple]) -> None:
        """`add_rows` for one plain GROUP BY column and one aggregate over a plain column
        (Query 1's shape): fields read by index and, for int and float values, the update of
        `_updater` inlined (MIN/MAX and the row count only when asked for). Other values (NULL,
        a mote's `Partial`, text) take the general update. Property-tested equal to `_add`."""
        ti, ki, vi = self.time_index, self._key_col, self._arg_col
        update, minmax, lean, locate = self._update, self._minmax, self._lean, self._locate
        # `_new_state` inlined (a group is keyed by its bare value here): bytes, then limits
        size, state_bytes = sys.getsizeof, self._state_bytes
        max_groups = self.limits.max_groups_per_window
        max_bytes = self.limits.max_state_bytes_per_query
        groups, lo, hi = self._cur
        for t in rows:
            ts = t[ti]
            if not lo <= ts < hi:
                groups, lo, hi = locate(ts)
                if groups is None:
                    self.late += 1  # every window holding it has been emitted already
                    continue
            key = t[ki]
            st = groups.get(key)
            if st is None:
                st = groups[key] = [0, 0, 0, None, None]  # new_state(1)
                self._bytes += state_bytes + size(key)
                if len(groups) > max_groups or self._bytes > max_bytes:
                    self._check_limits(len(groups))
            v = t[vi]
            cls = v.__class__
            if cls is float or cls is int:
                if lean:  # AVG, SUM, COUNT(x) alone (Query 1)
                    st[1] += 1
                    st[2] += v
                    continue
                st[0] += 1
                st[1] += 1
                st[2] += v
                if minmax:
                    if st[3] is None or v < st[3]:
                        st[3] = v
                    if st[4] is None or v > st[4]:
                        st[4] = v
            else:
                update(st, t)
        self._cur = (groups, lo, hi)

    def _locate(self, ts: float) -> tuple[dict | None, float, float]:
        """The groups of the time pane holding `ts` (None if too late) and the times that pane
        holds, `lo <= time < hi` (a bound that misses every time when not cached)."""
        pane_u = self._pane_u
        p = math.floor(ts * 1000) // pane_u
        groups = self._pane(p)
        if groups is None:
            return _NO_PANE
        a = p * pane_u
        b = a + pane_u
        if not -_EXACT_U < a < b < _EXACT_U:
            return groups, math.inf, -math.inf  # not cached: each reading is computed
        lo, hi = _first_at(a), _first_at(b)
        if ts.__class__ is int and lo.is_integer() and hi.is_integer():
            return groups, int(lo), int(hi)  # int times compare faster with int bounds
        return groups, lo, hi

    def _pane(self, p: int) -> dict | None:
        """The groups of time pane `p` (created if new), or None if `p` is too late."""
        if self._next_k is not None and p // self._sp < self._next_k:
            return None
        groups = self._panes.get(p)
        if groups is None:
            groups = self._panes[p] = {}
            keys = self._pane_keys
            if not keys or p > keys[-1]:
                keys.append(p)
            else:
                insort(keys, p)
        return groups

    def _group_bytes(self, key: object) -> int:
        if self._bare:
            return self._state_bytes + sys.getsizeof(key)
        return self._state_bytes + sum(sys.getsizeof(k) for k in key)  # type: ignore[attr-defined]

    def _pane_bytes(self, groups: dict) -> int:
        """The `_group_bytes` of every group of a pane, summed."""
        if self._bare:
            return len(groups) * self._state_bytes + sum(map(sys.getsizeof, groups))
        return sum(map(self._group_bytes, groups))

    def _new_state(self, key: tuple, groups_in_pane: int) -> None:
        """Count a new group against the limits (only when a group is created, not per tuple)."""
        self._bytes += (
            self._state_bytes + sys.getsizeof(key) if self._bare else self._group_bytes(key)
        )
        self._check_limits(groups_in_pane)

    def _check_limits(self, groups_in_pane: int) -> None:
        lim = self.limits
        if groups_in_pane > lim.max_groups_per_window:
            lim.check("max_groups_per_window", groups_in_pane, f"{self.name}: groups in a window")
        if self._bytes > lim.max_state_bytes_per_query:
            lim.check(
                "max_state_bytes_per_query",
                self._bytes,
                f"{self.name}: estimated bytes of window state",
            )

    def transition(self) -> bool:
        did = self._transition()
        if self.after_transition is not None:
            self.after_transition()
        return did

    def _transition(self) -> bool:
        if self._pending_close is not None:
            # A close cut short: go on with it before reading anything newer.
            if not self._close(self._pending_close):
                return True
        items = self._backlog or self.inputs[0].get_batch(self.batch)  # type: ignore[attr-defined]
        self._backlog = []
        if not items:
            return False
        add = self._add
        n = 0
        for i, item in enumerate(items):
            if item.__class__ is tuple:
                add(item)  # type: ignore[arg-type]
                n += 1
            elif item.__class__ is Watermark and (
                not self.rows or item.time == math.inf  # type: ignore[attr-defined]
            ):
                if not self._close(item.time):  # type: ignore[attr-defined]
                    self._backlog = items[i + 1 :]
                    break
                mark = item.time  # type: ignore[attr-defined]
                if self.window_marks and not self.rows and mark != math.inf:
                    # every window ending by then is out: a merge downstream (UNION ALL) may
                    # move on even while this query's windows are empty
                    self.emit(Watermark(mark))
        self.tuples_in += n
        if self.rows and self._pending_close is None:
            self._close(self._row_no + self._row_shift)
        return True

    # -- closing windows ---------------------------------------------------------------
    def _close(self, limit: float) -> bool:
        """Emit every window whose end is at or before `limit` (seconds, or rows in rows mode).

        At most `limits.max_windows_per_transition` windows (and about 4096 pane merges) per
        call, so closing never holds the event loop: returns False when cut short (the rest is
        resumed by the next transition), True when done."""
        self._pending_close = None
        self._cur = _NO_PANE  # windows may close: panes go, late moves
        budget_windows = self.limits.max_windows_per_transition
        budget_panes = 4096
        limit_p = (
            math.inf if limit == math.inf else (limit * (1 if self.rows else 1000)) / self._pane_u
        )
        rp, sp = self._rp, self._sp
        keys = self._pane_keys
        while keys:
            k = (keys[0] - rp) // sp + 1  # first window holding the oldest pane
            if self._next_k is not None and k < self._next_k:
                k = self._next_k
            if k * sp + rp > limit_p:
                break
            if budget_windows <= 0 or budget_panes <= 0:
                self._pending_close = limit
                return False
            budget_panes -= self._emit(k)
            budget_windows -= 1
            self._next_k = k + 1
            keep_from = (k + 1) * sp
            drop = bisect_left(keys, keep_from)
            for p in keys[:drop]:
                self._bytes -= self._pane_bytes(self._panes.pop(p))
                self._pane_times.pop(p, None)
            del keys[:drop]
        if limit == math.inf:  # end of input: everything downstream may flush
            if self.direct is not None:
                self.direct([Watermark(limit)])
            else:
                self.emit(Watermark(limit))
        return True

    def _emit(self, k: int) -> int:
        """Emit window `k`; returns the number of panes merged (the work done)."""
        sp, rp = self._sp, self._rp
        first, last = k * sp, k * sp + rp
        keys = self._pane_keys
        lo, hi = bisect_left(keys, first), bisect_left(keys, last)
        panes = [keys[i] for i in range(lo, hi)]
        if not panes:
            return 1
        if self.rows:
            ws = self._pane_times[panes[0]][0]
            we = self._pane_times[panes[-1]][1]
        else:
            ws = first * self._pane_u / 1000
            we = last * self._pane_u / 1000
        if ws < self.start_time:
            return len(panes)
        if len(panes) == 1:
            groups = self._panes[panes[0]]
        else:
            groups = {}
            for p in panes:
                for key, st in self._panes[p].items():
                    acc = groups.get(key)
                    if acc is None:
                        groups[key] = list(st)
                    else:
                        merge_state(acc, st)
            if len(groups) > self.limits.max_groups_per_window:
                self.limits.check(
                    "max_groups_per_window", len(groups), f"{self.name}: groups in a window"
                )
        bare = self._bare  # `groups` keyed by the bare value (one group column)
        if bare and (self.direct is None or self.partial):
            groups, bare = {(k,): st for k, st in groups.items()}, False
        self.windows_emitted += 1
        out = self.outputs[0]
        if self.partial:
            for key, st in groups.items():
                out.put((*key, ws, we, tuple(st)))
                self.tuples_out += 1
            out.put(Watermark(we))  # this window is complete: a GroupMerge may flush it
            return len(panes)
        if self.direct is not None:
            rows = self._finished(groups, bare, ws, we)
            self.tuples_out += len(rows)
            if rows:
                self.direct(rows)
            return len(panes)
        self.tuples_out += put_finished(out, groups, self.specs, self.finalize, ws, we)
        if self.window_marks:
            out.put(Watermark(we))
        return len(panes)

    def _finished(self, groups: dict, bare: bool, ws: float, we: float) -> list[tuple]:
        """One finished row per group (`key + aggregates + (ws, we)`, through `finalize`), as
        `finished_rows` makes them; `bare`: `groups` is keyed by the bare value."""
        v1, fin = self._value1, self._finish
        if bare and v1 is not None:
            rows = [(k, v1(st), ws, we) for k, st in groups.items()]
        elif bare:
            rows = [(k, *fin(st), ws, we) for k, st in groups.items()]
        else:
            rows = [(*k, *fin(st), ws, we) for k, st in groups.items()]
        if self.finalize is not None:
            rows = [r for r in map(self.finalize, rows) if r is not None]
        return rows

    def describe(self) -> dict[str, Any]:
        unit = "rows" if self.rows else "seconds"
        return {
            **super().describe(),
            "range": self.range_s,
            "slide": self.slide_s,
            "unit": unit,
            "aggregates": [
                s.label or f"{s.func}({'*' if s.slot is None else s.slot})" for s in self.specs
            ],
        }


class GroupMerge(Operator):
    """Regroup partial rows (after a join) by new keys, per window, and finish them.

    Input rows carry a window's bounds and a partial state at known positions; a watermark at or
    past a window's end flushes that window's groups.
    """

    kind = "group_merge"
    forward_other = False  # items other than rows and watermarks (a subclass may pass them on)

    def __init__(
        self,
        input: Queue,
        output: Queue,
        *,
        key_fn: Callable[[tuple], tuple],
        ws_index: int,
        we_index: int,
        state_index: int,
        specs: Sequence[AggSpec],
        finalize: Finalize | None = None,
        **kw: Any,
    ) -> None:
        super().__init__([input], [output], **kw)
        self.key_fn = key_fn
        self.ws_index, self.we_index, self.state_index = ws_index, we_index, state_index
        self.specs = tuple(specs)
        self.finalize = finalize
        self._windows: dict[tuple[float, float], dict[tuple, list]] = {}

    def transition(self) -> bool:
        items = self.inputs[0].get_batch(self.batch)  # type: ignore[attr-defined]
        if not items:
            return False
        for item in items:
            if item.__class__ is tuple:
                t: tuple = item  # type: ignore[assignment]
                self.tuples_in += 1
                groups = self._windows.setdefault((t[self.ws_index], t[self.we_index]), {})
                self._add(groups, self.key_fn(t), t)
            elif item.__class__ is Watermark:
                self._flush(item.time)  # type: ignore[attr-defined]
            elif self.forward_other:
                self.outputs[0].put(item)
        return True

    def _add(self, groups: dict[tuple, list], key: tuple, t: tuple) -> None:
        """Merge partial row `t` into its group's state."""
        acc = groups.get(key)
        if acc is None:
            groups[key] = list(t[self.state_index])
        else:
            merge_state(acc, t[self.state_index])

    def _put_window(self, groups: dict[tuple, list], ws: float, we: float) -> int:
        """Output a closed window's finished rows; how many."""
        return put_finished(self.outputs[0], groups, self.specs, self.finalize, ws, we)

    def release_state(self) -> None:
        self._windows.clear()

    def _flush(self, limit: float) -> None:
        for bounds in sorted(b for b in self._windows if b[1] <= limit):
            ws, we = bounds
            self.tuples_out += self._put_window(self._windows.pop(bounds), ws, we)
        self.outputs[0].put(Watermark(limit))


class Finish(Operator):
    """One query's end of a shared windowed aggregate: its HAVING and SELECT list (`finalize`),
    and only windows that start at or after the query did (it joined a running aggregate)."""

    kind = "finish"
    __slots__ = ("finalize", "start_time")

    def __init__(
        self,
        input: Queue,
        output: Queue,
        *,
        finalize: Finalize,
        start_time: float = -math.inf,
        **kw: Any,
    ) -> None:
        super().__init__([input], [output], **kw)
        self.finalize = finalize
        self.start_time = start_time

    def finish_batch(self, items: list) -> tuple[list[tuple], float | None]:
        """A fused window's items at once (`SharedAggregate.fan_out`): its rows that start at
        or after the query did, through HAVING and the SELECT list (`finalize.batch` when the
        planner gave one: one call per window), and the latest watermark among the items."""
        rows = [r for r in items if r.__class__ is tuple]
        mark = None
        if len(rows) < len(items):
            mark = max(r.time for r in items if r.__class__ is not tuple)
        self.tuples_in += len(rows)
        start = self.start_time
        if start > -math.inf:
            rows = [r for r in rows if not r[-2] < start]
        batch = getattr(self.finalize, "batch", None)
        if batch is not None:
            out = batch(rows)
        else:
            out = [r for r in map(self.finalize, rows) if r is not None]
        self.tuples_out += len(out)
        return out, mark

    def transition(self) -> bool:
        items = self.inputs[0].get_batch(self.batch)  # type: ignore[attr-defined]
        if not items:
            return False
        out, fin, start = self.outputs[0], self.finalize, self.start_time
        for item in items:
            if item.__class__ is tuple:
                self.tuples_in += 1
                if item[-2] < start:  # type: ignore[index]
                    continue
                row = fin(item)  # type: ignore[arg-type]
                if row is not None:
                    out.put(row)
                    self.tuples_out += 1
            else:
                out.put(item)
        return True
