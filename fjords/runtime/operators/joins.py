"""Joins: symmetric hash join of two streams, index join of a stream with a static table, the
zipper join of two sensor streams on sample time (paper Figure 4), and the zipper in merge mode
(UNION ALL of streams in sample-time order).

Joined tuples are `left + right` (the right side's fields after the left's); a missing partner
in an outer result is padded with None.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections import deque
from collections.abc import Callable
from typing import Any

from fjords.runtime.operators.base import Operator
from fjords.runtime.operators.scan import TableScan
from fjords.runtime.progress import Watermark
from fjords.runtime.queues import PullQueue, Queue

log = logging.getLogger(__name__)

KeyFn = Callable[[tuple], object]


class SymmetricHashJoin(Operator):
    """Non-blocking equi-join of two streams (Wilschut & Apers): each tuple is hashed into its
    side's table and probes the other's, so a joined tuple is output as soon as both partners
    are present, never after the end of an input (paper section 3.1.3).

    Two ways to say which tuples may still join:

    - `window` (seconds): a sliding band. The cleaner evicts tuples older than the slower
      watermark minus `window` whenever a table passes `fill_threshold` entries or a watermark
      arrives, so memory stays bounded by the window, not the stream.
    - `tumbling` (seconds): the SQL stream-stream join. Tuples join only within the same
      tumbling window (aligned to multiples of `tumbling` since the epoch, in milliseconds as
      the window aggregates align theirs): the window index is part of the hash key. A window's
      tuples are evicted once both watermarks pass its end; a tuple of a window already
      evicted is late (dropped, counted in `late`). A side holding more than `fill_threshold`
      tuples although the watermarks have not moved loses its oldest window (dropped, counted
      in `dropped`, logged the first time), so memory stays bounded whatever the inputs do.

    `residual` filters joined tuples; with `stamp` a joined tuple ends with its sample time, the
    later of its two partners' times (what downstream windows and progress go by). Keys that
    are NULL (or hold one) never join, as in SQL.
    """

    kind = "symmetric_hash_join"

    def __init__(
        self,
        left: Queue,
        right: Queue,
        output: Queue,
        *,
        left_key: KeyFn,
        right_key: KeyFn,
        left_time: int,
        right_time: int,
        window: float = math.inf,
        fill_threshold: int = 100_000,
        tumbling: float | None = None,
        residual: Callable[[tuple], bool] | None = None,
        stamp: bool = False,
        **kw: Any,
    ) -> None:
        super().__init__([left, right], [output], **kw)
        self.keys = (left_key, right_key)
        self.times = (left_time, right_time)
        self.window = window
        self.fill_threshold = fill_threshold
        self.tables: tuple[dict[object, deque], dict[object, deque]] = ({}, {})
        self.sizes = [0, 0]
        self.evicted = 0
        self._watermarks = [-math.inf, -math.inf]
        self.residual = residual
        self.stamp = stamp
        self.tumbling_ms = None if tumbling is None else round(tumbling * 1000)
        if self.tumbling_ms is not None and self.tumbling_ms < 1:
            raise ValueError("a tumbling join window must be at least 1 millisecond")
        self.late = 0  # tuples of a window already evicted (tumbling)
        self.dropped = 0  # tuples evicted before their window closed: a side was full
        self.null_keys = 0  # tuples whose key is NULL: they join nothing (SQL), not a loss
        self._window_keys: dict[int, set[object]] = {}  # window index -> its hash keys
        self._open_from = -math.inf  # the first window index not yet evicted
        self._forwarded = -math.inf

    def transition(self) -> bool:
        did = False
        half = max(1, self.batch // 2)
        out = self.outputs[0]
        # A tuple may join many: stop reading while the output is half full, so the consumer
        # runs first (the scheduler comes back: the input still holds) and nothing is dropped.
        room = getattr(out, "bound", math.inf) // 2
        for side in (0, 1):
            q = self.inputs[side]
            for _ in range(half):
                if len(out) >= room:
                    break
                item = q.get()
                if item is None:
                    break
                did = True
                if item.__class__ is tuple:
                    if self.tumbling_ms is None:
                        self._insert_probe(side, item)
                    else:
                        self._insert_probe_tumbling(side, item)
                elif item.__class__ is Watermark:
                    self._watermarks[side] = max(self._watermarks[side], item.time)
                    self.clean()
                    self._forward_progress()
        return did

    def _insert_probe(self, side: int, t: tuple) -> None:
        self.tuples_in += 1
        key = self.keys[side](t)
        if _has_null(key):
            self.null_keys += 1
            return
        table = self.tables[side]
        bucket = table.get(key)
        if bucket is None:
            bucket = table[key] = deque()
        bucket.append(t)
        self.sizes[side] += 1
        other = self.tables[1 - side].get(key)
        if other:
            self._emit_pairs(side, t, other)
        if self.sizes[side] > self.fill_threshold:
            self.clean()

    def _insert_probe_tumbling(self, side: int, t: tuple) -> None:
        self.tuples_in += 1
        w = math.floor(t[self.times[side]] * 1000) // self.tumbling_ms
        if w < self._open_from:
            self.late += 1
            if self.late == 1:
                log.warning(
                    "%s: a tuple of a join window already closed was dropped (late); "
                    "counted in its `late`",
                    self.name,
                )
            return
        k = self.keys[side](t)
        if _has_null(k):
            self.null_keys += 1
            return
        key = (w, k)
        table = self.tables[side]
        bucket = table.get(key)
        if bucket is None:
            bucket = table[key] = deque()
            keys = self._window_keys.get(w)
            if keys is None:
                keys = self._window_keys[w] = set()
            keys.add(key)
        bucket.append(t)
        self.sizes[side] += 1
        other = self.tables[1 - side].get(key)
        if other:
            self._emit_pairs(side, t, other)
        if self.sizes[side] > self.fill_threshold:
            self.clean()
            while self.sizes[side] > self.fill_threshold and self._window_keys:
                self._evict_window(min(self._window_keys), lost=True)

    def _emit_pairs(self, side: int, t: tuple, partners: deque) -> None:
        out, residual = self.outputs[0], self.residual
        lt, rt = self.times
        for o in partners:
            joined = t + o if side == 0 else o + t
            if self.stamp:
                a, b = joined[lt], joined[len(o if side == 1 else t) + rt]
                joined += (a if a >= b else b,)
            if residual is None or residual(joined):
                out.put(joined)
                self.tuples_out += 1

    def clean(self) -> None:
        """Evict tuples that can no longer join: older than min(watermarks) - window, or
        (tumbling) in a window both watermarks have passed."""
        if self.tumbling_ms is not None:
            horizon = min(self._watermarks)
            if horizon == -math.inf:
                return
            # window w ends at (w + 1) * tumbling_ms milliseconds: closed when horizon >= end
            closed = math.floor(horizon * 1000) // self.tumbling_ms if horizon < math.inf else None
            for w in sorted(self._window_keys):
                if closed is not None and w >= closed:
                    break
                self._evict_window(w, lost=False)
            self._open_from = max(self._open_from, closed if closed is not None else math.inf)
            return
        horizon = min(self._watermarks) - self.window
        if horizon == -math.inf:
            return
        for side in (0, 1):
            ti = self.times[side]
            table = self.tables[side]
            for key in list(table):
                bucket = table[key]
                while bucket and bucket[0][ti] < horizon:
                    bucket.popleft()
                    self.sizes[side] -= 1
                    self.evicted += 1
                if not bucket:
                    del table[key]

    def _evict_window(self, w: int, *, lost: bool) -> None:
        """Forget window `w` on both sides; `lost`: before it closed (a full side)."""
        n = 0
        for key in self._window_keys.pop(w, ()):
            for side in (0, 1):
                bucket = self.tables[side].pop(key, None)
                if bucket:
                    self.sizes[side] -= len(bucket)
                    n += len(bucket)
        self.evicted += n
        if lost:
            self._open_from = max(self._open_from, w + 1)
            self.dropped += n
            if self.dropped == n and n:
                log.warning(
                    "%s: a side holds more than %d tuples; its oldest window was dropped "
                    "before it closed (counted in `dropped`)",
                    self.name,
                    self.fill_threshold,
                )

    def _forward_progress(self) -> None:
        wm = min(self._watermarks)
        if wm > self._forwarded:
            self._forwarded = wm
            self.emit(Watermark(wm))

    def release_state(self) -> None:
        """Drop every held tuple (the query using it failed or ended)."""
        for table in self.tables:
            table.clear()
        self._window_keys.clear()
        self.sizes = [0, 0]

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "held": {"left": self.sizes[0], "right": self.sizes[1]},
            "fill_threshold": self.fill_threshold,
            "evicted": self.evicted,
            "dropped": self.dropped,
            "late": self.late,
            **({"tumbling_s": self.tumbling_ms / 1000} if self.tumbling_ms is not None else {}),
        }


class IndexJoin(Operator):
    """Join a stream with a static table pulled through a pull queue.

    The table is pulled (its scan runs only when asked) into a hash index on the join key the
    first time a stream tuple needs it, and again whenever the table's version changes (a reloaded
    file). Each stream tuple then probes the index; `residual` filters the joined tuple (it may
    read NOW, e.g. the window end). `outer` keeps stream tuples without a match, padded with None.
    """

    kind = "index_join"

    def __init__(
        self,
        stream: Queue,
        table: PullQueue,
        output: Queue,
        *,
        stream_key: KeyFn,
        table_key: KeyFn,
        table_width: int,
        residual: Callable[[tuple], bool] | None = None,
        outer: bool = False,
        **kw: Any,
    ) -> None:
        super().__init__([stream, table], [output], **kw)
        self.stream_key = stream_key
        self.table_key = table_key
        self.residual = residual
        self.outer = outer
        self._pad = (None,) * table_width
        self._index: dict[object, list[tuple]] | None = None
        self._version: int | None = None

    def has_input(self) -> bool:
        return bool(len(self.inputs[0]))

    def _scan(self) -> TableScan | None:
        producer = getattr(self.inputs[1], "producer", None)
        return producer if isinstance(producer, TableScan) else None

    def _ensure_index(self) -> dict[object, list[tuple]]:
        scan = self._scan()
        if scan is not None and self._index is not None and scan.table.version != self._version:
            self._index = None  # the table was reloaded: pull it again
            scan.rewind()
        if self._index is None:
            index: dict[object, list[tuple]] = {}
            q = self.inputs[1]
            while (row := q.get()) is not None:
                if row.__class__ is tuple:
                    key = self.table_key(row)
                    if not _has_null(key):  # NULL never equals anything, not even NULL
                        index.setdefault(key, []).append(row)
            self._index = index
            self._version = scan.table.version if scan is not None else None
        return self._index

    def transition(self) -> bool:
        q = self.inputs[0]
        items = q.get_batch(self.batch)
        if not items:
            return False
        index = self._ensure_index()
        out, residual, key_fn = self.outputs[0], self.residual, self.stream_key
        for item in items:
            if item.__class__ is not tuple:
                out.put(item)
                continue
            t: tuple = item
            self.tuples_in += 1
            matched = False
            for row in index.get(key_fn(t), ()):
                joined = t + row
                if residual is None or residual(joined):
                    out.put(joined)
                    self.tuples_out += 1
                    matched = True
            if self.outer and not matched:
                out.put(t + self._pad)
                self.tuples_out += 1
        return True


def _has_null(key: object) -> bool:
    return key is None or (key.__class__ is tuple and None in key)


class ZipperJoin(Operator):
    """Zip two time-ordered sensor streams: pair samples whose times differ by at most `band`.

    A sample whose partner has not arrived by the time the other stream has passed its time plus
    `band` is output with None for the partner (the outer join at the end of the band, Figure 4).
    """

    kind = "zipper_join"

    def __init__(
        self,
        left: Queue,
        right: Queue,
        output: Queue,
        *,
        left_time: int,
        right_time: int,
        left_width: int,
        right_width: int,
        band: float,
        **kw: Any,
    ) -> None:
        super().__init__([left, right], [output], **kw)
        self.times = (left_time, right_time)
        self.pads = ((None,) * left_width, (None,) * right_width)
        self.band = band
        self.buffers: tuple[deque, deque] = (deque(), deque())
        self.progress = [-math.inf, -math.inf]
        self.unmatched = 0

    def transition(self) -> bool:
        did = False
        for side in (0, 1):
            for item in self.inputs[side].get_batch(self.batch):
                did = True
                if item.__class__ is tuple:
                    self.tuples_in += 1
                    self.buffers[side].append(item)
                    t = item[self.times[side]]
                    if t > self.progress[side]:
                        self.progress[side] = t
                elif item.__class__ is Watermark:
                    self.progress[side] = max(self.progress[side], item.time)
        if did:
            self._zip()
        return did

    def _zip(self) -> None:
        left, right = self.buffers
        lt, rt = self.times
        band, out = self.band, self.outputs[0]
        while left and right:
            a, b = left[0][lt], right[0][rt]
            if abs(a - b) <= band:
                out.put(left.popleft() + right.popleft())
            elif a < b:
                out.put(left.popleft() + self.pads[1])
                self.unmatched += 1
            else:
                out.put(self.pads[0] + right.popleft())
                self.unmatched += 1
            self.tuples_out += 1
        # One side is empty: its partner-less heads expire once the other side has moved past.
        while left and self.progress[1] > left[0][lt] + band:
            out.put(left.popleft() + self.pads[1])
            self.unmatched += 1
            self.tuples_out += 1
        while right and self.progress[0] > right[0][rt] + band:
            out.put(self.pads[0] + right.popleft())
            self.unmatched += 1
            self.tuples_out += 1


class ZipperMerge(Operator):
    """Merge mode of the zipper: UNION ALL of n inputs, output in sample-time order.

    Each input's rows carry their time at `times[i]` and are cut to their first `width`
    fields on output (a branch may carry its time as a hidden last column). Rows need not
    arrive in time order (a stream's sensors interleave): they are held in one heap and a row
    at time t is output once every input's watermark has reached t (an input's watermark w
    promises no more rows before w, as the stream router's does), so what comes out never goes
    back in time. The watermark that follows is the least of the inputs'.

    An input whose `idle[i]()` is true (its stream has no sensor holding its progress: none
    yet, or all quiet) is not waited for, as an idle sensor does not hold a stream back; when
    every input is idle, rows up to the furthest watermark go.

    Memory is bounded: past `max_held` rows the earliest is output without waiting (`forced`);
    a row that arrives after that with a time before the last output one would break the order,
    so it is dropped (`dropped`, logged the first time), as a late sample is.
    """

    kind = "zipper_merge"

    def __init__(
        self,
        inputs: list[Queue],
        output: Queue,
        *,
        times: list[int],
        width: int,
        max_held: int = 100_000,
        idle: list[Callable[[], bool]] | None = None,
        **kw: Any,
    ) -> None:
        if len(times) != len(inputs):
            raise ValueError("one time index per input")
        self.idle = idle
        super().__init__(inputs, [output], **kw)
        self.times = list(times)
        self.width = width
        self.max_held = max(1, max_held)
        self.held: list[tuple[float, int, tuple]] = []  # (time, arrival, row): a heap
        self.progress = [-math.inf] * len(inputs)
        self.last_time = -math.inf  # time of the last row output
        self._out_mark = -math.inf
        self._arrivals = 0
        self.forced = 0
        self.dropped = 0

    def transition(self) -> bool:
        did = False
        held, progress = self.held, self.progress
        for i, q in enumerate(self.inputs):
            ti = self.times[i]
            for item in q.get_batch(self.batch):
                did = True
                if item.__class__ is tuple:
                    self.tuples_in += 1
                    t = item[ti]
                    if t is None or t != t or t < self.last_time:  # no time, NaN, or too late
                        self._drop(t)
                        continue
                    self._arrivals += 1
                    heapq.heappush(held, (t, self._arrivals, item))
                elif item.__class__ is Watermark:
                    if item.time > progress[i]:
                        progress[i] = item.time
        if did:
            self._release()
        return did

    def _bound(self) -> float:
        """The time up to which every input has promised its rows (idle inputs aside)."""
        if self.idle is None:
            return min(self.progress)
        waiting = [p for p, idle in zip(self.progress, self.idle, strict=True) if not idle()]
        return min(waiting) if waiting else max(self.progress)

    def _release(self) -> None:
        held, out, width = self.held, self.outputs[0], self.width
        bound = self._bound()
        rows: list[tuple] = []
        while held and held[0][0] <= bound:
            t, _, row = heapq.heappop(held)
            rows.append(row[:width])
            self.last_time = t
        while len(held) > self.max_held:
            t, _, row = heapq.heappop(held)
            rows.append(row[:width])
            self.last_time = t
            self.forced += 1
            if self.forced == 1:
                log.warning(
                    "%s: more than %d rows waiting for a slow input; outputting the earliest "
                    "without waiting (later rows of that input before them will be dropped)",
                    self.name,
                    self.max_held,
                )
        self.tuples_out += len(rows)
        for r in rows:
            out.put(r)
        mark = min(bound, held[0][0]) if held else bound
        if mark > self._out_mark:
            self._out_mark = mark
            out.put(Watermark(mark))

    def _drop(self, t: object) -> None:
        self.dropped += 1
        if self.dropped == 1:
            log.warning(
                "%s: dropped a row at time %r, before the last row output (%r) or without a time",
                self.name,
                t,
                self.last_time,
            )

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "inputs": len(self.inputs),
            "held": len(self.held),
            "forced": self.forced,
            "dropped": self.dropped,
        }

    def release_state(self) -> None:
        self.held.clear()
