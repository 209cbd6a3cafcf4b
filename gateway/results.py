"""Fan query results out to any number of live subscribers (SSE, NDJSON, WebSocket, MQTT).

The Fjord must never wait for a client: publishing appends to each subscriber's bounded buffer and
returns. A subscriber that falls behind loses its oldest rows, and is told how many it missed the
next time it reads (`Batch.missed`), so a slow client slows neither the Fjord nor other clients.

A query that goes down and comes back (a Spark job restarted by its supervisor) tells the
subscribers that asked for notices (`notices=True`: the HTTP and WebSocket clients) with an
`error` and then a `restarted` notice, each in its place among the rows.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fjords.output import json_objects
from gateway.sinks.ring import Lease, ReplayRing

DEFAULT_BUFFER = 10_000
DEFAULT_RING_ROWS = 1000  # rows per query kept for clients that reconnect (?since=)


def _default(o: object) -> object:
    if isinstance(o, float | int):
        return o
    return str(o)


def encode_row(row: dict[str, Any]) -> str:
    """A row as its JSON text, as every HTTP stream (SSE, NDJSON) and file sink writes it."""
    return json.dumps(row, default=_default)


@dataclass
class Batch:
    # dicts; for a subscription made with `encoded=True`, each row's JSON text (encode_row)
    rows: list[Any]
    missed: int
    first_id: int | None = None  # the row id of rows[0] (ids are consecutive)
    #: what happened to the query after these rows ({"event": "error" | "restarted", ...})
    notices: list[dict[str, Any]] = field(default_factory=list)


class Subscription:
    """One client's view of one query's results; iterate with `async for batch in sub`."""

    def __init__(
        self,
        hub: ResultHub,
        query_id: str,
        buffer: int,
        *,
        encoded: bool = False,
        notices: bool = False,
    ) -> None:
        self.hub = hub
        self.query_id = query_id
        # True: rows are kept (and handed out) as their JSON text, encoded once per query by
        # the hub for every such subscriber (the HTTP streams write nothing else).
        self.encoded = encoded
        self._rows: deque[Any] = deque()
        self._bound = buffer
        self._missed = 0
        self.missed_total = 0
        self._event = asyncio.Event()
        self.closed = False
        self.error: str | None = None  # why the query failed, once it has (then closed)
        self._head_id: int | None = None  # the row id of the oldest buffered row
        self.gone: dict[str, Any] | None = None  # replay asked for rows no longer kept
        self.is_client = True  # False for a result sink (its drops are counted as the sink's)
        self.wants_notices = notices
        #: (rows offered before it, the notice): handed out once the rows before it are
        self._notices: deque[tuple[int, dict[str, Any]]] = deque()
        self._offered = 0  # rows ever offered
        self._passed = 0  # rows ever handed out or dropped

    def _offer(self, rows: Sequence[Any], first_id: int | None = None) -> None:
        buf = self._rows
        if not buf:
            self._head_id = first_id
        buf.extend(rows)
        self._offered += len(rows)
        over = len(buf) - self._bound
        if over > 0:
            self._passed += over
            for _ in range(over):
                buf.popleft()
            self._missed += over
            self.missed_total += over
            if self.is_client:
                self.hub.missed_total += over
            if self._head_id is not None:
                self._head_id += over
        self._event.set()

    def _notify(self, notice: dict[str, Any]) -> None:
        self._notices.append((self._offered, notice))
        self._event.set()

    def _close(self) -> None:
        self.closed = True
        self._event.set()

    def pending(self) -> int:
        return len(self._rows)

    async def next_batch(self, limit: int = 1000) -> Batch | None:
        """The next rows (waiting for some), or None once the query is gone."""
        while not self._rows and not self._missed and not self._notices:
            if self.closed:
                return None
            self._event.clear()
            await self._event.wait()
        notices = self._notices
        if notices and notices[0][0] <= self._passed:  # every row before it is out
            return Batch([], 0, None, [notices.popleft()[1]])
        n = min(limit, len(self._rows))
        if notices:
            n = min(n, notices[0][0] - self._passed)
        rows = [self._rows.popleft() for _ in range(n)]
        self._passed += n
        missed, self._missed = self._missed, 0
        first_id = self._head_id
        if first_id is not None:
            self._head_id = first_id + n
        return Batch(rows, missed, first_id)

    def drain(self) -> Batch:
        """Everything buffered, at once, without waiting (a sink's last flush)."""
        rows = list(self._rows)
        self._rows.clear()
        self._passed += len(rows)
        missed, self._missed = self._missed, 0
        first_id, self._head_id = self._head_id, None
        return Batch(rows, missed, first_id)

    def __aiter__(self) -> AsyncIterator[Batch]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Batch]:
        while (batch := await self.next_batch()) is not None:
            yield batch

    def close(self) -> None:
        self.hub.unsubscribe(self)


class ResultHub:
    def __init__(self, buffer: int = DEFAULT_BUFFER, ring_rows: int = DEFAULT_RING_ROWS) -> None:
        self.buffer = buffer
        self.ring_rows = ring_rows
        self.rings: dict[str, ReplayRing] = {}  # the last rows of each query, numbered
        self._subs: dict[str, set[Subscription]] = {}
        self.errors: dict[str, str] = {}  # failed queries: their error, for late subscribers
        self.missed_total = 0  # rows any subscriber ever lost to a full buffer (never goes down)
        self._flush_due = False  # rows were offered to a subscriber since `flush_due()`
        self.encoded_rows = 0  # rows encoded to JSON (once per query, however many clients)

    @property
    def published(self) -> dict[str, int]:
        """Rows each query published this run."""
        return {qid: ring.published for qid, ring in self.rings.items()}

    def open_ring(
        self,
        query_id: str,
        first_id: int = 1,
        columns: list[str] | None = None,
        lease: Lease | None = None,
    ) -> ReplayRing:
        """The query's replay ring, its ids starting at `first_id` (after those an earlier run
        used) and `lease` persisting the ids this run may use."""
        ring = self.rings.get(query_id)
        if ring is None:
            ring = self.rings[query_id] = ReplayRing(self.ring_rows, first_id, lease=lease)
        if columns is not None:
            ring.columns = columns
        return ring

    def subscribe(
        self,
        query_id: str,
        buffer: int | None = None,
        *,
        since_id: int | None = None,
        since_time: float | None = None,
        encoded: bool = False,
        notices: bool = False,
    ) -> Subscription:
        """A new subscriber; with `since_id` (a row id) or `since_time` (epoch seconds) it first
        gets the kept rows after it, and `sub.gone` says when some it asked for are gone.
        `encoded`: it gets each row's JSON text (`encode_row`) instead of the dict. `notices`:
        it is told when the query goes down and comes back (`Batch.notices`)."""
        sub = Subscription(self, query_id, buffer or self.buffer, encoded=encoded, notices=notices)
        ring = self.rings.get(query_id)
        if ring is not None and (since_id is not None or since_time is not None):
            replay = (
                ring.since_id(since_id)
                if since_id is not None
                else ring.since_time(since_time or 0.0)
            )
            sub.gone = replay.gone
            if replay.rows:
                rows = [encode_row(r) for r in replay.rows] if encoded else replay.rows
                sub._offer(rows, replay.first_id)
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
        return {
            qid: sum(s.missed_total for s in subs if s.is_client)
            for qid, subs in self._subs.items()
        }

    def subscribers(self, query_id: str) -> int:
        return len(self._subs.get(query_id, ()))

    def publish(self, query_id: str, rows: list[dict[str, Any]]) -> None:
        first_id = self.open_ring(query_id).extend(rows)
        subs = self._subs.get(query_id)
        if subs:
            self._fan_out(subs, rows, first_id)

    def publish_tuples(self, query_id: str, columns: list[str], rows: list[tuple]) -> None:
        """The Fjord's rows: kept in the ring as they are; made dicts only for subscribers."""
        ring = self.rings.get(query_id) or self.open_ring(query_id, columns=columns)
        first_id = ring.extend(rows)
        subs = self._subs.get(query_id)
        if subs:
            self._fan_out(subs, [dict(zip(columns, r, strict=True)) for r in rows], first_id)

    def publisher(self, query_id: str, columns: Sequence[str]) -> Callable[[list[tuple]], None]:
        """`publish_tuples` for one query, as the Fjord's batch callback: the ring and the
        counters are looked up once, not per batch (the Fjord calls it for every query a batch
        reaches; nothing is made for a query nobody follows but its ring entry)."""
        cols = list(columns)
        ring = self.rings.get(query_id) or self.open_ring(query_id, columns=cols)
        all_subs = self._subs
        encode = json_objects(cols)

        def publish(rows: list[tuple]) -> None:
            first_id = ring.extend(rows)
            subs = all_subs.get(query_id)
            if subs:
                self._fan_out_tuples(subs, cols, encode, rows, first_id)

        return publish

    def _fan_out_tuples(
        self,
        subs: set[Subscription],
        cols: list[str],
        encode: Callable[[list[tuple]], list[str] | None],
        rows: list[tuple],
        first_id: int,
    ) -> None:
        """`_fan_out` of the Fjord's tuples: dicts made only for subscribers that take dicts,
        the JSON texts encoded from the tuples at once (`fjords.output.json_objects`: the
        text of `encode_row` of the dict; json.dumps where it does not know a value)."""
        dicts: list[dict[str, Any]] = []

        def as_dicts() -> list[dict[str, Any]]:
            if not dicts:
                dicts.extend(dict(zip(cols, r, strict=True)) for r in rows)
            return dicts

        def as_texts() -> list[str]:
            texts = encode(rows)
            return texts if texts is not None else [encode_row(r) for r in as_dicts()]

        self._offer_all(subs, first_id, as_dicts, as_texts)

    def _fan_out(self, subs: set[Subscription], rows: list[dict[str, Any]], first_id: int) -> None:
        """One query's new rows to each subscriber: dicts, or JSON texts encoded once for all
        the subscribers that want text (rather than once per client)."""
        self._offer_all(subs, first_id, lambda: rows, lambda: [encode_row(r) for r in rows])

    def _offer_all(
        self,
        subs: set[Subscription],
        first_id: int,
        as_dicts: Callable[[], list[dict[str, Any]]],
        as_texts: Callable[[], list[str]],
    ) -> None:
        """Each subscriber gets the rows in its form, each form made once (when wanted)."""
        dicts: list[dict[str, Any]] | None = None
        texts: list[str] | None = None
        for sub in subs:
            if sub.encoded:
                if texts is None:
                    texts = as_texts()
                    self.encoded_rows += len(texts)
                sub._offer(texts, first_id)
            else:
                if dicts is None:
                    dicts = as_dicts()
                sub._offer(dicts, first_id)
        self._flush_due = True

    def flush_due(self) -> bool:
        """Whether rows were offered to a subscriber since the last call (the scheduler then
        yields to the event loop, so they are written to clients now: `Scheduler.yield_when`)."""
        due, self._flush_due = self._flush_due, False
        return due

    def close_all(self) -> None:
        """Shutdown: every subscriber's stream ends."""
        for qid in list(self._subs):
            for sub in self._subs.pop(qid):
                sub._close()

    def close_query(self, query_id: str) -> None:
        """The query was removed: every subscriber's stream ends."""
        for sub in self._subs.pop(query_id, set()):
            sub._close()
        self.errors.pop(query_id, None)
        self.rings.pop(query_id, None)

    def notify(self, query_id: str, event: str, data: dict[str, Any]) -> None:
        """The query went down (`error`, with `restarting`) or runs again (`restarted`): each
        subscriber that asked for notices gets `{"event": event, **data}` after the rows it
        already has."""
        for sub in self._subs.get(query_id, ()):
            if sub.wants_notices:
                sub._notify({"event": event, **data})

    def fail_query(self, query_id: str, error: str) -> None:
        """The query failed: every subscriber gets `error` after its pending rows, then ends;
        later subscribers get it at once."""
        self.errors[query_id] = error
        for sub in self._subs.pop(query_id, set()):
            sub.error = error
            sub._close()
