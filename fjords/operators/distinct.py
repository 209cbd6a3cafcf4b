"""COUNT(DISTINCT x): a windowed aggregate kind that regroups partial rows.

The windowed aggregate runs in partial mode keyed by the query's keys *and* the distinct
arguments, so each partial row stands for one distinct combination in its window; this
operator regroups those rows by the query's keys (merging the other aggregates' states exactly,
as GroupMerge does) and counts the distinct non-NULL values of each argument. It works the same
after a static-table join (the partial rows are joined first). A watermark at or past a
window's end flushes it, and is passed on (a WindowTop downstream flushes on it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fjords.operators.aggregate import AggSpec, Finalize, finish, merge_state
from fjords.operators.base import Operator
from fjords.progress import Watermark
from fjords.queues import Queue

COUNT_DISTINCT = "COUNT DISTINCT"


class DistinctMerge(Operator):
    """Regroup partial rows by `key_fn`, counting distinct values of `distinct_fns`.

    `specs` are the query's aggregates in order: a COUNT DISTINCT spec's `slot` indexes
    `distinct_fns`; any other spec's slot indexes the partial state (as in WindowAggregate)."""

    kind = "distinct_merge"

    def __init__(
        self,
        input: Queue,
        output: Queue,
        *,
        key_fn: Callable[[tuple], tuple],
        distinct_fns: Sequence[Callable[[tuple], object]],
        ws_index: int,
        we_index: int,
        state_index: int,
        specs: Sequence[AggSpec],
        finalize: Finalize | None = None,
        **kw: Any,
    ) -> None:
        super().__init__([input], [output], **kw)
        self.key_fn = key_fn
        self.distinct_fns = tuple(distinct_fns)
        self.ws_index, self.we_index, self.state_index = ws_index, we_index, state_index
        self.specs = tuple(specs)
        self.finalize = finalize
        # (ws, we) -> key -> [merged state, one set of values per distinct argument]
        self._windows: dict[tuple[float, float], dict[tuple, list]] = {}

    def transition(self) -> bool:
        items = self.inputs[0].get_batch(self.batch)  # type: ignore[attr-defined]
        if not items:
            return False
        nd = len(self.distinct_fns)
        for item in items:
            if item.__class__ is tuple:
                t: tuple = item  # type: ignore[assignment]
                self.tuples_in += 1
                groups = self._windows.setdefault((t[self.ws_index], t[self.we_index]), {})
                key = self.key_fn(t)
                acc = groups.get(key)
                if acc is None:
                    acc = groups[key] = [list(t[self.state_index]), *[set() for _ in range(nd)]]
                else:
                    merge_state(acc[0], t[self.state_index])
                for j, f in enumerate(self.distinct_fns):
                    v = f(t)
                    if v is not None:
                        acc[1 + j].add(v)
            elif item.__class__ is Watermark:
                self._flush(item.time)  # type: ignore[attr-defined]
            else:
                self.outputs[0].put(item)
        return True

    def release_state(self) -> None:
        self._windows.clear()

    def _values(self, acc: list) -> tuple:
        out = []
        for s in self.specs:
            if s.func == COUNT_DISTINCT:
                out.append(len(acc[1 + s.slot]))  # type: ignore[operator]
            else:
                out.append(finish(acc[0], (s,))[0])
        return tuple(out)

    def _flush(self, limit: float) -> None:
        out, fin = self.outputs[0], self.finalize
        for bounds in sorted(b for b in self._windows if b[1] <= limit):
            ws, we = bounds
            for key, acc in self._windows.pop(bounds).items():
                row: tuple | None = (*key, *self._values(acc), ws, we)
                if fin is not None:
                    row = fin(row)
                    if row is None:
                        continue
                out.put(row)
                self.tuples_out += 1
        out.put(Watermark(limit))

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "aggregates": [s.label or s.func for s in self.specs],
        }
