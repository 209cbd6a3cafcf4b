"""`WindowAggregate`: grouped, windowed aggregation; which add path takes a delivery, and how
its windows close and go out."""

from __future__ import annotations

import math
from bisect import bisect_left
from typing import Any

from fjords.runtime.operators.aggregate.adds import RowAdds
from fjords.runtime.operators.aggregate.dense import DenseAdds
from fjords.runtime.operators.aggregate.panes import NO_PANE
from fjords.runtime.operators.aggregate.state import merge_state, new_state, put_finished
from fjords.runtime.progress import Watermark


class WindowAggregate(RowAdds, DenseAdds):
    """Grouped, windowed aggregation of one input.

    Output rows are `key + aggregates + (window_start, window_end)` passed through `finalize`
    (which may drop the row: HAVING), or, with `partial=True`, `key + (window_start, window_end,
    state)` for a GroupMerge. Time windows use `range_s`/`slide_s` seconds; row windows set
    `rows=True` and give `range_s`/`slide_s` as row counts (their window_start and window_end are
    the sample times of the window's first and last rows).
    """

    kind = "window_aggregate"
    __slots__ = ()

    def add_rows(self, rows: list[tuple]) -> None:
        """Fold one batch of tuples in, directly (a fused delivery from the stream router: no
        queue, no scheduler step). Time windows take the fast path: the current pane's groups
        and time bounds are cached, so a reading costs two comparisons, one dict lookup and
        the update. Control items still come through the input queue (`transition`)."""
        self.tuples_in += len(rows)
        if self.rows:
            for t in rows:
                self._add(t)
            if self._pending_close is None:
                self._close(self._row_no + self._row_shift)
            return
        if self._key_col is not None and self._arg_col is not None:
            if (self._dn is not None and self._dn.panes) or (
                self._dense_ok
                and not self._panes
                and len(rows) >= self.dense_min
                and self._dense_fits()
            ):
                if self._add_dense(rows):
                    if not self._dense_ok:
                        self._undense()  # groups of many rows: dicts are faster (Query 1)
                    return
                self._undense()  # rows it cannot take: back to groups in dicts
            self._add_columns(rows)
            return
        ti, update, keyf = self.time_index, self._update, self._keyf
        n_slots = self._n_slots
        locate = self._locate
        groups: Any  # a pane's groups; None only with bounds that miss every time
        groups, lo, hi = self._cur
        for t in rows:
            ts = t[ti]
            if not lo <= ts < hi:
                groups, lo, hi = locate(ts)
                if groups is None:
                    self.late += 1  # every window holding it has been emitted already
                    continue
            key = keyf(t)
            st = groups.get(key)
            if st is None:
                st = groups[key] = new_state(n_slots)
                self._new_state(key, len(groups))
            update(st, t)
        self._cur = (groups, lo, hi)

    def has_input(self) -> bool:
        return (
            self._pending_close is not None
            or bool(self._backlog)
            or (self.fan is not None and self.fan.pending)
            or super().has_input()
        )

    def _cut_short(self, limit: float) -> bool:
        """After handing rows to `fan`: whether it stopped part way (then this close is
        resumed once it is done, next transition)."""
        if self.fan is not None and self.fan.pending:
            self._pending_close = limit
            return True
        return False

    def advance(self, mark: object) -> None:
        """The stream's progress, for a fused aggregate (its rows come by `add_rows`): the
        windows it closes are emitted by the next transition, within its budget."""
        self.inputs[0].put(mark)

    def transition(self) -> bool:
        did = self._transition()
        if self.fan is not None:
            self.fan.settle()
        return did

    def _transition(self) -> bool:
        if self.fan is not None and not self.fan.drain():
            return True  # a window's fan-out goes on: nothing newer before it is out
        if self._pending_close is not None:
            # A close cut short: go on with it before reading anything newer.
            if not self._close(self._pending_close):
                return True
        items = self._backlog or self.inputs[0].get_batch(self.batch)
        self._backlog = []
        if not items:
            return False
        add = self._add
        n = 0
        for i, item in enumerate(items):
            if item.__class__ is tuple:
                add(item)
                n += 1
            elif item.__class__ is Watermark and (not self.rows or item.time == math.inf):
                if not self._close(item.time):
                    self._backlog = items[i + 1 :]
                    break
                mark = item.time
                if self.window_marks and not self.rows and mark != math.inf:
                    # every window ending by then is out: a merge downstream (UNION ALL) may
                    # move on even while this query's windows are empty
                    self.emit(Watermark(mark))
        self.tuples_in += n
        if self.rows and self._pending_close is None:
            self._close(self._row_no + self._row_shift)
        return True

    # -- closing windows ---------------------------------------------------------------
    def _close(self, limit: float) -> bool:
        """Emit every window whose end is at or before `limit` (seconds, or rows in rows mode).

        At most `limits.max_windows_per_transition` windows (and about 4096 pane merges) per
        call, so closing never holds the event loop: returns False when cut short (the rest is
        resumed by the next transition), True when done."""
        self._pending_close = None
        self._cur = NO_PANE  # windows may close: panes go, late moves
        if self._rp == self._sp == 1 and self.fan is not None and not (self.rows or self.partial):
            return self._close_tumbling(limit)
        budget_windows = self.limits.max_windows_per_transition
        budget_panes = 4096
        limit_p = (
            math.inf if limit == math.inf else (limit * (1 if self.rows else 1000)) / self._pane_u
        )
        rp, sp = self._rp, self._sp
        keys = self._pane_keys
        while keys:
            k = (keys[0] - rp) // sp + 1  # first window holding the oldest pane
            if self._next_k is not None and k < self._next_k:
                k = self._next_k
            if k * sp + rp > limit_p:
                break
            if budget_windows <= 0 or budget_panes <= 0:
                self._pending_close = limit
                return False
            budget_panes -= self._emit(k)
            budget_windows -= 1
            self._next_k = k + 1
            keep_from = (k + 1) * sp
            drop = bisect_left(keys, keep_from)
            for p in keys[:drop]:
                self._drop_bytes(p, self._panes.pop(p))
                self._pane_times.pop(p, None)
            del keys[:drop]
            if self._cut_short(limit):
                return False
        if limit == math.inf:  # end of input: everything downstream may flush
            if self.fan is not None:
                self.fan.deliver([Watermark(limit)])
            else:
                self.emit(Watermark(limit))
        return True

    def _close_tumbling(self, limit: float) -> bool:
        """`_close` for a fused tumbling time window (one pane per window, rows handed to
        `fan`): the closing windows' rows go out in ONE `fan.deliver` call (a watermark
        typically closes several windows of each of many queries: one fan-out each, not one
        per window), in window order, as `_emit` makes them. Same budget, same counters.
        Property-tested equal to the general close (tests/fjords/test_window_batch.py)."""
        pane_u, keys, panes = self._pane_u, self._pane_keys, self._panes
        limit_p = math.inf if limit == math.inf else (limit * 1000) / pane_u
        budget = self.limits.max_windows_per_transition
        start, bare, finished = self.start_time, self._bare, self._finished
        out: list[tuple] = []
        closing: list[tuple[tuple, float, float]] = []  # dense panes: their rows at once
        n = 0
        while n < len(keys) and keys[n] + 1 <= limit_p:
            if n >= budget:
                self._pending_close = limit
                break
            p = keys[n]
            ws = p * pane_u / 1000
            groups = panes.pop(p, None)
            if groups is None:  # a dense pane (`_add_dense`)
                pane = self._dn.panes.pop(p)  # type: ignore[union-attr]
                self._bytes -= pane[3]
                if not ws < start:
                    self.windows_emitted += 1
                    closing.append((pane, ws, (p + 1) * pane_u / 1000))
            else:
                if closing:  # (dense and dict panes never coexist; were they to, in order)
                    out += self._dense_rows(closing)
                    closing = []
                self._drop_bytes(p, groups)
                if not ws < start:
                    self.windows_emitted += 1
                    out += finished(groups, bare, ws, (p + 1) * pane_u / 1000)
            n += 1
        if closing:
            out += self._dense_rows(closing)
        if n:
            self._next_k = keys[n - 1] + 1
            del keys[:n]
        if out:
            self.tuples_out += len(out)
            self.fan.deliver(out)  # type: ignore[union-attr]
            if self._cut_short(limit):
                return False
        if self._pending_close is not None:
            return False
        if limit == math.inf:  # end of input: everything downstream may flush
            self.fan.deliver([Watermark(limit)])  # type: ignore[union-attr]
        return True

    def _emit(self, k: int) -> int:
        """Emit window `k`; returns the number of panes merged (the work done)."""
        sp, rp = self._sp, self._rp
        first, last = k * sp, k * sp + rp
        keys = self._pane_keys
        lo, hi = bisect_left(keys, first), bisect_left(keys, last)
        panes = [keys[i] for i in range(lo, hi)]
        if not panes:
            return 1
        if self.rows:
            ws = self._pane_times[panes[0]][0]
            we = self._pane_times[panes[-1]][1]
        else:
            ws = first * self._pane_u / 1000
            we = last * self._pane_u / 1000
        if ws < self.start_time:
            return len(panes)
        if len(panes) == 1:
            groups = self._panes[panes[0]]
        else:
            groups = {}
            for p in panes:
                for key, st in self._panes[p].items():
                    acc = groups.get(key)
                    if acc is None:
                        groups[key] = list(st)
                    else:
                        merge_state(acc, st)
            if len(groups) > self.limits.max_groups_per_window:
                self.limits.check(
                    "max_groups_per_window", len(groups), f"{self.name}: groups in a window"
                )
        bare = self._bare  # `groups` keyed by the bare value (one group column)
        if bare and (self.fan is None or self.partial):
            groups, bare = {(k,): st for k, st in groups.items()}, False
        self.windows_emitted += 1
        if self.fan is not None and not self.partial:
            rows = self._finished(groups, bare, ws, we)
            self.tuples_out += len(rows)
            if rows:
                self.fan.deliver(rows)
            return len(panes)
        out = self.outputs[0]
        if self.partial:
            for key, st in groups.items():
                out.put((*key, ws, we, tuple(st)))
                self.tuples_out += 1
            out.put(Watermark(we))  # this window is complete: a GroupMerge may flush it
            return len(panes)
        self.tuples_out += put_finished(out, groups, self.specs, self.finalize, ws, we)
        if self.window_marks:
            out.put(Watermark(we))
        return len(panes)

    def _finished(self, groups: dict, bare: bool, ws: float, we: float) -> list[tuple]:
        """One finished row per group (`key + aggregates + (ws, we)`, through `finalize`), as
        `finished_rows` makes them; `bare`: `groups` is keyed by the bare value."""
        v1, fin = self._value1, self._finish
        if bare and self._avg1:  # one AVG (a dashboard's shape): inlined
            rows = [(k, s / n if n else None, ws, we) for k, (_, n, s, _, _) in groups.items()]
        elif bare and v1 is not None:
            rows = [(k, v1(st), ws, we) for k, st in groups.items()]
        elif bare:
            rows = [(k, *fin(st), ws, we) for k, st in groups.items()]
        else:
            rows = [(*k, *fin(st), ws, we) for k, st in groups.items()]
        if self.finalize is not None:
            rows = [r for r in map(self.finalize, rows) if r is not None]
        return rows

    def describe(self) -> dict[str, Any]:
        unit = "rows" if self.rows else "seconds"
        return {
            **super().describe(),
            "range": self.range_s,
            "slide": self.slide_s,
            "unit": unit,
            "aggregates": [
                s.label or f"{s.func}({'*' if s.slot is None else s.slot})" for s in self.specs
            ],
        }
