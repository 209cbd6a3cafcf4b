"""The last N result rows of a query, numbered, so an HTTP client that reconnects gets what it
missed (`?since=<row id or time>`, SSE's `Last-Event-ID`), and is told when rows it asked for are
gone.

Row ids are consecutive within a run and only grow: with a query store, each run starts after
the ids it leased before (`lease`), so an id a client remembers from before a restart is never
reused. The ring keeps rows as published (tuples from the Fjord, dicts from Spark) and makes
dicts only when a client replays them. Times are kept coarsely, one mark per `MARK_SECONDS` of
publishing, not per row or batch (a ring is extended once per query per Fjord batch, hundreds
of times a second): a replay `since_time` may repeat rows published up to `MARK_SECONDS`
before the time asked for, never skip one, and says rows are gone when some published up to
`MARK_SECONDS` after it may be.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

#: Ids are leased from the store in blocks this large (one write per block, not per row).
LEASE_BLOCK = 100_000

#: The resolution of the ring's publish times (see the module's docstring).
MARK_SECONDS = 0.05

Lease = Callable[[int], None]  # persist "ids below this are used"


@dataclass
class ResultReplay:
    """The result rows a ring replays to a new subscriber before live rows: `rows` (the first
    has id `first_id`), and `gone` when rows it asked for are no longer kept."""

    rows: list[dict[str, Any]]
    first_id: int
    gone: dict[str, Any] | None = None


class ReplayRing:
    def __init__(
        self,
        size: int,
        first_id: int = 1,
        *,
        lease: Lease | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.size = size
        self.rows: deque[Any] = deque(maxlen=size) if size > 0 else deque(maxlen=0)
        self.next_id = first_id  # the id of the next row published
        self.run_first_id = first_id  # ids below this were used by earlier runs (or never)
        self.columns: Sequence[str] | None = None  # for tuple rows
        # (first id, time): the rows from that id until the next mark's were published at that
        # time or up to MARK_SECONDS after it. Marks of evicted rows are dropped lazily (`_trim`).
        self._marks: deque[tuple[int, float]] = deque()
        self._next_mark = float("-inf")  # no mark before this time
        self._evicted_time: float | None = None  # no row published after this is gone
        self._lease = lease
        self._leased = first_id
        self.clock = clock

    @property
    def oldest_id(self) -> int:
        """The id of the oldest row kept (== next_id when none)."""
        return self.next_id - len(self.rows)

    def extend(self, rows: Sequence[Any]) -> int:
        """Number and keep `rows`; returns the id of the first."""
        first = self.next_id
        n = len(rows)
        if not n:
            return first
        self.next_id += n
        if self._lease is not None and self.next_id > self._leased:
            self._leased = self.next_id + LEASE_BLOCK
            self._lease(self._leased)
        if self.size <= 0:
            return first
        self.rows.extend(rows)
        now = self.clock()
        if now >= self._next_mark:
            self._next_mark = now + MARK_SECONDS
            self._marks.append((first, now))
            self._trim()
        return first

    @property
    def published(self) -> int:
        """Rows published this run (kept or not)."""
        return self.next_id - self.run_first_id

    def _trim(self) -> None:
        """Drop the marks of evicted rows, remembering the latest time they may have."""
        oldest = self.oldest_id
        marks = self._marks
        while len(marks) > 1 and marks[1][0] <= oldest:
            self._evicted_time = marks.popleft()[1] + MARK_SECONDS
        if marks and marks[0][0] < oldest:
            self._evicted_time = marks[0][1] + MARK_SECONDS

    def _as_dict(self, row: Any) -> dict[str, Any]:
        if isinstance(row, dict):
            return row
        return dict(zip(self.columns or (), row, strict=False))

    def since_id(self, after: int) -> ResultReplay:
        """The rows after row `after` (its id) still kept, and what is gone."""
        oldest = self.oldest_id
        gone = None
        if after >= self.next_id:  # an id this run never gave: from a run without a store
            start = oldest
            gone = {"since": after, "first_id": start, "rows": None, "reason": "unknown row id"}
        elif after + 1 < oldest:
            start = oldest
            exact = after + 1 >= self.run_first_id
            gone = {
                "since": after,
                "first_id": start,
                "rows": oldest - after - 1 if exact else None,
                "reason": "no longer kept" if exact else "before the gateway restarted",
            }
        else:
            start = after + 1
        return self._from(start, gone)

    def since_time(self, t: float) -> ResultReplay:
        """The rows published after `t` (epoch seconds) still kept (and up to MARK_SECONDS
        before it), and what is gone."""
        self._trim()
        start = self.next_id
        for first, at in self._marks:
            if at + MARK_SECONDS > t:
                start = max(first, self.oldest_id)
                break
        gone = None
        if self._evicted_time is not None and self._evicted_time > t:
            gone = {"since": t, "first_id": start, "rows": None, "reason": "no longer kept"}
        return self._from(start, gone)

    def _from(self, start: int, gone: dict[str, Any] | None) -> ResultReplay:
        rows = [self._as_dict(r) for r in islice(self.rows, start - self.oldest_id, None)]
        return ResultReplay(rows, start, gone)
