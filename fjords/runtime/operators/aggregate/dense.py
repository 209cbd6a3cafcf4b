"""The dense path: large deliveries of COUNT/SUM/AVG over a float column added with numpy.

Per open pane, arrays of sums, counts and first arrivals indexed by key code; exact, and
property-tested equal to the row paths (tests/fjords/test_window_batch.py).
"""

from __future__ import annotations

import sys
from bisect import insort
from operator import itemgetter

import numpy as np

from fjords.runtime.operators.aggregate.pane_state import DenseState, PaneState
from fjords.runtime.operators.aggregate.panes import (
    EXACT_U,
    NEVER,
    NO_PANE,
    ONLY_FLOAT,
    ONLY_INT,
    ONLY_STR,
)


class DenseAdds(PaneState):
    """Readings into dense panes, a delivery at a time."""

    __slots__ = ()

    # -- the dense state ------------------------------------------------------------
    def _dense_fits(self) -> bool:
        """Whether the dense state may serve this aggregate: a fused (`fan`) tumbling time
        window of COUNT(x)/SUM(x)/AVG(x) over one plain column, grouped by one plain column."""
        return (
            self.fan is not None
            and self._lean
            and self._rp == self._sp == 1
            and not (self.rows or self.partial)
            and self._key_col is not None
            and self._arg_col is not None
        )

    def _add_dense(self, rows: list[tuple]) -> bool:
        """`_add_columns` with numpy, no Python work per row or group: each open pane holds
        one array of sums, one of counts and one of first arrivals, indexed by key code.
        100 windowed aggregates with different filters (and `python -m fjords`' chunks of 65,536)
        spend most of their time creating and updating groups of ~2 rows each.

        Exact: a group's sum is its sum so far plus its values one by one in arrival order
        (`np.add.at` is unbuffered, in index order), the float additions of the row path;
        a window's rows come out in first-arrival order (`_dense_rows`); late rows are
        counted; bytes and limits are counted as the row path counts them. Takes a batch
        only if every value is a float, every time an int (or every one a float) and every
        key a str (or every one an int), else returns False having changed no window
        (the caller then moves the state back to dicts: `_undense`). Property-tested equal
        to `_add` (tests/fjords/test_window_batch.py)."""
        vals = list(map(itemgetter(self._arg_col), rows))
        if set(map(type, vals)) != ONLY_FLOAT:  # NULL, a mote's Partial, ints (exact sums)
            return False
        keys = list(map(itemgetter(self._key_col), rows))
        kinds = set(map(type, keys))
        if kinds != ONLY_STR and kinds != ONLY_INT:
            return False
        times = list(map(itemgetter(self.time_index), rows))
        kinds = set(map(type, times))
        if kinds == ONLY_INT:
            if not (min(times) * 1000 > -EXACT_U and max(times) * 1000 < EXACT_U):
                return False
            panes = np.array(times, dtype=np.int64) * 1000 // self._pane_u
        elif kinds == ONLY_FLOAT:
            ms = np.array(times, dtype=np.float64) * 1000  # as `ts * 1000` in Python
            if not (np.abs(ms) < EXACT_U).all():  # NaN fails this too
                return False
            panes = np.floor(ms).astype(np.int64) // self._pane_u  # as math.floor
        else:
            return False
        dn = self._dn
        if dn is None:
            dn = self._dn = DenseState()
        codes = dn.codes
        got = list(map(codes.get, keys))
        if None in got:
            for k in keys:
                if k not in codes:
                    codes[k] = len(dn.keyvals)
                    dn.keyvals.append(k)
                    dn.keysizes.append(sys.getsizeof(k))
            got = list(map(codes.__getitem__, keys))
        n = len(rows)
        c = np.array(got, dtype=np.int64)
        v = np.array(vals, dtype=np.float64)
        seq = np.arange(dn.seq, dn.seq + n, dtype=np.int64)
        dn.seq += n
        late = 0
        if self._next_k is not None:  # rows of windows already emitted are late
            fresh = panes >= self._next_k
            kept = int(np.count_nonzero(fresh))
            if kept < n:
                late = n - kept
                if not kept:
                    self.late += late
                    return True
                panes, c, v, seq = panes[fresh], c[fresh], v[fresh], seq[fresh]
        up, j = np.unique(panes, return_inverse=True)
        n_keys, n_panes = len(dn.keyvals), len(up)
        size = n_panes * n_keys
        if size > 16 * n + 4096:  # many keys, few in each pane: arrays would outgrow dicts
            return False
        self.late += late
        gid = j.ravel() * n_keys + c
        sums = np.zeros(size, dtype=np.float64)
        counts = np.zeros(size, dtype=np.int64)
        first = np.full(size, NEVER, dtype=np.int64)
        dense = dn.panes
        up_list = up.tolist()
        for i, p in enumerate(up_list):
            old = dense.get(p)
            if old is not None:  # seeded with the pane's state (fewer keys, maybe)
                a, b = i * n_keys, i * n_keys + len(old[0])
                sums[a:b], counts[a:b], first[a:b] = old[0], old[1], old[2]
        np.add.at(sums, gid, v)
        added = np.bincount(gid, minlength=size)
        if len(gid) > 8 * np.count_nonzero(added):
            self._dense_ok = False
        new = (added > 0) & (counts == 0)
        counts += added
        np.minimum.at(first, gid, seq)
        # bytes as `_new_state` counts them: per new group, its state and its key
        cost = np.tile(np.array(dn.keysizes, dtype=np.int64) + self._state_bytes, n_panes)
        pane_bytes = np.where(new, cost, 0).reshape(n_panes, n_keys).sum(axis=1).tolist()
        in_pane = np.count_nonzero(counts.reshape(n_panes, n_keys), axis=1)
        sums2, counts2, first2 = (x.reshape(n_panes, n_keys) for x in (sums, counts, first))
        keys_list = self._pane_keys
        for i, p in enumerate(up_list):
            old = dense.get(p)
            if old is None:
                if not keys_list or p > keys_list[-1]:
                    keys_list.append(p)
                else:
                    insort(keys_list, p)
                grown = pane_bytes[i]
            else:
                grown = old[3] + pane_bytes[i]
            dense[p] = (sums2[i], counts2[i], first2[i], grown)
        self._bytes += sum(pane_bytes)
        most = int(in_pane.max())
        lim = self.limits
        if most > lim.max_groups_per_window or self._bytes > lim.max_state_bytes_per_query:
            self._check_limits(most)
        return True

    def _dense_order(self, counts: np.ndarray, first: np.ndarray) -> np.ndarray:
        """The codes of a dense pane's groups, in first-arrival order (the row path's)."""
        nz = np.flatnonzero(counts)
        if len(nz) > 1:
            nz = nz[np.argsort(first[nz], kind="stable")]
        return nz

    def _dense_rows(self, closing: list[tuple[tuple, float, float]]) -> list[tuple]:
        """The finished rows of closing dense panes `(pane, ws, we)`, window after window,
        each window's groups in first-arrival order: what `_finished` makes from dicts, in
        about a dozen numpy calls for all the windows a watermark closes."""
        k = max(len(pane[0]) for pane, _, _ in closing)
        if all(len(pane[0]) == k for pane, _, _ in closing):
            sums, counts, first = (np.concatenate([c[0][i] for c in closing]) for i in range(3))
        else:  # panes made before the aggregate saw its later keys: padded
            m = len(closing)
            sums = np.zeros(m * k, dtype=np.float64)
            counts = np.zeros(m * k, dtype=np.int64)
            first = np.full(m * k, NEVER, dtype=np.int64)
            for i, (pane, _, _) in enumerate(closing):
                a, b = i * k, i * k + len(pane[0])
                sums[a:b], counts[a:b], first[a:b] = pane[0], pane[1], pane[2]
        nz = np.flatnonzero(counts)
        nz = nz[np.lexsort((first[nz], nz // k))]  # by window, then by first arrival
        s, c = sums[nz], counts[nz]
        cols = []
        for spec in self.specs:
            if spec.func == "AVG":
                cols.append((s / c).tolist())  # float / int, as in Python
            elif spec.func == "SUM":
                cols.append(s.tolist())
            else:
                cols.append(c.tolist())
        keyvals = self._dn.keyvals  # type: ignore[union-attr]
        win = (nz // k).tolist()
        rows = list(
            zip(
                [keyvals[i] for i in (nz % k).tolist()],
                *cols,
                [closing[j][1] for j in win],
                [closing[j][2] for j in win],
                strict=True,
            )
        )
        if self.finalize is not None:
            rows = [r for r in map(self.finalize, rows) if r is not None]
        return rows

    def _undense(self) -> None:
        """The dense panes as the row path's dicts (groups in first-arrival order, lean
        states), for rows the dense state cannot take. Bytes stay as counted."""
        dn = self._dn
        if dn is None or not dn.panes:
            return
        keyvals = dn.keyvals
        if self._pane_nb is None:
            self._pane_nb = {}
        for p, (sums, counts, first, _) in dn.panes.items():
            nz = self._dense_order(counts, first).tolist()
            self._pane_nb[p] = dn.panes[p][3]
            self._panes[p] = {
                keyvals[i]: [0, n, s, None, None]
                for i, n, s in zip(nz, counts[nz].tolist(), sums[nz].tolist(), strict=True)
            }
        dn.panes.clear()
        self._cur = NO_PANE
