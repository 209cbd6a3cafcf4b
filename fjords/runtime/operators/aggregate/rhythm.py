"""`RowRhythmAggregate`: CSQL's tuple frequency, `EMIT EVERY n ROWS [PARTITIONED BY col]` on a
`[RANGE r]` aggregate ("mixed jumping windows").

Each time a partition (the PARTITIONED BY column's value; without it, the whole query input)
has received n more readings, at its n-th, 2n-th, ... reading, of time t, the partition's
groups are emitted over `(t - r, t]` with `window_start = t - r`, `window_end = t`.

Exact with panes, never by keeping readings: a pane is the partial aggregate (`state.py`) of
the readings of one partition and group at one sample time, so any `(t - r, t]` is a merge of
whole panes whatever t is; a sensor's readings at one time fold into one pane. An emission
waits for the stream's watermark to pass t (every reading at or before t has arrived, from
every sensor of the partition), then goes out in time order; panes older than every pending
emission's window are dropped. As a window aggregate, it counts its groups and state against
the limits, and emits at most `max_windows_per_transition` outputs per transition.
"""

from __future__ import annotations

import heapq
import math
import sys
from bisect import bisect_right, insort
from collections.abc import Callable, Sequence
from typing import Any

from fjords.limits import DEFAULT_LIMITS, Limits
from fjords.runtime.operators.aggregate.state import (
    AggSpec,
    finisher,
    merge_state,
    new_state,
    updater,
)
from fjords.runtime.operators.base import Operator
from fjords.runtime.progress import Watermark
from fjords.runtime.queues import Queue

_WHOLE = object()  # the partition of every reading (no PARTITIONED BY)


class RowRhythmAggregate(Operator):
    """Output rows are `key + aggregates + (window_start, window_end)`, as a WindowAggregate's
    (a Finish applies HAVING and the SELECT list)."""

    kind = "row_rhythm_aggregate"
    __slots__ = (
        "_backlog",
        "_counts",
        "_due",
        "_finish",
        "_held",
        "_key_fn",
        "_n_slots",
        "_panes",
        "_part_index",
        "_seq",
        "_state_bytes",
        "_states",
        "_times",
        "_update",
        "every",
        "limits",
        "range_s",
        "time_index",
        "windows_emitted",
    )

    def __init__(
        self,
        input: Queue,
        output: Queue,
        *,
        key_fn: Callable[[tuple], tuple],
        arg_fns: Sequence[Callable[[tuple], object]],
        specs: Sequence[AggSpec],
        time_index: int,
        range_s: float,
        every: int,
        partition_index: int | None,
        limits: Limits = DEFAULT_LIMITS,
        **kw: Any,
    ) -> None:
        super().__init__([input], [output], **kw)
        self._key_fn = key_fn
        self._update = updater(list(arg_fns))
        self._n_slots = len(arg_fns)
        self._finish = finisher(list(specs))
        self.time_index = time_index
        self.range_s = range_s
        self.every = every
        self._part_index = partition_index
        self._counts: dict[object, int] = {}
        # time -> partition -> group key -> state; `_times` sorted
        self._panes: dict[float, dict[object, dict[tuple, list]]] = {}
        self._times: list[float] = []
        self._due: list[tuple[float, int, object]] = []  # (t, arrival, partition): a heap
        self._seq = 0
        self._held: float | None = None  # a watermark whose outputs are not all out yet
        self._backlog: list[object] = []  # the items behind it
        self.limits = limits
        self._states = 0
        self._state_bytes = sys.getsizeof(new_state(self._n_slots)) + 100  # and its key, entry
        self.windows_emitted = 0

    def has_input(self) -> bool:
        return self._held is not None or bool(self._backlog) or super().has_input()

    def transition(self) -> bool:
        if self._held is not None:  # outputs cut short: out first, nothing newer before them
            self._release(self._held)
            return True
        items = self._backlog or self.inputs[0].get_batch(self.batch)
        self._backlog = []
        if not items:
            return False
        for i, item in enumerate(items):
            if item.__class__ is tuple:
                self._add(item)
            elif item.__class__ is Watermark:
                self._release(item.time)
                if self._held is not None:
                    self._backlog = items[i + 1 :]
                    break
        return True

    def _add(self, t: tuple) -> None:
        self.tuples_in += 1
        ts = t[self.time_index]
        if ts is None or ts != ts:  # no time: in no window
            return
        part = _WHOLE if self._part_index is None else t[self._part_index]
        pane = self._panes.get(ts)
        if pane is None:
            pane = self._panes[ts] = {}
            insort(self._times, ts)
        groups = pane.get(part)
        if groups is None:
            groups = pane[part] = {}
        key = self._key_fn(t)
        st = groups.get(key)
        if st is None:
            st = groups[key] = new_state(self._n_slots)
            self._states += 1
            if self._states * self._state_bytes > self.limits.max_state_bytes_per_query:
                self.limits.check(
                    "max_state_bytes_per_query",
                    self._states * self._state_bytes,
                    f"{self.name}: estimated bytes of its panes",
                )
        self._update(st, t)
        c = self._counts.get(part, 0) + 1
        if c == self.every:
            c = 0
            heapq.heappush(self._due, (ts, self._seq, part))
            self._seq += 1
        self._counts[part] = c

    def _release(self, mark: float) -> None:
        """Emit every due window whose end the watermark has passed (all of them at the end
        of input), in time order, then drop the panes no pending window reaches."""
        due = self._due
        budget = self.limits.max_windows_per_transition
        self._held = None
        while due and (due[0][0] < mark or mark == math.inf):
            if budget <= 0:
                self._held = mark
                return
            end, _, part = heapq.heappop(due)
            self._emit(part, end)
            budget -= 1
        if mark == math.inf:
            self._panes.clear()
            self._times.clear()
            self._states = 0
            self.emit(Watermark(mark))
            return
        oldest = min(mark, due[0][0]) - self.range_s if due else mark - self.range_s
        cut = bisect_right(self._times, oldest)  # panes at or before it are in no window
        for ts in self._times[:cut]:
            self._states -= sum(map(len, self._panes.pop(ts).values()))
        del self._times[:cut]

    def _emit(self, part: object, end: float) -> None:
        start = end - self.range_s
        times = self._times
        merged: dict[tuple, list] = {}
        for i in range(bisect_right(times, start), bisect_right(times, end)):
            groups = self._panes[times[i]].get(part)
            if not groups:
                continue
            for key, st in groups.items():
                acc = merged.get(key)
                if acc is None:
                    merged[key] = list(st)
                else:
                    merge_state(acc, st)
        if len(merged) > self.limits.max_groups_per_window:
            self.limits.check(
                "max_groups_per_window", len(merged), f"{self.name}: groups in a window"
            )
        self.windows_emitted += 1
        fin, out = self._finish, self.outputs[0]
        for key, st in merged.items():
            out.put((*key, *fin(st), start, float(end)))
            self.tuples_out += 1

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "range": self.range_s,
            "emit_every_rows": self.every,
            "partitioned_by_index": self._part_index,
            "window": "(t - range, t] at each partition's n-th, 2n-th, ... reading",
            "panes": len(self._times),
        }
