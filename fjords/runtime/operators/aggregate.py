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

Fast paths beside the general one, each property-tested to give its rows exactly
(tests/fjords/test_fused.py, test_window_batch.py): `_add_columns` (one plain group column and
one aggregated column, fields read by index), `_close_tumbling` (a fused tumbling window: the
windows one watermark closes go out in one call) and `_add_dense` (COUNT/SUM/AVG of a float
column over large deliveries, such as `python -m fjords`' chunks: numpy arrays per pane).
"""

from __future__ import annotations

import math
import operator
import sys
from bisect import bisect_left, insort
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from operator import itemgetter
from typing import Any, Protocol

import numpy as np

from fjords.limits import DEFAULT_LIMITS, Limits
from fjords.partial import Partial
from fjords.runtime.operators.base import Operator
from fjords.runtime.progress import Watermark
from fjords.runtime.queues import Queue

Fn = Callable[[tuple], object]
Finalize = Callable[[tuple], "tuple | None"]


class FanOut(Protocol):
    """Where a fused aggregate's `direct` output may stop part way (`fjords.runtime.fjord`'s
    SharedAggregate: a window for many users, bounded work per transition)."""

    @property
    def pending(self) -> bool:
        """Whether an output was cut short."""
        ...

    def drain(self) -> bool:
        """Go on with it; True when all is out."""
        ...


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


_KEY_BYTES: dict[str, int] = {}  # sys.getsizeof of text group keys, shared by every aggregate


def _key_bytes(key: object) -> int:
    """`sys.getsizeof(key)`, remembered for text keys (equal strings are equally large)."""
    n = _KEY_BYTES.get(key) if key.__class__ is str else None  # type: ignore[call-overload]
    if n is None:
        n = sys.getsizeof(key)
        if key.__class__ is str:
            if len(_KEY_BYTES) >= 65_536:
                _KEY_BYTES.clear()
            _KEY_BYTES[key] = n  # type: ignore[index]
    return n


_BOUNDS: dict[int, float] = {}  # `_first_at` of recent pane ends: shared by every aggregate


def _pane_bound(u: int) -> float:
    """`_first_at(u)`, remembered: the queries over one stream cross the same pane ends (100
    windowed queries: each end computed once, not 100 times)."""
    x = _BOUNDS.get(u)
    if x is None:
        if len(_BOUNDS) >= 4096:
            _BOUNDS.clear()
        x = _BOUNDS[u] = _first_at(u)
    return x


# Pane bounds beyond this many milliseconds are not cached (times near 2**53 lose exactness).
_EXACT_U = 1 << 50
_NO_PANE: tuple[None, float, float] = (None, math.inf, -math.inf)  # every time misses it
_ONLY_FLOAT, _ONLY_INT, _ONLY_STR = {float}, {int}, {str}
_NEVER = np.iinfo(np.int64).max  # a dense group's first arrival before it has one


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


class _Dense:
    """A `WindowAggregate`'s dense state: per open pane, (sums, counts, first arrival,
    bytes), the arrays indexed by key code; `codes`/`keyvals`/`keysizes` code the keys (and
    size them as `_new_state` does); `seq` numbers the arrivals."""

    __slots__ = ("panes", "codes", "keyvals", "keysizes", "seq")

    def __init__(self) -> None:
        self.panes: dict[int, tuple] = {}
        self.codes: dict[object, int] = {}
        self.keyvals: list = []
        self.keysizes: list[int] = []
        self.seq = 0


class WindowAggregate(Operator):
    """Grouped, windowed aggregation of one input.

    Output rows are `key + aggregates + (window_start, window_end)` passed through `finalize`
    (which may drop the row: HAVING), or, with `partial=True`, `key + (window_start, window_end,
    state)` for a GroupMerge. Time windows use `range_s`/`slide_s` seconds; row windows set
    `rows=True` and give `range_s`/`slide_s` as row counts (their window_start and window_end are
    the sample times of the window's first and last rows).
    """

    kind = "window_aggregate"
    # A delivery of at least this many rows starts the dense state (`_add_dense`) of an
    # aggregate holding no window: below it, its ~30 numpy calls cost more than the rows
    # (measured: a loss at ~200 rows per delivery, 22% less CPU for `python -m fjords`'
    # ~3,000 per query and chunk).
    dense_min = 512
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
        "fan",
        # the batched close and the dense state (`_close_tumbling`, `_add_dense`)
        "_avg1",
        "_dense_ok",
        "_dn",
        "_loc_p",
        "_pane_nb",
        "_tracked",
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
        # downstream (fjords.runtime.operators.topk) that the window's rows are all out.
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
        # AVG of one argument alone: `_finished` computes it inline (as `_value_fn` does).
        self._avg1 = (
            len(self.specs) == 1 and self.specs[0] == AggSpec("AVG", 0) and len(arg_fns) == 1
        )
        self._n_slots = len(arg_fns)
        self._update = _updater([fast_fn(f) for f in arg_fns])
        # The fast path's cache: the groups of the pane last added to, and the times it holds
        # (lo <= time < hi; see _first_at). _NO_PANE when nothing is cached.
        self._cur: tuple[dict | None, float, float] = _NO_PANE
        # The dense state (`_add_dense`), made on first use (most aggregates never need it:
        # an installed query's size matters at 10,000 queries).
        self._dn: _Dense | None = None
        # False once a dense batch had more than 8 rows per group (Query 1's shape: few,
        # large groups, which dicts update faster than numpy regroups them): dicts for good.
        self._dense_ok = True
        # Query 1's shape (one plain GROUP BY column, one aggregate over a plain column):
        # `_add_columns`, a loop with the fields read and the update inlined.
        self._key_col = (
            column_index(single_column(key_fn))
            if group_fns is None
            else (column_index(group_fns[0]) if len(group_fns) == 1 else None)
        )
        self._arg_col = column_index(arg_fns[0]) if len(arg_fns) == 1 else None
        # Bytes per pane, for an aggregate of one plain group column and one plain argument
        # column (`_tracked`): every group's bytes are added to its pane's here as it is
        # created, so closing a pane subtracts them without sizing its keys again.
        self._tracked = self._key_col is not None and self._arg_col is not None
        self._pane_nb: dict[int, int] | None = None  # made on first use, as `_dn`
        self._loc_p = 0  # the pane `_locate` found last
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
        # ... and where `direct` may stop part way (`FanOut`): nothing newer is closed before
        # what it holds is out.
        self.fan: FanOut | None = None

    @property
    def _dense(self) -> dict[int, tuple]:
        """The dense panes (`_add_dense`): pane -> (sums, counts, first arrivals, bytes)."""
        return self._dn.panes if self._dn is not None else {}

    def has_input(self) -> bool:
        return (
            self._pending_close is not None
            or bool(self._backlog)
            or (self.fan is not None and self.fan.pending)
            or super().has_input()
        )

    def _cut_short(self, limit: float) -> bool:
        """After handing rows to `direct`: whether it stopped part way (then this close is
        resumed once it is done, next transition)."""
        if self.fan is not None and self.fan.pending:
            self._pending_close = limit
            return True
        return False

    def release_state(self) -> None:
        """Drop every open window (the query using it failed or ended)."""
        self._panes.clear()
        self._pane_nb = None
        if self._dn is not None:
            self._dn.panes.clear()
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
            if self._tracked:  # (bare: one group column) bytes as `_new_state` counts them
                cost = self._state_bytes + sys.getsizeof(key)
                nb = self._pane_nb
                if nb is None:
                    nb = self._pane_nb = {}
                nb[p] = nb.get(p, 0) + cost
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
            if (self._dn is not None and self._dn.panes) or (
                self._dense_ok
                and not self._panes
                and len(rows) >= self.dense_min
                and self._dense_fits()
            ):
                if self._add_dense(rows):
                    if not self._dense_ok:
                        self._undense()  # groups of many rows: dicts are faster (Query 1)
                    return
                self._undense()  # rows it cannot take: back to groups in dicts
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
        state_bytes = self._state_bytes
        max_groups = self.limits.max_groups_per_window
        max_bytes = self.limits.max_state_bytes_per_query
        groups, lo, hi = self._cur
        nbytes = self._bytes  # kept local, stored back (and before a limit check)
        key_bytes = _KEY_BYTES.get
        pane_nb, p, added = self._pane_nb, self._loc_p, 0  # the current pane's new bytes
        if pane_nb is None:
            pane_nb = self._pane_nb = {}
        for t in rows:
            ts = t[ti]
            if not lo <= ts < hi:
                if added:
                    pane_nb[p] = pane_nb.get(p, 0) + added
                    added = 0
                groups, lo, hi = locate(ts)
                if groups is None:
                    self.late += 1  # every window holding it has been emitted already
                    continue
                p = self._loc_p
            key = t[ki]
            st = groups.get(key)
            if st is None:
                st = groups[key] = [0, 0, 0, None, None]  # new_state(1)
                cost = key_bytes(key)
                cost = state_bytes + (_key_bytes(key) if cost is None else cost)
                nbytes += cost
                added += cost
                if len(groups) > max_groups or nbytes > max_bytes:
                    self._bytes = nbytes
                    pane_nb[p] = pane_nb.get(p, 0) + added
                    added = 0
                    self._check_limits(len(groups))
            v = t[vi]
            cls = v.__class__
            if lean and (cls is float or cls is int):  # AVG, SUM, COUNT(x) alone (Query 1)
                st[1] += 1
                st[2] += v
            elif cls is float or cls is int:
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
        if added:
            pane_nb[p] = pane_nb.get(p, 0) + added
        self._bytes = nbytes
        self._cur = (groups, lo, hi)

    # -- the dense state ------------------------------------------------------------
    def _dense_fits(self) -> bool:
        """Whether the dense state may serve this aggregate: a fused (`direct`) tumbling time
        window of COUNT(x)/SUM(x)/AVG(x) over one plain column, grouped by one plain column."""
        return (
            self.direct is not None
            and self._lean
            and self._rp == self._sp == 1
            and not (self.rows or self.partial)
            and self._key_col is not None
            and self._arg_col is not None
        )

    def _add_dense(self, rows: list[tuple]) -> bool:
        """`_add_columns` with numpy, no Python work per row or group: each open pane holds
        one array of sums, one of counts and one of first arrivals, indexed by key code.
        The 100 windowed aggregates of issue 14 (and `python -m fjords`' chunks of 65,536)
        spend most of their time creating and updating groups of ~2 rows each.

        Exact: a group's sum is its sum so far plus its values one by one in arrival order
        (`np.add.at` is unbuffered, in index order), the float additions of the row path;
        a window's rows come out in first-arrival order (`_dense_rows`); late rows are
        counted; bytes and limits are counted as the row path counts them. Takes a batch
        only if every value is a float, every time an int (or every one a float) and every
        key a str (or every one an int), else returns False having changed no window
        (the caller then moves the state back to dicts: `_undense`). Property-tested equal
        to `_add` (tests/fjords/test_window_batch.py)."""
        vals = list(map(itemgetter(self._arg_col), rows))  # type: ignore[arg-type]
        if set(map(type, vals)) != _ONLY_FLOAT:  # NULL, a mote's Partial, ints (exact sums)
            return False
        keys = list(map(itemgetter(self._key_col), rows))  # type: ignore[arg-type]
        kinds = set(map(type, keys))
        if kinds != _ONLY_STR and kinds != _ONLY_INT:
            return False
        times = list(map(itemgetter(self.time_index), rows))
        kinds = set(map(type, times))
        if kinds == _ONLY_INT:
            if not (-_EXACT_U < min(times) * 1000 and max(times) * 1000 < _EXACT_U):
                return False
            panes = np.array(times, dtype=np.int64) * 1000 // self._pane_u
        elif kinds == _ONLY_FLOAT:
            ms = np.array(times, dtype=np.float64) * 1000  # as `ts * 1000` in Python
            if not (np.abs(ms) < _EXACT_U).all():  # NaN fails this too
                return False
            panes = np.floor(ms).astype(np.int64) // self._pane_u  # as math.floor
        else:
            return False
        dn = self._dn
        if dn is None:
            dn = self._dn = _Dense()
        codes = dn.codes
        got = list(map(codes.get, keys))
        if None in got:
            for k in keys:
                if k not in codes:
                    codes[k] = len(dn.keyvals)
                    dn.keyvals.append(k)
                    dn.keysizes.append(sys.getsizeof(k))
            got = list(map(codes.__getitem__, keys))
        n = len(rows)
        c = np.array(got, dtype=np.int64)
        v = np.array(vals, dtype=np.float64)
        seq = np.arange(dn.seq, dn.seq + n, dtype=np.int64)
        dn.seq += n
        late = 0
        if self._next_k is not None:  # rows of windows already emitted are late
            fresh = panes >= self._next_k
            kept = int(np.count_nonzero(fresh))
            if kept < n:
                late = n - kept
                if not kept:
                    self.late += late
                    return True
                panes, c, v, seq = panes[fresh], c[fresh], v[fresh], seq[fresh]
        up, j = np.unique(panes, return_inverse=True)
        n_keys, n_panes = len(dn.keyvals), len(up)
        size = n_panes * n_keys
        if size > 16 * n + 4096:  # many keys, few in each pane: arrays would outgrow dicts
            return False
        self.late += late
        gid = j.ravel() * n_keys + c
        sums = np.zeros(size, dtype=np.float64)
        counts = np.zeros(size, dtype=np.int64)
        first = np.full(size, _NEVER, dtype=np.int64)
        dense = dn.panes
        up_list = up.tolist()
        for i, p in enumerate(up_list):
            old = dense.get(p)
            if old is not None:  # seeded with the pane's state (fewer keys, maybe)
                a, b = i * n_keys, i * n_keys + len(old[0])
                sums[a:b], counts[a:b], first[a:b] = old[0], old[1], old[2]
        np.add.at(sums, gid, v)
        added = np.bincount(gid, minlength=size)
        if len(gid) > 8 * np.count_nonzero(added):
            self._dense_ok = False
        new = (added > 0) & (counts == 0)
        counts += added
        np.minimum.at(first, gid, seq)
        # bytes as `_new_state` counts them: per new group, its state and its key
        cost = np.tile(np.array(dn.keysizes, dtype=np.int64) + self._state_bytes, n_panes)
        pane_bytes = np.where(new, cost, 0).reshape(n_panes, n_keys).sum(axis=1).tolist()
        in_pane = np.count_nonzero(counts.reshape(n_panes, n_keys), axis=1)
        sums2, counts2, first2 = (x.reshape(n_panes, n_keys) for x in (sums, counts, first))
        keys_list = self._pane_keys
        for i, p in enumerate(up_list):
            old = dense.get(p)
            if old is None:
                if not keys_list or p > keys_list[-1]:
                    keys_list.append(p)
                else:
                    insort(keys_list, p)
                grown = pane_bytes[i]
            else:
                grown = old[3] + pane_bytes[i]
            dense[p] = (sums2[i], counts2[i], first2[i], grown)
        self._bytes += sum(pane_bytes)
        most = int(in_pane.max())
        lim = self.limits
        if most > lim.max_groups_per_window or self._bytes > lim.max_state_bytes_per_query:
            self._check_limits(most)
        return True

    def _dense_order(self, counts: np.ndarray, first: np.ndarray) -> np.ndarray:
        """The codes of a dense pane's groups, in first-arrival order (the row path's)."""
        nz = np.flatnonzero(counts)
        if len(nz) > 1:
            nz = nz[np.argsort(first[nz], kind="stable")]
        return nz

    def _dense_rows(self, closing: list[tuple[tuple, float, float]]) -> list[tuple]:
        """The finished rows of closing dense panes `(pane, ws, we)`, window after window,
        each window's groups in first-arrival order: what `_finished` makes from dicts, in
        about a dozen numpy calls for all the windows a watermark closes."""
        k = max(len(pane[0]) for pane, _, _ in closing)
        if all(len(pane[0]) == k for pane, _, _ in closing):
            sums, counts, first = (np.concatenate([c[0][i] for c in closing]) for i in range(3))
        else:  # panes made before the aggregate saw its later keys: padded
            m = len(closing)
            sums = np.zeros(m * k, dtype=np.float64)
            counts = np.zeros(m * k, dtype=np.int64)
            first = np.full(m * k, _NEVER, dtype=np.int64)
            for i, (pane, _, _) in enumerate(closing):
                a, b = i * k, i * k + len(pane[0])
                sums[a:b], counts[a:b], first[a:b] = pane[0], pane[1], pane[2]
        nz = np.flatnonzero(counts)
        nz = nz[np.lexsort((first[nz], nz // k))]  # by window, then by first arrival
        s, c = sums[nz], counts[nz]
        cols = []
        for spec in self.specs:
            if spec.func == "AVG":
                cols.append((s / c).tolist())  # float / int, as in Python
            elif spec.func == "SUM":
                cols.append(s.tolist())
            else:
                cols.append(c.tolist())
        keyvals = self._dn.keyvals  # type: ignore[union-attr]
        win = (nz // k).tolist()
        rows = list(
            zip(
                [keyvals[i] for i in (nz % k).tolist()],
                *cols,
                [closing[j][1] for j in win],
                [closing[j][2] for j in win],
                strict=True,
            )
        )
        if self.finalize is not None:
            rows = [r for r in map(self.finalize, rows) if r is not None]
        return rows

    def _undense(self) -> None:
        """The dense panes as the row path's dicts (groups in first-arrival order, lean
        states), for rows the dense state cannot take. Bytes stay as counted."""
        dn = self._dn
        if dn is None or not dn.panes:
            return
        keyvals = dn.keyvals
        if self._pane_nb is None:
            self._pane_nb = {}
        for p, (sums, counts, first, _) in dn.panes.items():
            nz = self._dense_order(counts, first).tolist()
            self._pane_nb[p] = dn.panes[p][3]
            self._panes[p] = {
                keyvals[i]: [0, n, s, None, None]
                for i, n, s in zip(nz, counts[nz].tolist(), sums[nz].tolist(), strict=True)
            }
        dn.panes.clear()
        self._cur = _NO_PANE

    def _locate(self, ts: float) -> tuple[dict | None, float, float]:
        """The groups of the time pane holding `ts` (None if too late) and the times that pane
        holds, `lo <= time < hi` (a bound that misses every time when not cached)."""
        pane_u = self._pane_u
        p = math.floor(ts * 1000) // pane_u
        groups = self._pane(p)
        if groups is None:
            return _NO_PANE
        self._loc_p = p
        a = p * pane_u
        b = a + pane_u
        if not -_EXACT_U < a < b < _EXACT_U:
            return groups, math.inf, -math.inf  # not cached: each reading is computed
        lo, hi = _pane_bound(a), _pane_bound(b)
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

    def _drop_bytes(self, p: int, groups: dict) -> None:
        """Uncount a closed pane's groups: its recorded bytes, or its keys sized again."""
        nb = self._pane_nb.pop(p, None) if self._pane_nb else None
        self._bytes -= self._pane_bytes(groups) if nb is None else nb

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
        if self.fan is not None and not self.fan.drain():
            return True  # a window's fan-out goes on: nothing newer before it is out
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
        if (
            self._rp == self._sp == 1
            and self.direct is not None
            and not (self.rows or self.partial)
        ):
            return self._close_tumbling(limit)
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
                self._drop_bytes(p, self._panes.pop(p))
                self._pane_times.pop(p, None)
            del keys[:drop]
            if self._cut_short(limit):
                return False
        if limit == math.inf:  # end of input: everything downstream may flush
            if self.direct is not None:
                self.direct([Watermark(limit)])
            else:
                self.emit(Watermark(limit))
        return True

    def _close_tumbling(self, limit: float) -> bool:
        """`_close` for a fused tumbling time window (one pane per window, rows handed to
        `direct`): the closing windows' rows go out in ONE `direct` call (a watermark
        typically closes several windows of each of many queries: one fan-out each, not one
        per window), in window order, as `_emit` makes them. Same budget, same counters.
        Property-tested equal to the general close (tests/fjords/test_window_batch.py)."""
        pane_u, keys, panes = self._pane_u, self._pane_keys, self._panes
        limit_p = math.inf if limit == math.inf else (limit * 1000) / pane_u
        budget = self.limits.max_windows_per_transition
        start, bare, finished = self.start_time, self._bare, self._finished
        out: list[tuple] = []
        closing: list[tuple[tuple, float, float]] = []  # dense panes: their rows at once
        n = 0
        while n < len(keys) and keys[n] + 1 <= limit_p:
            if n >= budget:
                self._pending_close = limit
                break
            p = keys[n]
            ws = p * pane_u / 1000
            groups = panes.pop(p, None)
            if groups is None:  # a dense pane (`_add_dense`)
                pane = self._dn.panes.pop(p)  # type: ignore[union-attr]
                self._bytes -= pane[3]
                if not ws < start:
                    self.windows_emitted += 1
                    closing.append((pane, ws, (p + 1) * pane_u / 1000))
            else:
                if closing:  # (dense and dict panes never coexist; were they to, in order)
                    out += self._dense_rows(closing)
                    closing = []
                self._drop_bytes(p, groups)
                if not ws < start:
                    self.windows_emitted += 1
                    out += finished(groups, bare, ws, (p + 1) * pane_u / 1000)
            n += 1
        if closing:
            out += self._dense_rows(closing)
        if n:
            self._next_k = keys[n - 1] + 1
            del keys[:n]
        if out:
            self.tuples_out += len(out)
            self.direct(out)  # type: ignore[misc]
            if self._cut_short(limit):
                return False
        if self._pending_close is not None:
            return False
        if limit == math.inf:  # end of input: everything downstream may flush
            self.direct([Watermark(limit)])  # type: ignore[misc]
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
        if bare and self._avg1:  # one AVG (the windowed aggregates of issue 14): inlined
            rows = [(k, s / n if n else None, ws, we) for k, (_, n, s, _, _) in groups.items()]
        elif bare and v1 is not None:
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

    def finish_batch(
        self, items: list, finalize: Finalize | None = None
    ) -> tuple[list[tuple], float | None]:
        """A fused window's items at once (`SharedAggregate.fan_out`): its rows that start at
        or after the query did, through HAVING and the SELECT list (`finalize.batch` when the
        planner gave one: one call per window), and the latest watermark among the items.
        `finalize`: another than the query's (its rows picked by its groups already)."""
        rows = [r for r in items if r.__class__ is tuple]
        mark = None
        if len(rows) < len(items):
            mark = max(r.time for r in items if r.__class__ is not tuple)
        self.tuples_in += len(rows)
        start = self.start_time
        if start > -math.inf:
            rows = [r for r in rows if not r[-2] < start]
        fin = self.finalize if finalize is None else finalize
        batch = getattr(fin, "batch", None)
        if batch is not None:
            out = batch(rows)
        else:
            out = [r for r in map(fin, rows) if r is not None]
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
