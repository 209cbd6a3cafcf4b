"""Operators after a partial window aggregate: regrouping partial rows, and one query's end.

`GroupMerge` regroups partial rows (after a join with a table) by new keys, per window;
`Finish` is one query's HAVING and SELECT list over a shared aggregate's rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from fjords.runtime.operators.aggregate.state import (
    AggSpec,
    BatchFinalize,
    Finalize,
    merge_state,
    put_finished,
)
from fjords.runtime.operators.base import Operator
from fjords.runtime.progress import Watermark
from fjords.runtime.queues import Queue


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
        items = self.inputs[0].get_batch(self.batch)
        if not items:
            return False
        for item in items:
            if item.__class__ is tuple:
                t: tuple = item
                self.tuples_in += 1
                groups = self._windows.setdefault((t[self.ws_index], t[self.we_index]), {})
                self._add(groups, self.key_fn(t), t)
            elif item.__class__ is Watermark:
                self._flush(item.time)
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
    __slots__ = ("finalize", "batch_finalize", "start_time")

    def __init__(
        self,
        input: Queue,
        output: Queue,
        *,
        finalize: Finalize,
        batch_finalize: BatchFinalize | None = None,
        start_time: float = -math.inf,
        **kw: Any,
    ) -> None:
        super().__init__([input], [output], **kw)
        self.finalize = finalize
        # `finalize` over a window's rows in one call, where the planner has one (it only
        # picks columns): a fused window's rows are finished without a call per row.
        self.batch_finalize = batch_finalize
        self.start_time = start_time

    def finish_batch(
        self, items: list, finalize: Finalize | None = None, batch: BatchFinalize | None = None
    ) -> tuple[list[tuple], float | None]:
        """A fused window's items at once (`WindowFanOut`): its rows that start at or after
        the query did, through HAVING and the SELECT list (in one call where there is a
        batch finalize), and the latest watermark among the items. `finalize` and `batch`:
        others than the query's (its rows picked by its groups already)."""
        rows = [r for r in items if r.__class__ is tuple]
        mark = None
        if len(rows) < len(items):
            mark = max(r.time for r in items if r.__class__ is not tuple)
        self.tuples_in += len(rows)
        start = self.start_time
        if start > -math.inf:
            rows = [r for r in rows if not r[-2] < start]
        if finalize is None:
            finalize, batch = self.finalize, self.batch_finalize
        if batch is not None:
            out = batch(rows)
        else:
            out = [r for r in map(finalize, rows) if r is not None]
        self.tuples_out += len(out)
        return out, mark

    def transition(self) -> bool:
        items = self.inputs[0].get_batch(self.batch)
        if not items:
            return False
        out, fin, start = self.outputs[0], self.finalize, self.start_time
        for item in items:
            if item.__class__ is tuple:
                self.tuples_in += 1
                if item[-2] < start:
                    continue
                row = fin(item)
                if row is not None:
                    out.put(row)
                    self.tuples_out += 1
            else:
                out.put(item)
        return True
