"""`ChangesAggregate`: `EMIT CHANGES [EVERY d | EVERY n ROWS]`, a window's aggregate while it
is open (early rows, `final` false) and at its close (`final` true); without a window, online
aggregation over everything since the query began.

Every `d` of event time: readings wait in buckets of `d` (aligned to the epoch, so to every
window's start: `d` divides the RANGE and the SLIDE) until the stream's watermark passes the
bucket's end; then the bucket's readings are added, in arrival order, to the windows holding
it (so a replay in time order sums them as a plain window does, to the bit) and each open window
outputs its groups as of that instant (`as_of`, exclusive), the last instant of a window
being its end (the final row). A reading is thus counted in the rows of exactly the instants
after it, whatever order the sensors' readings arrive in. Every `n` rows: the readings go
straight into their windows, and a window's `n`-th, `2n`-th ... row outputs its groups,
`as_of` being that row's time; its final row comes at its close, as today's.

Its own state, not the shared `WindowAggregate`'s: early rows from the shared window would need
its panes cut at every `d` (a plain query's window would then be merged from more panes, its
floating-point sums no longer exactly today's), and its open pane already holds readings after
the instant (from sensors ahead). The state algebra (`state`) is the same, so the final rows are
the numbers a plain query gives (bit for bit where readings arrive in time order).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

from fjords.limits import DEFAULT_LIMITS, Limits
from fjords.runtime.operators.aggregate.state import (
    AggSpec,
    Finalize,
    Fn,
    finisher,
    new_state,
    updater,
)
from fjords.runtime.operators.base import Operator
from fjords.runtime.progress import Watermark
from fjords.runtime.queues import Queue

log = logging.getLogger(__name__)

#: Rhythm instants handled per transition (a watermark jumping far ahead over a short EVERY
#: is gone through a slice at a time; the rest waits for the next transition).
INSTANTS_PER_TRANSITION = 4096

_ONE = 0  # the one "window" of online aggregation


class ChangesAggregate(Operator):
    """Grouped aggregation with early rows. Output rows are `key + aggregates + (window_start,
    window_end, final, as_of)` through `finalize` (HAVING, SELECT list); without a window
    `range_s` is None and the window bounds are None."""

    kind = "changes_aggregate"

    def __init__(
        self,
        input: Queue,
        output: Queue,
        *,
        key_fn: Callable[[tuple], tuple],
        arg_fns: Sequence[Fn],
        specs: Sequence[AggSpec],
        time_index: int,
        range_s: float | None,
        slide_s: float | None,
        every_s: float | None,
        every_rows: int | None,
        finalize: Finalize,
        start_time: float = -math.inf,
        limits: Limits = DEFAULT_LIMITS,
        **kw: Any,
    ) -> None:
        super().__init__([input], [output], **kw)
        self.limits = limits
        self.key_fn, self.specs, self.time_index = key_fn, tuple(specs), time_index
        self.range_s, self.slide_s = range_s, slide_s
        self.every_s, self.every_rows = every_s, every_rows
        self.finalize, self.start_time = finalize, start_time
        self._n_slots = len(arg_fns)
        self._update = updater(arg_fns)
        self._finish = finisher(self.specs)
        self._range_ms = None if range_s is None else round(range_s * 1000)
        self._slide_ms = None if slide_s is None else round(slide_s * 1000)
        self._every_ms = None if every_s is None else round(every_s * 1000)
        self._buckets: dict[int, list[tuple]] = {}  # EVERY d: readings not yet counted
        self._next_b: int | None = None  # the first bucket not yet folded (EVERY d)
        self._windows: dict[int, dict[tuple, list]] = {}  # window number -> groups
        self._counts: dict[int, int] = {}  # EVERY n ROWS: rows per window
        self._closed_to = -math.inf  # windows ending by then are out (EVERY n ROWS)
        self._pending: float | None = None  # a watermark gone through part way
        self._held: list = []  # what came behind it
        self.late = 0
        self.early_rows = 0
        self.final_rows = 0

    # -- input --------------------------------------------------------------------------------
    def has_input(self) -> bool:
        return self._pending is not None or bool(self._held) or super().has_input()

    def transition(self) -> bool:
        if self._pending is not None and not self._advance(self._pending):
            return True
        items = self.inputs[0].get_batch(self.batch)
        if not items:
            return False
        for i, item in enumerate(items):
            if item.__class__ is tuple:
                self._add(item)
            elif item.__class__ is Watermark and not self._advance(item.time):
                self._held = items[i + 1 :]  # after the rest of this mark, in order
                break
        return True

    def _add(self, t: tuple) -> None:
        self.tuples_in += 1
        ts = t[self.time_index]
        if self._range_ms is None and ts < self.start_time:
            return  # online aggregation counts from the query's start
        if self._every_ms is not None:
            b = math.floor(ts * 1000) // self._every_ms
            if self._next_b is not None and b < self._next_b:
                self._late()
                return
            waiting = self._buckets.get(b)
            if waiting is None:
                self._buckets[b] = [t]
            else:
                waiting.append(t)
            return
        key = self.key_fn(t)
        ks = self._windows_of(math.floor(ts * 1000)) if self._range_ms is not None else [_ONE]
        ks = [k for k in ks if self._end_s(k) > self._closed_to]
        if not ks:
            self._late()
            return
        n = self.every_rows
        for k in ks:
            groups = self._windows.get(k)
            if groups is None:
                groups = self._windows[k] = {}
            st = self._into(groups, key, t)
            c = self._counts[k] = self._counts.get(k, 0) + 1
            if n is None:  # every change: the group that changed
                self._out(k, {key: st}, ts, False)
            elif c % n == 0:
                self._out(k, groups, ts, False)

    def _into(self, groups: dict[tuple, list], key: tuple, t: tuple) -> list:
        st = groups.get(key)
        if st is None:
            self._new_group(len(groups) + 1)
            st = groups[key] = new_state(self._n_slots)
        self._update(st, t)
        return st

    def _new_group(self, n: int) -> None:
        """A window (or the online aggregate) holds no more groups than the limit: past it the
        query fails, as a plain window does."""
        if n > self.limits.max_groups_per_window:
            self.limits.check("max_groups_per_window", n, f"{self.name}: groups in a window")

    def _late(self) -> None:
        if not self.late:
            log.warning("%s: a reading behind the rows already out is dropped (late)", self.name)
        self.late += 1

    # -- windows ------------------------------------------------------------------------------
    def _windows_of(self, ms: int) -> list[int]:
        """The windows holding event time `ms` that start at or after the query did."""
        rng, sl = self._range_ms, self._slide_ms
        assert rng is not None and sl is not None
        hi = ms // sl
        lo = (ms - rng) // sl + 1
        return [k for k in range(lo, hi + 1) if not k * sl / 1000 < self.start_time]

    def _start_s(self, k: int) -> float | None:
        return None if self._slide_ms is None else k * self._slide_ms / 1000

    def _end_s(self, k: int) -> float:
        if self._slide_ms is None or self._range_ms is None:
            return math.inf
        return (k * self._slide_ms + self._range_ms) / 1000

    def _out(self, k: int, groups: dict[tuple, list], as_of: float, final: bool) -> None:
        ws, we = self._start_s(k), (self._end_s(k) if self._range_ms is not None else None)
        fin, finalize, put = self._finish, self.finalize, self.outputs[0].put
        n = 0
        for key, st in groups.items():
            row = finalize((*key, *fin(st), ws, we, final, as_of))
            if row is not None:
                put(row)
                n += 1
        self.tuples_out += n
        if final:
            self.final_rows += n
        else:
            self.early_rows += n

    # -- progress -----------------------------------------------------------------------------
    def _advance(self, mark: float) -> bool:
        """Everything before `mark` has arrived: the instants up to it go out. False when cut
        short (the rest goes on next transition)."""
        self._pending = None
        done = self._instants(mark) if self._every_ms is not None else self._close_rows(mark)
        if not done:
            self._pending = mark
            return False
        held, self._held = self._held, []
        for i, item in enumerate(held):  # what came behind a mark cut short, in order
            if item.__class__ is tuple:
                self._add(item)
            elif item.__class__ is Watermark and not self._advance(item.time):
                self._held = held[i + 1 :] + self._held
                return False
        return True

    def _close_rows(self, mark: float) -> bool:
        """EVERY n ROWS (or every change): windows ending by `mark` output their final rows
        (online aggregation has no close)."""
        if self._range_ms is None:
            return True
        for k in sorted(self._windows):
            if self._end_s(k) > mark:
                break
            groups = self._windows.pop(k)
            self._counts.pop(k, None)
            self._out(k, groups, self._end_s(k), True)
        self._closed_to = max(self._closed_to, mark)
        return True

    def _instants(self, mark: float) -> bool:
        """EVERY d: each instant `(b + 1) * d` at or before `mark`: bucket `b` is counted, then
        every open window outputs its groups as of the instant (final at its end)."""
        every = self._every_ms
        assert every is not None
        mark_ms = mark * 1000
        online = self._range_ms is None
        for _ in range(INSTANTS_PER_TRANSITION):
            if self._next_b is None:
                if not self._buckets:
                    if mark != math.inf:  # nothing yet: what comes behind the mark is late
                        self._next_b = math.floor(mark_ms) // every
                    return True
                self._next_b = min(self._buckets)
            b = self._next_b
            if (b + 1) * every > mark_ms:
                return True
            # an instant with nothing new and nothing open says nothing; nor, at the end of
            # the input, does online aggregation's past its last reading
            if b not in self._buckets and (not self._windows or (online and mark == math.inf)):
                if not self._buckets:
                    if mark != math.inf:
                        self._next_b = max(b + 1, math.floor(mark_ms) // every)
                    return True
                self._next_b = min(self._buckets)
                continue
            waiting = self._buckets.pop(b, None)
            if waiting:
                for k in self._windows_of(b * every) if not online else [_ONE]:
                    acc = self._windows.get(k)
                    if acc is None:
                        acc = self._windows[k] = {}
                    into, keyf = self._into, self.key_fn
                    for t in waiting:  # in arrival order, as a plain window adds them
                        into(acc, keyf(t), t)
            x = (b + 1) * every
            for k in sorted(self._windows):
                final = not online and k * self._slide_ms + self._range_ms == x  # type: ignore[operator]
                if final:
                    self._out(k, self._windows.pop(k), x / 1000, True)
                else:
                    self._out(k, self._windows[k], x / 1000, False)
            self._next_b = b + 1
        return False

    def describe(self) -> dict[str, Any]:
        if self.every_s is not None:
            rhythm = f"every {self.every_s:g} s of event time"
        elif self.every_rows is not None:
            rhythm = f"every {self.every_rows} rows of a window"
        else:
            rhythm = "every change"
        return {
            **super().describe(),
            "range": self.range_s,
            "slide": self.slide_s,
            "unit": "seconds",
            "emit": f"changes {rhythm}, final at the window's close"
            if self.range_s is not None
            else f"changes {rhythm} (online aggregation since the query began)",
            "aggregates": [
                s.label or f"{s.func}({'*' if s.slot is None else s.slot})" for s in self.specs
            ],
            "early_rows": self.early_rows,
            "final_rows": self.final_rows,
            "late": self.late,
        }
