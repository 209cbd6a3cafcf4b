"""Fan query results out to any number of live subscribers (SSE, NDJSON, WebSocket, MQTT).

The Fjord must never wait for a client: publishing appends to each subscriber's bounded buffer and
returns. A subscriber that falls behind loses its oldest rows, and is told how many it missed the
next time it reads (`Batch.missed`), so a slow client slows neither the Fjord nor other clients.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

DEFAULT_BUFFER = 10_000


@dataclass
class Batch:
    rows: list[dict[str, Any]]
    missed: int


class Subscription:
    """One client's view of one query's results; iterate with `async for batch in sub`."""

    def __init__(self, hub: ResultHub, query_id: str, buffer: int) -> None:
        self.hub = hub
        self.query_id = query_id
        self._rows: deque[dict[str, Any]] = deque()
        self._bound = buffer
        self._missed = 0
        self.missed_total = 0
        self._event = asyncio.Event()
        self.closed = False
        self.error: str | None = None  # why the query failed, once it has (then closed)

    def _offer(self, rows: list[dict[str, Any]]) -> None:
        buf = self._rows
        buf.extend(rows)
        over = len(buf) - self._bound
        if over > 0:
            for _ in range(over):
                buf.popleft()
            self._missed += over
            self.missed_total += over
            self.hub.missed_total += over
        self._event.set()

    def _close(self) -> None:
        self.closed = True
        self._event.set()

    def pending(self) -> int:
        return len(self._rows)

    async def next_batch(self, limit: int = 1000) -> Batch | None:
        """The next rows (waiting for some), or None once the query is gone."""
        while not self._rows and not self._missed:
            if self.closed:
                return None
            self._event.clear()
            await self._event.wait()
        n = min(limit, len(self._rows))
        rows = [self._rows.popleft() for _ in range(n)]
        missed, self._missed = self._missed, 0
        return Batch(rows, missed)

    def __aiter__(self) -> AsyncIterator[Batch]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Batch]:
        while (batch := await self.next_batch()) is not None:
            yield batch

    def close(self) -> None:
        self.hub.unsubscribe(self)


class ResultHub:
    def __init__(self, buffer: int = DEFAULT_BUFFER) -> None:
        self.buffer = buffer
        self._subs: dict[str, set[Subscription]] = {}
        self.published: dict[str, int] = {}
        self.errors: dict[str, str] = {}  # failed queries: their error, for late subscribers
        self.missed_total = 0  # rows any subscriber ever lost to a full buffer (never goes down)

    def subscribe(self, query_id: str, buffer: int | None = None) -> Subscription:
        sub = Subscription(self, query_id, buffer or self.buffer)
        error = self.errors.get(query_id)
        if error is not None:  # already failed: the stream says why and ends at once
            sub.error = error
            sub._close()
            return sub
        self._subs.setdefault(query_id, set()).add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.query_id)
        if subs is not None:
            subs.discard(sub)
        sub._close()

    def missed(self) -> dict[str, int]:
        """Rows each query's current subscribers missed (slow clients), for /metrics."""
        return {qid: sum(s.missed_total for s in subs) for qid, subs in self._subs.items()}

    def subscribers(self, query_id: str) -> int:
        return len(self._subs.get(query_id, ()))

    def publish(self, query_id: str, rows: list[dict[str, Any]]) -> None:
        self.published[query_id] = self.published.get(query_id, 0) + len(rows)
        for sub in self._subs.get(query_id, ()):
            sub._offer(rows)

    def close_all(self) -> None:
        """Shutdown: every subscriber's stream ends."""
        for qid in list(self._subs):
            for sub in self._subs.pop(qid):
                sub._close()

    def close_query(self, query_id: str) -> None:
        """The query was removed: every subscriber's stream ends."""
        for sub in self._subs.pop(query_id, set()):
            sub._close()
        self.published.pop(query_id, None)
        self.errors.pop(query_id, None)

    def fail_query(self, query_id: str, error: str) -> None:
        """The query failed: every subscriber gets `error` after its pending rows, then ends;
        later subscribers get it at once."""
        self.errors[query_id] = error
        for sub in self._subs.pop(query_id, set()):
            sub.error = error
            sub._close()
