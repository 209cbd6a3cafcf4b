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
    merge_finished,
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


class RollupFinish(Finish):
    """One query's end of a ROLLUP / GROUPING SETS aggregate: the aggregate runs at the finest
    level (every grouping column a key, shareable with a plain GROUP BY of those columns), and
    each window's coarser levels are merged here from its finished groups, not recomputed
    from readings (`state.merge_finished`).

    Input rows are the finest groups' `keys + aggregates + (ws, we)`; each level's rows are
    `keys (NULL where rolled up) + aggregates + (ws, we) + one GROUPING flag per key` through
    `finalize` (HAVING and the SELECT list). `pre`: a condition on the finest groups (a WHERE
    on the groups moved after a shared aggregate) checked before merging. A fused fan-out
    hands whole windows; unfused (queued rows, which may come in several batches) a window is
    complete at the next window's row or a watermark (the planner has such aggregates mark
    each window's end where it can: `window_marks`)."""

    kind = "rollup_finish"

    def __init__(
        self,
        input: Queue,
        output: Queue,
        *,
        finalize: Finalize,
        levels: Sequence[tuple[int, ...]],
        n_keys: int,
        kinds: Sequence[str],
        avg: Sequence[tuple[int, int, int]] = (),
        pre: Callable[[tuple], bool] | None = None,
        labels: Sequence[str] = (),
        prune: Sequence[str] | None = None,
        start_time: float = -math.inf,
        **kw: Any,
    ) -> None:
        super().__init__(input, output, finalize=finalize, start_time=start_time, **kw)
        self.levels = tuple(tuple(lv) for lv in levels)
        self.n_keys = n_keys
        self.kinds = tuple(kinds)
        self.avg = tuple(avg)  # (AVG's position, its SUM's, its COUNT's) among the aggregates
        self.pre = pre
        self.labels = tuple(labels)
        # a drill-down (levels (a), (a, b)...): each level's HAVING text; its rows pruned
        # top-down (`_pruned`)
        self.prune = None if prune is None else tuple(prune)
        self.pruned = 0  # rows removed under a row that failed its level's HAVING
        self._open: list[tuple] = []  # unfused: the current window's rows so far

    def level_rows(self, rows: list[tuple]) -> list[tuple]:
        """Every level's rows of one window's finest groups (before `finalize`)."""
        return [r for group in self.level_groups(rows) for r in group]

    def level_groups(self, rows: list[tuple]) -> list[list[tuple]]:
        """Each level's rows of one window's finest groups, level by level (`levels`)."""
        if not rows:
            return []
        nk, na = self.n_keys, len(self.kinds)
        ws, we = rows[0][-2], rows[0][-1]
        groups_out: list[list[tuple]] = []
        for level in self.levels:
            flags = tuple(0 if i in level else 1 for i in range(nk))
            if len(level) == nk:
                groups_out.append([(*r, *flags) for r in rows])
                continue
            out: list[tuple] = []
            groups: dict[tuple, list] = {}
            for r in rows:
                key = tuple(r[i] for i in level)
                acc = groups.get(key)
                if acc is None:
                    groups[key] = list(r[nk : nk + na])
                else:
                    merge_finished(acc, r[nk : nk + na], self.kinds)
            for key, acc in groups.items():
                for at, s, c in self.avg:
                    acc[at] = acc[s] / acc[c] if acc[c] else None
                full: list = [None] * nk
                for i, v in zip(level, key, strict=True):
                    full[i] = v
                out.append((*full, *acc, ws, we, *flags))
            groups_out.append(out)
        return groups_out

    def _pruned(self, rows: list[tuple], finalize: Finalize) -> list[tuple]:
        """A drill-down's result rows of one window, top-down: a level's row is kept where
        its parent (the coarser level's row of the same leading keys) was and it meets its
        own level's HAVING (in `finalize`), so a failing row removes all rows beneath it."""
        out: list[tuple] = []
        kept: set[tuple] | None = None
        for depth, group in enumerate(self.level_groups(rows)):
            passed: set[tuple] = set()
            for r in group:
                if kept is not None and r[:depth] not in kept:
                    self.pruned += 1
                    continue
                d = finalize(r)
                if d is not None:
                    passed.add(r[: depth + 1])
                    out.append(d)
            kept = passed
        return out

    def _finish_rows(self, rows: list[tuple], finalize: Finalize) -> list[tuple]:
        """The result rows of rows holding whole windows, window by window."""
        start, pre = self.start_time, self.pre
        rows = [r for r in rows if not r[-2] < start and (pre is None or pre(r))]
        out: list[tuple] = []
        i = 0
        while i < len(rows):
            bounds = rows[i][-2:]
            j = i + 1
            while j < len(rows) and rows[j][-2:] == bounds:
                j += 1
            if self.prune:
                out += self._pruned(rows[i:j], finalize)
            else:
                out += [d for d in map(finalize, self.level_rows(rows[i:j])) if d is not None]
            i = j
        return out

    def finish_batch(
        self, items: list, finalize: Finalize | None = None, batch: BatchFinalize | None = None
    ) -> tuple[list[tuple], float | None]:
        """A fused window's items (whole windows): every level's rows. A gated user's rows are
        its groups' already; its condition is `pre` (checked again, to the same effect)."""
        rows = [r for r in items if r.__class__ is tuple]
        mark = None
        if len(rows) < len(items):
            mark = max(r.time for r in items if r.__class__ is not tuple)
        self.tuples_in += len(rows)
        out = self._finish_rows(rows, self.finalize)
        self.tuples_out += len(out)
        return out, mark

    def _flush(self) -> None:
        rows, self._open = self._open, []
        out = self.outputs[0]
        for r in self._finish_rows(rows, self.finalize):
            out.put(r)
            self.tuples_out += 1

    def transition(self) -> bool:
        items = self.inputs[0].get_batch(self.batch)
        if not items:
            return False
        for item in items:
            if item.__class__ is tuple:
                self.tuples_in += 1
                if self._open and self._open[-1][-2:] != item[-2:]:
                    self._flush()
                self._open.append(item)
            else:
                self._flush()
                self.outputs[0].put(item)
        return True

    def describe(self) -> dict[str, Any]:
        d = {**super().describe(), "levels": list(self.labels)}
        if self.prune is not None:
            d["drilldown"] = [
                {"level": label, "having": cond or None}
                for label, cond in zip(self.labels, self.prune, strict=True)
            ]
            d["pruning"] = (
                "top-down at the window close: a row failing its level's HAVING removes "
                "its rows at the finer levels"
            )
            d["pruned"] = self.pruned
        return d
