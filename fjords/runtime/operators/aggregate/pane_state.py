"""A window aggregate's state: its panes of groups, their bytes and limits.

`PaneState` holds what every path of `WindowAggregate` reads and writes (the slots of one
object per windowed query); the add paths (`adds`, `dense`) and the windows (`window`) are
its subclasses' methods, one concern per module.
"""

from __future__ import annotations

import math
import sys
from bisect import insort
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from fjords.limits import DEFAULT_LIMITS, Limits
from fjords.runtime.operators.aggregate.columns import (
    column_index,
    fast_fn,
    single_column,
    single_key,
)
from fjords.runtime.operators.aggregate.panes import (
    EXACT_U,
    NO_PANE,
    pane_bound,
)
from fjords.runtime.operators.aggregate.state import (
    FUNCS,
    AggSpec,
    Finalize,
    Fn,
    finisher,
    updater,
    value_fn,
)
from fjords.runtime.operators.base import Operator
from fjords.runtime.queues import Queue


class FanOut(Protocol):
    """A fused aggregate's output (`fjords.runtime.shared.WindowFanOut`): each emitted window's
    rows, and the end-of-input watermark, as one list, instead of one queue put per row. It may
    stop part way (a window for many users, bounded work per transition): nothing newer is
    closed before what it holds is out. What a user's part raised is settled after the
    aggregate's transition (`settle`): `deliver` itself never raises."""

    def deliver(self, items: list) -> None:
        """One window's rows (or closing windows', in window order), or a watermark."""
        ...

    @property
    def pending(self) -> bool:
        """Whether an output was cut short."""
        ...

    def drain(self) -> bool:
        """Go on with it; True when all is out."""
        ...

    def settle(self) -> None:
        """After a transition: whatever its deliveries raised is handled (their users fail)."""
        ...


class DenseState:
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


class PaneState(Operator):
    """The state of a `WindowAggregate` (see there); built once with its outputs."""

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
        output: Queue | None = None,
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
        fan: FanOut | None = None,
        limits: Limits = DEFAULT_LIMITS,
        **kw: Any,
    ) -> None:
        if (output is None) == (fan is None):
            raise ValueError("a window aggregate has one output: a queue or a fan-out")
        super().__init__([input], [] if output is None else [output], **kw)
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
        self._keyf: Callable[[tuple], Any] = one if one is not None else key_fn
        self.specs = tuple(specs)
        self._finish = finisher(self.specs)
        # One plain aggregate: its value function, so a group's row is built in one step.
        self._value1 = (
            value_fn(self.specs[0])
            if len(self.specs) == 1 and self.specs[0].func in FUNCS
            else None
        )
        # AVG of one argument alone: `_finished` computes it inline (as `value_fn` does).
        self._avg1 = (
            len(self.specs) == 1 and self.specs[0] == AggSpec("AVG", 0) and len(arg_fns) == 1
        )
        self._n_slots = len(arg_fns)
        self._update = updater([fast_fn(f) for f in arg_fns])
        # The fast path's cache: the groups of the pane last added to, and the times it holds
        # (lo <= time < hi; see first_at). NO_PANE when nothing is cached.
        self._cur: tuple[dict | None, float, float] = NO_PANE
        # The dense state (`_add_dense`), made on first use (most aggregates never need it:
        # an installed query's size matters at 10,000 queries).
        self._dn: DenseState | None = None
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
        self._panes: dict[int, dict[Any, list]] = {}  # pane -> group key (or bare value) -> state
        self._pane_times: dict[int, list[float]] = {}  # rows mode: first/last sample time
        self._pane_keys: list[int] = []
        self._next_k: int | None = None
        self._row_no = 0
        self._row_shift = self._range_u % self._slide_u if rows else 0
        self.late = 0
        self.windows_emitted = 0
        # Run-time limits (groups, state) and the bound on work per transition (the Fjord's,
        # checked at plan time where the window alone tells; a shared aggregate's grow with
        # its users: `fjords.runtime.shared`).
        self.limits = limits
        self._bytes = 0  # estimated bytes of all groups' states and keys
        self._state_bytes = 200 + 40 * self._n_slots  # a rough size of one group's state
        self._pending_close: float | None = None  # a close cut short, resumed next transition
        self._backlog: list = []  # input read before that close, handled after it
        # Fused: each emitted window's rows go to `fan` as one list (see FanOut); unfused: to
        # the output queue, row by row.
        self.fan = fan

    @property
    def _dense(self) -> dict[int, tuple]:
        """The dense panes (`_add_dense`): pane -> (sums, counts, first arrivals, bytes)."""
        return self._dn.panes if self._dn is not None else {}

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
        self._cur = NO_PANE

    def _locate(self, ts: float) -> tuple[dict | None, float, float]:
        """The groups of the time pane holding `ts` (None if too late) and the times that pane
        holds, `lo <= time < hi` (a bound that misses every time when not cached)."""
        pane_u = self._pane_u
        p = math.floor(ts * 1000) // pane_u
        groups = self._pane(p)
        if groups is None:
            return NO_PANE
        self._loc_p = p
        a = p * pane_u
        b = a + pane_u
        if not -EXACT_U < a < b < EXACT_U:
            return groups, math.inf, -math.inf  # not cached: each reading is computed
        lo, hi = pane_bound(a), pane_bound(b)
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

    def _group_bytes(self, key: Any) -> int:
        if self._bare:
            return self._state_bytes + sys.getsizeof(key)
        return self._state_bytes + sum(sys.getsizeof(k) for k in key)

    def _drop_bytes(self, p: int, groups: dict) -> None:
        """Uncount a closed pane's groups: its recorded bytes, or its keys sized again."""
        nb = self._pane_nb.pop(p, None) if self._pane_nb else None
        self._bytes -= self._pane_bytes(groups) if nb is None else nb

    def _pane_bytes(self, groups: dict) -> int:
        """The `_group_bytes` of every group of a pane, summed."""
        if self._bare:
            return len(groups) * self._state_bytes + sum(map(sys.getsizeof, groups))
        return sum(map(self._group_bytes, groups))

    def _new_state(self, key: Any, groups_in_pane: int) -> None:
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
