"""What every result sink shares: a bounded subscription to its query's results (the oldest rows
go when it is full, counted), batching, and the state `GET /queries/{id}` shows.

A sink is one more subscriber of the result hub, so however slow or dead its destination, the
Fjord and every other query and client go on: the sink alone falls behind and counts what it
drops (`fjords_dropped_total{stage="sink_<type>", reason=...}`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec

from gateway.results import Batch, Subscription
from gateway.sinks.spec import SinkSpec


class ResultSink:
    """One sink of one query. Subclasses implement `run()` (until cancelled) and `close()`."""

    kind = "sink"

    def __init__(self, query_id: str, spec: SinkSpec, sub: Subscription | None) -> None:
        self.query_id = query_id
        self.spec = spec
        self.sub = sub
        if sub is not None:
            sub.is_client = False  # its drops are this sink's (stage sink_*), not a client's
        self.rows_sent = 0
        self.dropped: dict[str, int] = {}
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.last_sent_at: float | None = None
        self._queue_missed = 0

    @property
    def stage(self) -> str:
        return f"sink_{self.kind}"

    def drop(self, reason: str, n: int) -> None:
        if n > 0:
            self.dropped[reason] = self.dropped.get(reason, 0) + n

    def error(self, message: str) -> None:
        self.last_error = message
        self.last_error_at = time.time()

    def sent(self, n: int) -> None:
        self.rows_sent += n
        self.last_sent_at = time.time()

    def describe(self) -> dict[str, Any]:
        out = msgspec.to_builtins(self.spec)
        out.update(
            rows_sent=self.rows_sent,
            dropped=sum(self.dropped.values()),
            dropped_by_reason=dict(self.dropped),
            queued=self.sub.pending() if self.sub is not None else 0,
            last_error=self.last_error,
            last_error_at=self.last_error_at,
            last_sent_at=self.last_sent_at,
        )
        return out

    def _take(self, batch: Batch) -> list[dict[str, Any]]:
        """Rows of a batch; what the bounded queue dropped before it is counted."""
        self.drop("queue_full", batch.missed)
        self._queue_missed += batch.missed
        return batch.rows

    async def collect(
        self, max_rows: int, linger_s: float, first_wait: float | None = None
    ) -> list[dict[str, Any]] | None:
        """Up to `max_rows`, waiting for the first (at most `first_wait`: then []), then at
        most `linger_s` for more; None once the query is gone (and nothing is left). Rows are
        taken only when returned: cancelling a wait loses none."""
        assert self.sub is not None
        try:
            first = await asyncio.wait_for(self.sub.next_batch(max_rows), first_wait)
        except TimeoutError:
            return []
        if first is None:
            return None
        rows = self._take(first)
        deadline = asyncio.get_running_loop().time() + linger_s
        while len(rows) < max_rows:
            if self.sub.pending():
                batch = await self.sub.next_batch(max_rows - len(rows))
            else:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0 or self.sub.closed:
                    break
                try:
                    batch = await asyncio.wait_for(self.sub.next_batch(max_rows - len(rows)), left)
                except TimeoutError:
                    break
            if batch is None:
                break
            rows += self._take(batch)
        return rows

    def take_pending(self) -> list[dict[str, Any]]:
        """Everything still queued, at once (for the final flush)."""
        return self._take(self.sub.drain()) if self.sub is not None else []

    async def run(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        """Flush what can be flushed; called once, after `run()` was cancelled."""
