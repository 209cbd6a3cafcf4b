"""Per-window result shaping after a window's Finish: DISTINCT rows, ORDER BY, LIMIT n (top-k).

A window's results come out together, followed by a Watermark (the windowed aggregate's
`window_marks`, or a GroupMerge's flush); this operator holds the rows until that mark, then
emits each window's rows deduplicated, sorted and cut to `limit`. State is one window's result
rows, which the aggregate's limits already bound (groups per window).

Order is SQL's as Spark has it: ascending puts NULLs first, descending puts them last; ties are
broken by the visible columns in order (ascending), so both engines keep the same rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fjords.runtime.operators.base import Operator
from fjords.runtime.progress import Watermark
from fjords.runtime.queues import Queue


def _null_first(v: object) -> tuple:
    return (0,) if v is None else (1, v)


def sort_rows(
    rows: list[tuple], keys: Sequence[tuple[int, bool]], tiebreak: Sequence[int]
) -> list[tuple]:
    """`rows` sorted by `keys` (position, descending), then ascending by `tiebreak` positions.

    Stable sorts from the least significant key up, so each key keeps its own direction."""
    out = list(rows)
    for i in reversed(tiebreak):
        out.sort(key=_key_at(i))
    for i, desc in reversed(keys):
        out.sort(key=_key_at(i), reverse=desc)
    return out


def _key_at(i: int) -> Callable[[tuple], tuple]:
    """The sort key of a row's value at `i`, NULL first."""
    return lambda r: _null_first(r[i])


class WindowTop(Operator):
    """Rows of a window -> (DISTINCT) sorted by `keys` -> the first `limit`, cut to `width`.

    `keys` are (position, descending) in the incoming rows, which may carry hidden sort
    columns after the first `width`; `window` gives the positions of window_start/window_end.
    """

    kind = "window_top"

    def __init__(
        self,
        input: Queue,
        output: Queue,
        *,
        width: int,
        window: tuple[int, int],
        keys: Sequence[tuple[int, bool]] = (),
        limit: int | None = None,
        distinct: bool = False,
        **kw: Any,
    ) -> None:
        super().__init__([input], [output], **kw)
        self.width = width
        self.window = window
        self.keys = tuple(keys)
        self.limit = limit
        self.distinct = distinct
        self.rows_cut = 0  # rows past LIMIT (or duplicates under DISTINCT): by design, counted
        self._held: dict[tuple, list[tuple]] = {}

    def transition(self) -> bool:
        items = self.inputs[0].get_batch(self.batch)
        if not items:
            return False
        ws, we = self.window
        for item in items:
            if item.__class__ is tuple:
                self.tuples_in += 1
                row: tuple = item
                self._held.setdefault((row[we], row[ws]), []).append(row)
            elif item.__class__ is Watermark:
                self._flush()
                self.outputs[0].put(item)
            else:
                self.outputs[0].put(item)
        return True

    def release_state(self) -> None:
        self._held.clear()

    def _flush(self) -> None:
        out, width = self.outputs[0], self.width
        visible = range(width)
        for bounds in sorted(self._held):
            rows = self._held[bounds]
            if self.distinct:
                seen: dict[tuple, tuple] = {}
                for r in rows:
                    seen.setdefault(r[:width], r)
                rows = list(seen.values())
            if self.keys:
                rows = sort_rows(rows, self.keys, visible)
            kept = rows if self.limit is None else rows[: self.limit]
            self.rows_cut += len(self._held[bounds]) - len(kept)
            for r in kept:
                out.put(r if len(r) == width else r[:width])
            self.tuples_out += len(kept)
        self._held.clear()

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "order_by": [f"#{i}{' DESC' if d else ''}" for i, d in self.keys],
            "limit": self.limit,
            "distinct": self.distinct,
        }
