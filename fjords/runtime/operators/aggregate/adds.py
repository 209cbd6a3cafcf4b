"""The row paths that add readings to a window aggregate's panes.

`add_rows` takes a fused delivery from the stream router; `_add_columns` is its loop for one
plain group column and one aggregated column (Query 1's shape), with the update inlined;
`_add` is the general path (one reading, from the input queue or a ROWS window). Each is
property-tested equal to `_add` (tests/fjords/test_fused.py, test_window_batch.py).
"""

from __future__ import annotations

import math
import sys
from bisect import insort
from typing import Any

from fjords.runtime.operators.aggregate.pane_state import PaneState
from fjords.runtime.operators.aggregate.panes import KEY_BYTES, key_bytes
from fjords.runtime.operators.aggregate.state import new_state


class RowAdds(PaneState):
    """Readings into panes, row by row."""

    __slots__ = ()

    # -- per tuple ---------------------------------------------------------------
    def _add(self, t: tuple) -> None:
        ts = t[self.time_index]
        if self.rows:
            # Shifted so that row windows END at multiples of the slide: "the last n rows,
            # every m rows".
            coord = self._row_no + self._row_shift
            self._row_no += 1
        else:
            coord = math.floor(ts * 1000)
        p = coord // self._pane_u
        if self._next_k is not None and p // self._sp < self._next_k:
            self.late += 1  # every window holding it has been emitted already
            return
        groups = self._panes.get(p)
        if groups is None:
            groups = self._panes[p] = {}
            keys = self._pane_keys
            if not keys or p > keys[-1]:
                keys.append(p)
            else:
                insort(keys, p)
            if self.rows:
                self._pane_times[p] = [ts, ts]
        elif self.rows:
            self._pane_times[p][1] = ts
        key = self._keyf(t)
        st = groups.get(key)
        if st is None:
            st = groups[key] = new_state(self._n_slots)
            if self._tracked:  # (bare: one group column) bytes as `_new_state` counts them
                cost = self._state_bytes + sys.getsizeof(key)
                nb = self._pane_nb
                if nb is None:
                    nb = self._pane_nb = {}
                nb[p] = nb.get(p, 0) + cost
            self._new_state(key, len(groups))
        self._update(st, t)

    def _add_columns(self, rows: list[tuple]) -> None:
        """`add_rows` for one plain GROUP BY column and one aggregate over a plain column
        (Query 1's shape): fields read by index and, for int and float values, the update of
        `updater` inlined (MIN/MAX and the row count only when asked for). Other values (NULL,
        a mote's `Partial`, text) take the general update. Property-tested equal to `_add`."""
        ki: Any = self._key_col  # (set: `add_rows` takes this path only then)
        vi: Any = self._arg_col
        ti = self.time_index
        update, minmax, lean, locate = self._update, self._minmax, self._lean, self._locate
        groups: Any  # a pane's groups; None only with bounds that miss every time
        # `_new_state` inlined (a group is keyed by its bare value here): bytes, then limits
        state_bytes = self._state_bytes
        max_groups = self.limits.max_groups_per_window
        max_bytes = self.limits.max_state_bytes_per_query
        groups, lo, hi = self._cur
        nbytes = self._bytes  # kept local, stored back (and before a limit check)
        known_bytes = KEY_BYTES.get
        pane_nb, p, added = self._pane_nb, self._loc_p, 0  # the current pane's new bytes
        if pane_nb is None:
            pane_nb = self._pane_nb = {}
        for t in rows:
            ts = t[ti]
            if not lo <= ts < hi:
                if added:
                    pane_nb[p] = pane_nb.get(p, 0) + added
                    added = 0
                groups, lo, hi = locate(ts)
                if groups is None:
                    self.late += 1  # every window holding it has been emitted already
                    continue
                p = self._loc_p
            key = t[ki]
            st = groups.get(key)
            if st is None:
                st = groups[key] = [0, 0, 0, None, None]  # new_state(1)
                cost = known_bytes(key)
                cost = state_bytes + (key_bytes(key) if cost is None else cost)
                nbytes += cost
                added += cost
                if len(groups) > max_groups or nbytes > max_bytes:
                    self._bytes = nbytes
                    pane_nb[p] = pane_nb.get(p, 0) + added
                    added = 0
                    self._check_limits(len(groups))
            v = t[vi]
            cls = v.__class__
            if lean and (cls is float or cls is int):  # AVG, SUM, COUNT(x) alone (Query 1)
                st[1] += 1
                st[2] += v
            elif cls is float or cls is int:
                st[0] += 1
                st[1] += 1
                st[2] += v
                if minmax:
                    if st[3] is None or v < st[3]:
                        st[3] = v
                    if st[4] is None or v > st[4]:
                        st[4] = v
            else:
                update(st, t)
        if added:
            pane_nb[p] = pane_nb.get(p, 0) + added
        self._bytes = nbytes
        self._cur = (groups, lo, hi)
