"""The end of a query: hands result rows to callbacks and/or an asyncio queue.

Result consumers are outside the Fjord's control, so the asyncio queue is bounded and drops the
oldest rows when full (counted in `dropped`): a slow consumer never slows the Fjord.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fjords.runtime.operators.base import Operator
from fjords.runtime.progress import Watermark
from fjords.runtime.queues import Queue

if TYPE_CHECKING:  # imported where a queue is attached: a batch run never needs asyncio
    import asyncio

log = logging.getLogger(__name__)

RowCallback = Callable[[tuple], None]
_NONE: tuple = ()  # a consumer list until its first consumer (most sinks have one kind)


class QuerySink(Operator):
    kind = "sink"
    __slots__ = ("callbacks", "batch_callbacks", "async_queues", "dropped", "rows", "watermark")

    def __init__(self, input: Queue, **kw: Any) -> None:
        super().__init__([input], [], **kw)
        # Each consumer list is an empty tuple until its first consumer (an empty list is
        # 56 bytes, and one sink per query at 10,000 queries).
        self.callbacks: list[RowCallback] = _NONE  # type: ignore[assignment]
        self.batch_callbacks: list[Callable[[list[tuple]], None]] = _NONE  # type: ignore[assignment]
        self.async_queues: list[asyncio.Queue] = _NONE  # type: ignore[assignment]
        self.dropped = 0
        self.rows = 0
        self.watermark = float("-inf")

    def add_callback(self, fn: RowCallback) -> None:
        self.callbacks = [*self.callbacks, fn]

    def add_batch_callback(self, fn: Callable[[list[tuple]], None]) -> None:
        """Called with lists of rows: the cheapest way to consume many results."""
        self.batch_callbacks = [*self.batch_callbacks, fn]

    def attach_queue(self, maxsize: int = 10_000) -> asyncio.Queue:
        import asyncio

        q: asyncio.Queue = asyncio.Queue(maxsize=maxsize)
        self.async_queues = [*self.async_queues, q]
        return q

    def transition(self) -> bool:
        items = self.inputs[0].get_batch(self.batch)
        if not items:
            return False
        rows = [i for i in items if i.__class__ is tuple]
        if len(rows) != len(items):
            for i in items:
                if i.__class__ is Watermark:
                    self.watermark = max(self.watermark, i.time)
        if rows:
            self.deliver(rows)
        return True

    def deliver(self, rows: list[tuple]) -> None:
        """Hand one batch of result rows to every consumer (called by `transition`, or directly
        by a fused delivery from the stream router). An asyncio queue that is full drops its
        oldest rows, counted in `dropped` (logged the first time)."""
        self.rows += len(rows)
        self.tuples_in += len(rows)
        for bcb in self.batch_callbacks:
            bcb(rows)
        for cb in self.callbacks:
            for r in rows:
                cb(r)
        for q in self.async_queues:
            for r in rows:
                if q.full():
                    q.get_nowait()
                    self.dropped += 1
                    if self.dropped == 1:
                        log.warning(
                            "%s: a result consumer is slow; dropping its oldest rows", self.name
                        )
                q.put_nowait(r)
