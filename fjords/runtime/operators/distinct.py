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

from fjords.runtime.operators.aggregate import GroupMerge, finish, merge_state
from fjords.runtime.queues import Queue

COUNT_DISTINCT = "COUNT DISTINCT"


class DistinctMerge(GroupMerge):
    """Regroup partial rows by `key_fn`, counting distinct values of `distinct_fns`.

    `specs` are the query's aggregates in order: a COUNT DISTINCT spec's `slot` indexes
    `distinct_fns`; any other spec's slot indexes the partial state (as in WindowAggregate).
    A group's accumulator is [merged state, one set of values per distinct argument]."""

    kind = "distinct_merge"
    forward_other = True

    def __init__(
        self,
        input: Queue,
        output: Queue,
        *,
        distinct_fns: Sequence[Callable[[tuple], object]],
        **kw: Any,
    ) -> None:
        super().__init__(input, output, **kw)
        self.distinct_fns = tuple(distinct_fns)

    def _add(self, groups: dict[tuple, list], key: tuple, t: tuple) -> None:
        acc = groups.get(key)
        if acc is None:
            acc = groups[key] = [list(t[self.state_index]), *[set() for _ in self.distinct_fns]]
        else:
            merge_state(acc[0], t[self.state_index])
        for j, f in enumerate(self.distinct_fns):
            v = f(t)
            if v is not None:
                acc[1 + j].add(v)

    def _values(self, acc: list) -> tuple:
        out = []
        for s in self.specs:
            if s.func == COUNT_DISTINCT:
                out.append(len(acc[1 + s.slot]))  # type: ignore[operator]
            else:
                out.append(finish(acc[0], (s,))[0])
        return tuple(out)

    def _put_window(self, groups: dict[tuple, list], ws: float, we: float) -> int:
        out, fin, n = self.outputs[0], self.finalize, 0
        for key, acc in groups.items():
            row = (*key, *self._values(acc), ws, we)
            if fin is not None:
                done = fin(row)
                if done is None:
                    continue
                row = done
            out.put(row)
            n += 1
        return n

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "aggregates": [s.label or s.func for s in self.specs],
        }
