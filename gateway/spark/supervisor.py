"""The daemon's Spark jobs (`POST /queries` with `"engine": "spark"`): start, supervise, stop.

Spark's Python API blocks, so every call into it runs in a worker thread. `launch()` returns at
once with the job `starting` (a first job starts the JVM: tens of seconds) and starts it in the
background; `status()` then says `starting`, `running` or `failed` with the reason, and
`on_failed(reason, ran)` is called when it fails for good (`ran`: it had started). `start()` is
the same, awaited. Each job has one supervising task, owned by `SparkQueries` (cancelled on stop
and on exit), which restarts a failed job from its checkpoint with capped exponential backoff,
up to `max_restarts` times. A status call that raises (the JVM killed, the Connect server gone)
is the job failing, not the supervisor's: the dead session is discarded and the job made again
on a fresh one (a new JVM in-process). `on_event("error" | "restarted", data)` tells the query's
subscribers, and `health()` names the jobs that are down.

Result rows: in-process (`[spark] master`), Spark's callback thread hands each micro-batch to
the event loop. Under Spark Connect (`[spark] remote`) the batch function runs on the server,
so it writes each batch's rows as Parquet to `<state>/spark/<qid>/results/batch=<id>/`
(overwritten when a batch is replayed, so a replay changes nothing), and the supervisor reads
the new complete batches in order on each poll (the server sends no event the gateway could
wait on; the state directory, like the archive, is storage the server and the gateway share).
Either way a batch id is delivered once, so a restart from the checkpoint repeats no row. Rows
go into a bounded per-query buffer that drops the oldest rows when full and counts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from fjords.supervision import log_task_failure
from gateway.spark.session import SparkConfig, discard_session, get_session, session_alive
from gateway.spark.sinks import CallbackSink, ParquetSink, SparkSink, sink_from_spec
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


Deliver = Callable[[int, list[dict[str, Any]]], None]
_BATCH_DIR = re.compile(r"batch=(\d+)")


class BatchFiles:
    """Under Spark Connect, a job's way back: the `batch=<id>` directories its batch function
    wrote on the server, each delivered once, in order, when complete (`_SUCCESS`). Those that
    are there when it is made are an earlier run's (already delivered then). Delivered ones are
    removed but the last (a replay of it overwrites it; its id is not delivered again)."""

    def __init__(self, path: Path, deliver: Deliver) -> None:
        self.path = path
        self.deliver = deliver
        done = self._complete()
        self.last = done[-1] if done else -1

    def _complete(self) -> list[int]:
        if not self.path.is_dir():
            return []
        ids = []
        for d in self.path.iterdir():
            m = _BATCH_DIR.fullmatch(d.name)
            if m and (d / "_SUCCESS").exists():
                ids.append(int(m.group(1)))
        return sorted(ids)

    def poll(self) -> int:
        """Deliver the batches completed since the last call; returns how many."""
        import pyarrow.parquet as pq

        from gateway.spark.batch import sort_rows

        new = [i for i in self._complete() if i > self.last]
        for i in new:
            table = pq.read_table(self.path / f"batch={i}")  # (skips _SUCCESS)
            rows = sort_rows(table.to_pylist())
            if rows:
                self.deliver(i, rows)
            self.last = i
        if new:
            for d in self.path.iterdir():
                m = _BATCH_DIR.fullmatch(d.name)
                if m and int(m.group(1)) < self.last:
                    shutil.rmtree(d, ignore_errors=True)
        return len(new)


@dataclass
class _Entry:
    job: StreamingJob | None
    buffer: ResultBuffer
    #: what the job is made from again after a crash: (SQL, (stream, a join's second stream))
    spec: tuple[str, tuple[str, str | None]] = ("", ("traffic", None))
    restarts: int = 0
    task: asyncio.Task | None = None
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    state: str = "starting"  # starting | running | restarting | failed (for good) | stopped
    on_failed: Callable[[str, bool], None] | None = None
    on_event: Callable[[str, dict[str, Any]], None] | None = None
    sink: SparkSink | None = None  # kept across restarts: it knows the batch ids delivered
    files: BatchFiles | None = None  # under Connect: the results the server wrote
    #: the job's status as the supervisor last polled it (off the event loop), for /metrics
    polled: dict[str, Any] = field(default_factory=dict)


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
        max_restarts: int | None = None,
        poll_s: float | None = None,
        trigger: str | None = None,
        watermark: str = DEFAULT_WATERMARK,
    ) -> None:
        self.config = config or SparkConfig()
        self.archive_root = Path(archive_root)
        self.state_dir = Path(state_dir)
        self.table_files = dict(tables or {})
        self.result_bound = result_bound
        #: unset: the config's ([spark] max_restarts, poll_s, restart_backoff_s / _max_s)
        self.max_restarts = self.config.max_restarts if max_restarts is None else max_restarts
        self.poll_s = self.config.poll_s if poll_s is None else poll_s
        self.trigger = self.config.trigger if trigger is None else trigger
        self.watermark = watermark
        #: a status call slower than this counts as the driver gone (a hung JVM or server)
        self.status_timeout_s = max(30.0, 10 * self.poll_s)
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
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Start the job in the background and return at once (`state: starting`); a job that
        cannot start, or fails more than `max_restarts` times, ends `failed` and `on_failed` is
        called with the reason and whether the job had run. `on_event("error", {"error",
        "restarting"})` when a running job went down, `on_event("restarted", {"restarts"})`
        when it runs again. `right_stream`: a join's second stream, read from its own archive."""
        if query_id in self._jobs:
            raise ValueError(f"query {query_id!r} is already running on Spark")
        entry = _Entry(
            None,
            ResultBuffer(self.result_bound),
            spec=(sql, (stream, right_stream)),
            on_failed=on_failed,
            on_event=on_event,
        )
        self._jobs[query_id] = entry
        entry.task = asyncio.create_task(
            self._launch(query_id, entry, on_rows), name=f"spark:{query_id}"
        )
        entry.task.add_done_callback(partial(log_task_failure, logger=log))
        return self.status(query_id)

    async def _launch(
        self,
        query_id: str,
        entry: _Entry,
        on_rows: Callable[[list[dict[str, Any]]], None] | None,
    ) -> None:
        try:
            await self._begin(entry, query_id, None, on_rows)
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

        if sink:
            entry.sink = sink_from_spec(sink)
        elif self.config.remote is not None:
            results = self.state_dir / "spark" / query_id / "results"
            entry.files = BatchFiles(results, deliver)
            entry.sink = ParquetSink(str(results))
        else:
            entry.sink = CallbackSink(deliver)
        sql, streams = entry.spec
        entry.job = await _in_thread(self._make_job, query_id, sql, streams, entry.sink)
        await _in_thread(entry.job.start)
        entry.polled = await _in_thread(entry.job.status)  # /metrics has it before the 1st poll
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
        entry = _Entry(None, ResultBuffer(self.result_bound), spec=(sql, (stream, None)))
        await self._begin(entry, query_id, sink, on_rows)
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
        if not session_alive(spark):  # its driver died with no job of ours there to notice
            log.warning("the Spark session is dead; making a new one")
            discard_session(spark)
            self._tables.clear()
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
        while True:
            await asyncio.sleep(self.poll_s)
            failure = await self._check(query_id, entry)
            if entry.state == "stopped":
                return
            if failure is not None and not await self._heal(query_id, entry, failure):
                return

    async def _check(self, query_id: str, entry: _Entry) -> str | None:
        """The job's failure, if it failed; under Connect, its new result batches delivered."""
        assert entry.job is not None
        try:
            async with asyncio.timeout(self.status_timeout_s):
                st = await asyncio.to_thread(entry.job.status)
        except TimeoutError:
            return f"the Spark driver did not answer within {self.status_timeout_s:g} s"
        except Exception as e:  # noqa: BLE001 - py4j/gRPC: the JVM or the server is gone
            return f"the Spark driver is gone: {_first_line(e)}"
        entry.polled = st
        if st["state"] == "stopped":
            entry.state = "stopped"
            return None
        if entry.files is not None:  # the batches it completed, even one that then failed
            try:
                await asyncio.to_thread(entry.files.poll)
            except Exception as e:  # noqa: BLE001 - a batch unreadable now is read next time
                log.warning("spark query %s: its results could not be read yet: %s", query_id, e)
        return st["error"] if st["state"] == "failed" else None

    async def _heal(self, query_id: str, entry: _Entry, failure: str) -> bool:
        """Restart the job from its checkpoint (on a fresh session if its driver died), with
        capped exponential backoff. Each outage is one restart (`restarts`); within it, starting
        again is tried `restart_attempts` times (the server may take a while to come back).
        False when it failed for good: more than `max_restarts` outages, or no start."""
        entry.error = failure
        if entry.restarts >= self.max_restarts:  # its subscribers get the final error
            self._failed(query_id, entry, f"failed {entry.restarts + 1} times: {failure}", ran=True)
            return False
        entry.state = "restarting"
        log.warning("spark query %s is down: %s", query_id, failure)
        if entry.on_event is not None:
            entry.on_event("error", {"error": failure, "restarting": True})
        entry.restarts += 1
        cfg = self.config
        for attempt in range(1, cfg.restart_attempts + 1):
            exponent = entry.restarts + attempt - 2
            delay = min(cfg.restart_backoff_max_s, cfg.restart_backoff_s * 2.0**exponent)
            log.warning(
                "spark query %s: restart %d (attempt %d) in %g s",
                query_id,
                entry.restarts,
                attempt,
                delay,
            )
            await asyncio.sleep(delay)
            try:
                await _in_thread(self._restart, query_id, entry)
            except Exception as e:  # noqa: BLE001 - still down (no JVM yet, no server...)
                entry.error = f"{failure}; restart attempt {attempt}: {_first_line(e)}"
                log.warning("spark query %s: restart attempt %d failed: %s", query_id, attempt, e)
                continue
            entry.state = "running"
            log.info("spark query %s runs again (restart %d)", query_id, entry.restarts)
            if entry.on_event is not None:
                entry.on_event("restarted", {"restarts": entry.restarts, "reason": failure})
            return True
        reason = f"could not be restarted ({cfg.restart_attempts} attempts): {entry.error}"
        self._failed(query_id, entry, reason, ran=True)
        return False

    def _restart(self, query_id: str, entry: _Entry) -> None:
        """In a worker thread: the old job stopped (if its driver still answers), a dead
        session discarded, and the job made and started again from its checkpoint."""
        old = entry.job
        if old is not None:
            if session_alive(old.spark):
                with contextlib.suppress(Exception):  # failed already; stop only releases it
                    old.stop()
            else:
                log.warning("spark query %s: the Spark session is dead; making a new one", query_id)
                discard_session(old.spark)
                self._tables.clear()  # their cached DataFrames belonged to the dead session
        assert entry.sink is not None
        sql, streams = entry.spec
        entry.job = self._make_job(query_id, sql, streams, entry.sink)
        entry.job.start()

    def health(self) -> list[str]:
        """The jobs that are down, for /healthz (degraded while any is)."""
        return [
            f"spark query {qid} is down (restart {e.restarts} of {self.max_restarts}): {e.error}"
            for qid, e in self._jobs.items()
            if e.state == "restarting"
        ]

    def status(self, query_id: str) -> dict[str, Any]:
        """For `GET /queries/{id}`."""
        entry = self._jobs[query_id]
        if entry.job is None or entry.state in ("starting", "restarting"):
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

    def polled_status(self, query_id: str) -> dict[str, Any]:
        """`status` as of the supervisor's last poll (no call into Spark, no checkpoint read:
        what /metrics shows, scraped on the event loop), with the supervisor's own counts."""
        entry = self._jobs[query_id]
        return {**entry.polled, "restarts": entry.restarts}

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
            try:
                await asyncio.to_thread(entry.job.stop)
            except Exception as e:  # noqa: BLE001 - its driver is gone: nothing left to stop
                log.info("spark job %s did not stop cleanly: %s", entry.job.name, _first_line(e))


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
