"""The daemon's Spark jobs (`POST /queries` with `"engine": "spark"`): start, supervise, stop.

Spark's Python API blocks, so every call into it runs in a worker thread. `launch()` returns at
once with the job `starting` (a first job starts the JVM: tens of seconds) and starts it in the
background; `status()` then says `starting`, `running` or `failed` with the reason, and
`on_failed(reason, ran)` is called when it fails for good (`ran`: it had started). `start()` is the same, awaited. Each job has one
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
from functools import partial
from pathlib import Path
from typing import Any

from fjords.supervision import log_task_failure
from gateway.spark.session import SparkConfig, get_session
from gateway.spark.sinks import CallbackSink, SparkSink, sink_from_spec
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
    job: StreamingJob | None
    buffer: ResultBuffer
    restarts: int = 0
    task: asyncio.Task | None = None
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    state: str = "starting"  # starting | running | failed (for good) | stopped
    on_failed: Callable[[str, bool], None] | None = None


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
        self._cleanups: set[asyncio.Task[None]] = set()  # jobs stopped while still starting

    async def __aenter__(self) -> SparkQueries:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for qid in list(self._jobs):
            await self.stop(qid)
        await asyncio.gather(*self._cleanups, return_exceptions=True)

    def launch(
        self,
        query_id: str,
        sql: str,
        *,
        stream: str = "traffic",
        right_stream: str | None = None,
        on_rows: Callable[[list[dict[str, Any]]], None] | None = None,
        on_failed: Callable[[str, bool], None] | None = None,
    ) -> dict[str, Any]:
        """Start the job in the background and return at once (`state: starting`); a job that
        cannot start, or fails more than `max_restarts` times, ends `failed` and `on_failed` is
        called with the reason and whether the job had run. `right_stream`: a join's second
        stream, read from its own archive."""
        if query_id in self._jobs:
            raise ValueError(f"query {query_id!r} is already running on Spark")
        entry = _Entry(None, ResultBuffer(self.result_bound), on_failed=on_failed)
        self._jobs[query_id] = entry
        streams = (stream, right_stream)
        entry.task = asyncio.create_task(
            self._launch(query_id, entry, sql, streams, on_rows), name=f"spark:{query_id}"
        )
        entry.task.add_done_callback(partial(log_task_failure, logger=log))
        return self.status(query_id)

    async def _launch(
        self,
        query_id: str,
        entry: _Entry,
        sql: str,
        stream: str | tuple[str, str | None],
        on_rows: Callable[[list[dict[str, Any]]], None] | None,
    ) -> None:
        try:
            await self._begin(entry, query_id, sql, stream, None, on_rows)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a query Spark refuses, no JVM, no archive...
            self._failed(query_id, entry, _first_line(e), ran=False)
            return
        await self._supervise(query_id, entry)

    async def _begin(
        self,
        entry: _Entry,
        query_id: str,
        sql: str,
        stream: str | tuple[str, str | None],
        sink: str | None,
        on_rows: Callable[[list[dict[str, Any]]], None] | None,
    ) -> None:
        """Compile and start the job (in worker threads; a cancel waits for the thread)."""
        loop = asyncio.get_running_loop()
        buffer = entry.buffer

        def deliver(_batch: int, rows: list[dict[str, Any]]) -> None:
            loop.call_soon_threadsafe(buffer.extend, rows)
            if on_rows is not None:
                loop.call_soon_threadsafe(on_rows, rows)

        out: SparkSink = sink_from_spec(sink) if sink else CallbackSink(deliver)
        entry.job = await _in_thread(self._make_job, query_id, sql, stream, out)
        await _in_thread(entry.job.start)
        entry.state = "running"

    def _failed(self, query_id: str, entry: _Entry, reason: str, *, ran: bool) -> None:
        entry.state = "failed"
        entry.error = reason
        log.error("spark query %s failed: %s", query_id, reason)
        if entry.on_failed is not None:
            entry.on_failed(reason, ran)

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
        entry = _Entry(None, ResultBuffer(self.result_bound))
        await self._begin(entry, query_id, sql, stream, sink, on_rows)
        self._jobs[query_id] = entry
        entry.task = asyncio.create_task(self._supervise(query_id, entry), name=f"spark:{query_id}")
        entry.task.add_done_callback(partial(log_task_failure, logger=log))
        return self.status(query_id)

    def _make_job(
        self, query_id: str, sql: str, stream: str | tuple[str, str | None], sink: SparkSink
    ) -> StreamingJob:
        """`stream`: its name, or (name, a join's second stream or None)."""
        stream, right = (stream, None) if isinstance(stream, str) else stream
        spark = get_session(self.config)
        for name, path in self.table_files.items():
            if name not in self._tables:
                self._tables[name] = StaticTable(name, path)
        return StreamingJob(
            spark,
            sql,
            self.archive_root,  # the fleet's root: every gateway's segments of `stream`
            sink=sink,
            checkpoint=self.state_dir / "spark" / query_id,
            stream=stream,
            right=None if right in (None, stream) else (right, self.archive_root),
            tables=self._tables,
            watermark=self.watermark,
            trigger=self.trigger,
            name=f"fjords-{query_id}",
        )

    async def _supervise(self, query_id: str, entry: _Entry) -> None:
        assert entry.job is not None
        while True:
            await asyncio.sleep(self.poll_s)
            st = await asyncio.to_thread(entry.job.status)
            if st["state"] != "failed":
                if st["state"] == "stopped":
                    entry.state = "stopped"
                    return
                continue
            entry.error = st["error"]
            if entry.restarts >= self.max_restarts:
                log.error("spark query %s failed %d times: %s", query_id, entry.restarts + 1, st)
                reason = f"failed {entry.restarts + 1} times: {st['error']}"
                self._failed(query_id, entry, reason, ran=True)
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
        if entry.job is None or entry.state == "starting":
            st: dict[str, Any] = {"engine": "spark", "state": entry.state}
            if entry.job is not None:
                st["columns"] = list(entry.job.query.columns)
        else:
            try:
                st = entry.job.status()
            except Exception as e:  # noqa: BLE001 - the JVM gone: say so, never a 500
                st = {"engine": "spark", "state": "failed", "error": _first_line(e)}
            if entry.state == "failed":
                st["state"] = "failed"
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
        """Stop the job. One still starting is stopped in the background once its start
        returns (a Spark call cannot be interrupted); `__aexit__` waits for those."""
        entry = self._jobs.pop(query_id, None)
        if entry is None:
            return
        if entry.state == "starting":
            task = asyncio.create_task(self._stop(entry), name=f"spark-stop:{query_id}")
            self._cleanups.add(task)
            task.add_done_callback(self._cleanups.discard)
            task.add_done_callback(partial(log_task_failure, logger=log))
            return
        await self._stop(entry)

    async def _stop(self, entry: _Entry) -> None:
        if entry.task is not None:
            entry.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await entry.task
        if entry.job is not None:
            await asyncio.to_thread(entry.job.stop)


async def _in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` in a worker thread; cancelled, it still waits for the thread to return (so
    whoever stops the job next sees it started, or not, never half-way)."""
    fut = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await fut
        raise


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__
