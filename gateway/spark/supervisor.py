"""The daemon's Spark jobs (`POST /queries` with `"engine": "spark"`): start, supervise, stop.

Spark's Python API blocks, so every call into it runs in a worker thread. Each job has one
supervising task, owned by `SparkQueries` (cancelled on stop and on exit), which restarts a
failed job from its checkpoint with backoff, up to `max_restarts` times. Result rows arrive on
Spark's callback thread and are handed to the event loop into a bounded per-query buffer that
drops the oldest rows when full and counts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.spark.session import SparkConfig, get_session
from gateway.spark.sinks import CallbackSink, Sink, sink_from_spec
from gateway.spark.sources import StaticTable
from gateway.spark.streaming import DEFAULT_WATERMARK, StreamingJob

log = logging.getLogger("gateway.spark")


class ResultBuffer:
    """Bounded; when full the oldest rows go first (`dropped` counts them)."""

    def __init__(self, bound: int) -> None:
        self.rows: deque[dict[str, Any]] = deque(maxlen=bound)
        self.dropped = 0
        self.total = 0
        self.changed = asyncio.Event()

    def extend(self, rows: list[dict[str, Any]]) -> None:
        overflow = len(self.rows) + len(rows) - (self.rows.maxlen or 0)
        if overflow > 0:
            self.dropped += overflow
        self.rows.extend(rows)
        self.total += len(rows)
        self.changed.set()

    def drain(self) -> list[dict[str, Any]]:
        out = list(self.rows)
        self.rows.clear()
        self.changed.clear()
        return out


@dataclass
class _Entry:
    job: StreamingJob
    buffer: ResultBuffer
    restarts: int = 0
    task: asyncio.Task | None = None
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


class SparkQueries:
    """Use as `async with SparkQueries(...) as spark_queries:`; every job stops on exit."""

    def __init__(
        self,
        config: SparkConfig | None = None,
        *,
        archive_root: str | Path,
        state_dir: str | Path,
        tables: Mapping[str, str] | None = None,
        result_bound: int = 10_000,
        max_restarts: int = 3,
        poll_s: float = 2.0,
        trigger: str = "10 seconds",
        watermark: str = DEFAULT_WATERMARK,
    ) -> None:
        self.config = config or SparkConfig()
        self.archive_root = Path(archive_root)
        self.state_dir = Path(state_dir)
        self.table_files = dict(tables or {})
        self.result_bound = result_bound
        self.max_restarts = max_restarts
        self.poll_s = poll_s
        self.trigger = trigger
        self.watermark = watermark
        self._jobs: dict[str, _Entry] = {}
        self._tables: dict[str, StaticTable] = {}

    async def __aenter__(self) -> SparkQueries:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for qid in list(self._jobs):
            await self.stop(qid)

    async def start(
        self,
        query_id: str,
        sql: str,
        *,
        stream: str = "traffic",
        sink: str | None = None,
        on_rows: Callable[[list[dict[str, Any]]], None] | None = None,
    ) -> dict[str, Any]:
        """Compile and start; a bad query raises QueryError before any job runs. `on_rows` is
        called on the event loop with each batch of result rows (the daemon's result hub)."""
        if query_id in self._jobs:
            raise ValueError(f"query {query_id!r} is already running on Spark")
        loop = asyncio.get_running_loop()
        buffer = ResultBuffer(self.result_bound)

        def deliver(_batch: int, rows: list[dict[str, Any]]) -> None:
            loop.call_soon_threadsafe(buffer.extend, rows)
            if on_rows is not None:
                loop.call_soon_threadsafe(on_rows, rows)

        out: Sink = sink_from_spec(sink) if sink else CallbackSink(deliver)
        job = await asyncio.to_thread(self._make_job, query_id, sql, stream, out)
        entry = _Entry(job, buffer)
        self._jobs[query_id] = entry
        await asyncio.to_thread(job.start)
        entry.task = asyncio.create_task(self._supervise(query_id, entry), name=f"spark:{query_id}")
        entry.task.add_done_callback(_log_failure)
        return self.status(query_id)

    def _make_job(self, query_id: str, sql: str, stream: str, sink: Sink) -> StreamingJob:
        spark = get_session(self.config)
        for name, path in self.table_files.items():
            if name not in self._tables:
                self._tables[name] = StaticTable(name, path)
        return StreamingJob(
            spark,
            sql,
            self.archive_root / stream,
            sink=sink,
            checkpoint=self.state_dir / "spark" / query_id,
            stream=stream,
            tables=self._tables,
            watermark=self.watermark,
            trigger=self.trigger,
            name=f"fjords-{query_id}",
        )

    async def _supervise(self, query_id: str, entry: _Entry) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            st = await asyncio.to_thread(entry.job.status)
            if st["state"] != "failed":
                if st["state"] == "stopped":
                    return
                continue
            entry.error = st["error"]
            if entry.restarts >= self.max_restarts:
                log.error("spark query %s failed %d times: %s", query_id, entry.restarts + 1, st)
                return
            entry.restarts += 1
            log.warning(
                "spark query %s failed (%s); restart %d", query_id, entry.error, entry.restarts
            )
            await asyncio.sleep(min(60.0, 2.0**entry.restarts))
            await asyncio.to_thread(entry.job.start)  # resumes from the checkpoint

    def status(self, query_id: str) -> dict[str, Any]:
        """For `GET /queries/{id}`."""
        entry = self._jobs[query_id]
        st = entry.job.status()
        return {
            **st,
            "restarts": entry.restarts,
            "last_error": entry.error,
            "results_buffered": len(entry.buffer.rows),
            "results_total": entry.buffer.total,
            "results_dropped": entry.buffer.dropped,
        }

    def results(self, query_id: str) -> ResultBuffer:
        return self._jobs[query_id].buffer

    async def stop(self, query_id: str) -> None:
        entry = self._jobs.pop(query_id, None)
        if entry is None:
            return
        if entry.task is not None:
            entry.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await entry.task
        await asyncio.to_thread(entry.job.stop)


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("spark supervisor %s crashed", task.get_name(), exc_info=task.exception())
