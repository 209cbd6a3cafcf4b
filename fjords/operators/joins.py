"""Joins: symmetric hash join of two streams, index join of a stream with a static table, and the
zipper join of two sensor streams on sample time (paper Figure 4).

Joined tuples are `left + right` (the right side's fields after the left's); a missing partner
in an outer result is padded with None.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

from fjords.operators.base import Operator
from fjords.operators.scan import TableScan
from fjords.progress import Watermark
from fjords.queues import PullQueue, Queue

KeyFn = Callable[[tuple], object]


class SymmetricHashJoin(Operator):
    """Non-blocking equi-join of two streams (Wilschut & Apers), each side kept for `window` seconds.

    A tuple is hashed into its side's table and probes the other. The cleaner evicts tuples older
    than the newest watermark minus `window` whenever a table passes `fill_threshold` entries or a
    watermark arrives, so memory stays bounded by the window, not the stream.
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
        window: float,
        fill_threshold: int = 100_000,
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

    def transition(self) -> bool:
        did = False
        half = max(1, self.batch // 2)
        for side in (0, 1):
            q = self.inputs[side]
            for _ in range(half):
                item = q.get()
                if item is None:
                    break
                did = True
                if item.__class__ is tuple:
                    self._insert_probe(side, item)  # type: ignore[arg-type]
                elif item.__class__ is Watermark:
                    self._watermarks[side] = max(self._watermarks[side], item.time)  # type: ignore[attr-defined]
                    self.clean()
                    self._forward_progress()
        return did

    def _insert_probe(self, side: int, t: tuple) -> None:
        self.tuples_in += 1
        key = self.keys[side](t)
        if key is None:
            return
        table = self.tables[side]
        bucket = table.get(key)
        if bucket is None:
            bucket = table[key] = deque()
        bucket.append(t)
        self.sizes[side] += 1
        other = self.tables[1 - side].get(key)
        if other:
            out = self.outputs[0]
            for o in other:
                out.put(t + o if side == 0 else o + t)
                self.tuples_out += 1
        if self.sizes[side] > self.fill_threshold:
            self.clean()

    def clean(self) -> None:
        """Evict tuples that can no longer join: older than min(watermarks) - window."""
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

    def _forward_progress(self) -> None:
        wm = min(self._watermarks)
        if wm > -math.inf:
            self.emit(Watermark(wm))


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
                    key = self.table_key(row)  # type: ignore[arg-type]
                    if not _has_null(key):  # NULL never equals anything, not even NULL
                        index.setdefault(key, []).append(row)
            self._index = index
            self._version = scan.table.version if scan is not None else None
        return self._index

    def transition(self) -> bool:
        q = self.inputs[0]
        items = q.get_batch(self.batch)  # type: ignore[attr-defined]
        if not items:
            return False
        index = self._ensure_index()
        out, residual, key_fn = self.outputs[0], self.residual, self.stream_key
        for item in items:
            if item.__class__ is not tuple:
                out.put(item)
                continue
            t: tuple = item  # type: ignore[assignment]
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
    return key is None or (key.__class__ is tuple and None in key)  # type: ignore[operator]


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
            for item in self.inputs[side].get_batch(self.batch):  # type: ignore[attr-defined]
                did = True
                if item.__class__ is tuple:
                    self.tuples_in += 1
                    self.buffers[side].append(item)
                    t = item[self.times[side]]  # type: ignore[index]
                    if t > self.progress[side]:
                        self.progress[side] = t
                elif item.__class__ is Watermark:
                    self.progress[side] = max(self.progress[side], item.time)  # type: ignore[attr-defined]
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
