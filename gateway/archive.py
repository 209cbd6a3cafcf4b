"""The archive: the raw sensor stream saved to rolling Parquet segments (the paper's save-to-disk
operator, Figure 6), the input of the Spark jobs and of later replays.

`ArchiveOperator` is an ordinary Fjord operator hanging off the stream's router like a query that
wants every tuple; it does no I/O. When a segment is full (rows or seconds of event time), it is
handed to `ArchiveWriter`, which writes it in a worker thread as a hidden temporary file, fsyncs
it, and renames it into place: a reader (Spark's file source) never sees a partial segment, and a
crash leaves at most a hidden temporary file, which the next start removes. The archive's root
(`[archive] dir`) is a `Storage`: a local path, or a file://, hdfs:// or s3:// URL; on an object
store a segment is one object, visible whole when its upload completes (no rename).

A disk that refuses writes (full, read-only, permissions, EIO, out of file descriptors) is
retried with backoff while the rows wait in the writer's bounded buffer; every failure is counted
by reason (`fjords_archive_errors_total{stream, reason}`), logged the first time per reason and
then at most once a minute, and the gateway reports itself degraded until a write succeeds. The
shutdown flush is bounded (`[archive] shutdown_timeout_s`): what it could not write by then is
counted and logged, and the daemon exits anyway.

Layout (gateway/archive_layout.py): ROOT/<stream>/gateway=<id>/date=<YYYY-MM-DD>/part-<seq>-<uuid>
.parquet, `date=` the UTC date of the segment's earliest reading; each segment holds a `gateway`
column (first) and the stream's columns, and names its gateway, stream and schema version in its
Parquet key-value metadata. Numbers run per (stream, gateway) after the highest found at start,
legacy flat segments (ROOT/<stream>/part-*.parquet, written before gateways had ids) included.

The archive is a consumer of the sensors like a query: its demand (`ArchiveWriter.demand`,
named `CONSUMER` among a sensor's consumers) keeps them sampling though no query asks, or
else it would hold only what the queries happen to take.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa

from fjords.demand import Demand
from fjords.runtime.operators.base import Operator
from fjords.runtime.progress import INF, Watermark
from fjords.runtime.queues import PushQueue
from fjords.schema import Schema
from fjords.supervision import Backoff, log_task_failure
from gateway import archive_layout as layout
from gateway.archive_layout import GATEWAY_COLUMN, GATEWAY_ID, Storage

log = logging.getLogger("gateway.archive")

#: The archive's name among a sensor's consumers (/sensors, EXPLAIN).
CONSUMER = "archive"
_PART = re.compile(r"^part-(\d{8})-[0-9a-f]+\.parquet$")
#: the hidden temporary file a segment is written as before its rename (`write_table`)
_TEMP = re.compile(r"^\.part-\d{8}-[0-9a-f]+\.parquet\.tmp$")
#: how an OSError's errno reads in `fjords_archive_errors_total{reason}` (anything else: "io")
ERROR_REASONS = {
    errno.ENOSPC: "no_space",
    errno.EDQUOT: "no_space",
    errno.EROFS: "read_only",
    errno.EACCES: "permission",
    errno.EPERM: "permission",
    errno.EMFILE: "too_many_files",
    errno.ENFILE: "too_many_files",
    errno.EIO: "io",
}
#: what an object store's error (no errno) says, and its reason; else "io" for an OSError and
#: "storage" for any other error of pyarrow's filesystems
_STORE_REASONS = (
    (("access denied", "access_denied", "accessdenied", "forbidden", "permission"), "permission"),
    (("quota", "no space", "insufficient storage"), "no_space"),
    (("connection", "timed out", "timeout", "resolve", "unreachable", "refused"), "unreachable"),
)
#: a failure already logged for a reason is logged again at most this often
LOG_EVERY_S = 60.0
_ARROW = {"int": pa.int64(), "float": pa.float64(), "str": pa.string(), "bool": pa.bool_()}


def arrow_schema(schema: Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, _ARROW[f.type]) for f in schema.fields])


def write_segment(directory: Path, seq: int, schema: Schema, rows: list[tuple]) -> Path:
    """Write one segment of stream tuples atomically; returns its final path."""
    columns: list[Sequence[Any]] = (
        list(zip(*rows, strict=True)) if rows else [[] for _ in schema.fields]
    )
    table = pa.Table.from_arrays(
        [pa.array(col, type=_ARROW[f.type]) for col, f in zip(columns, schema.fields, strict=True)],
        schema=arrow_schema(schema),
    )
    return write_table(directory, seq, table)


def write_table(directory: str | os.PathLike[str], seq: int, table: pa.Table) -> Path:
    """Commit an Arrow table as segment `seq` of a local directory, as it is (no gateway column,
    no partition directories): hidden temporary file, fsync, rename, fsync dir."""
    storage = Storage(directory)
    return Path(storage.commit(storage.root, layout.part_name(seq), table))


def segment_table(schema: Schema, rows: list[tuple], gateway: str, stream: str) -> pa.Table:
    """A segment of the layout: the `gateway` column first (unless the stream has one of its
    own), the stream's columns, and `segment_metadata` as the Parquet key-value metadata."""
    columns: list[Sequence[Any]] = (
        list(zip(*rows, strict=True)) if rows else [[] for _ in schema.fields]
    )
    arrays = [
        pa.array(col, type=_ARROW[f.type]) for col, f in zip(columns, schema.fields, strict=True)
    ]
    if GATEWAY_COLUMN not in schema.names:
        arrays.insert(0, pa.array([gateway] * len(rows), type=pa.string()))
    target = layout.arrow_schema(schema, gateway=True).with_metadata(
        layout.segment_metadata(gateway, stream, schema)
    )
    return pa.Table.from_arrays(arrays, schema=target)


def segment_dir(
    storage: Storage, stream: str, gateway: str, schema: Schema, rows: list[tuple]
) -> str:
    """The date directory of a segment: the UTC date of its earliest reading."""
    ti = schema.index(schema.time) if schema.time is not None else None
    times = [r[ti] for r in rows if r[ti] is not None] if ti is not None else []
    date = layout.date_of(min(times)) if times else layout.date_of(0.0)
    return storage.path(stream, f"gateway={gateway}", f"date={date}")


def commit_segment(
    storage: Storage, stream: str, gateway: str, seq: int, schema: Schema, rows: list[tuple]
) -> str:
    """Commit segment `seq` of a gateway's stream into the layout, whole or not at all; returns
    its path in the storage."""
    table = segment_table(schema, rows, gateway, stream)
    directory = segment_dir(storage, stream, gateway, schema, rows)
    return storage.commit(directory, layout.part_name(seq), table)


def error_reason(e: BaseException) -> str:
    """The label of a write error: what an operator has to fix (space, a mount, permissions,
    the network to an object store)."""
    code = getattr(e, "errno", None) if isinstance(e, OSError) else None
    if code:
        return ERROR_REASONS.get(code, "io")
    text = str(e).lower()
    for needles, reason in _STORE_REASONS:
        if any(n in text for n in needles):
            return reason
    return "io" if isinstance(e, OSError) else "storage"


def remove_temp_files(directory: Path) -> int:
    """Remove the temporary files of unfinished writes (ours only: `.part-*.parquet.tmp`) from
    `directory`; returns how many. Call it only while no write to `directory` is under way."""
    removed = 0
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for p in directory.iterdir():
            if _TEMP.match(p.name):
                p.unlink(missing_ok=True)
                removed += 1
    return removed


def segment_seq(path: Path) -> int | None:
    """A committed segment's number (None for any other file)."""
    m = _PART.match(path.name)
    return int(m.group(1)) if m else None


def segments(directory: Path) -> list[Path]:
    """The committed parts under a local stream directory, in order of number: the legacy flat
    ones and every gateway's (`gateway=*/date=*/`)."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if _PART.match(p.name)]
    found += [p for p in directory.glob("gateway=*/date=*/part-*") if _PART.match(p.name)]
    return sorted(found, key=lambda p: (p.name, str(p)))


class ArchiveOperator(Operator):
    """Cuts the stream into segments of at most `segment_rows` rows or `segment_seconds` of event
    time, and hands each full segment to `ready` (the writer's pending segments).

    Two bounds on the rows waiting for the writer: at `max_pending_rows` the operator is `behind`
    (the gateway then stops reading its links), and it goes on taking in what was already on its
    way for `headroom_rows` more; only past both does it stop reading (`blocked`), and its input
    queue, bounded, drops (counted)."""

    kind = "archive"

    def __init__(
        self,
        input: PushQueue,
        ready: deque[list[tuple]],
        *,
        time_index: int,
        segment_rows: int,
        segment_seconds: float,
        max_pending_rows: int,
        headroom_rows: int = 0,
        on_segment: Callable[[], None] | None = None,
        **kw: Any,
    ) -> None:
        super().__init__([input], [], **kw)
        self.on_segment = on_segment  # a segment is ready (the writer's task wakes)
        self.input = input  # inputs[0], as the PushQueue it is (a batch at a time)
        self.ready = ready
        self.time_index = time_index
        self.segment_rows = segment_rows
        self.segment_seconds = segment_seconds
        self.max_pending_rows = max_pending_rows
        self.headroom_rows = headroom_rows
        self.pending_rows = 0  # rows in `ready`, kept by the operator and the writer
        self.backpressure = 0  # times the writer fell behind (the gateway's links were held)
        self._rows: list[tuple] = []
        self._first: float | None = None

    @property
    def behind(self) -> bool:
        return self.pending_rows >= self.max_pending_rows

    @property
    def blocked(self) -> bool:
        return self.pending_rows >= self.max_pending_rows + self.headroom_rows

    def has_input(self) -> bool:
        return not self.blocked and super().has_input()

    def transition(self) -> bool:
        if self.blocked:
            return False
        # pending stays <= both bounds + one segment
        room = self.max_pending_rows + self.headroom_rows - self.pending_rows
        items = self.input.get_batch(min(self.batch, room))
        if not items:
            return False
        ti = self.time_index
        for item in items:
            if item.__class__ is tuple:
                t = item[ti]
                if self._first is None:
                    self._first = t
                elif t - self._first >= self.segment_seconds:
                    self.cut()
                    self._first = t
                self._rows.append(item)
                if len(self._rows) >= self.segment_rows:
                    self.cut()
            elif item.__class__ is Watermark and item.time == INF:
                self.cut()
        return True

    def cut(self) -> None:
        if self._rows:
            self.ready.append(self._rows)
            was_behind = self.behind
            self.pending_rows += len(self._rows)
            if self.behind and not was_behind:
                self.backpressure += 1
            self._rows = []
            self._first = None
            if self.on_segment is not None:
                self.on_segment()


@dataclass
class WriteFailure:
    """Why the archive cannot write now, since when (wall clock), and how often it tried."""

    reason: str  # as in fjords_archive_errors_total{reason}
    error: str  # the system's words: "no space left on device"
    since: float
    attempts: int = 1

    def describe(self) -> str:
        since = datetime.fromtimestamp(self.since, UTC).isoformat(timespec="seconds")
        return f"{self.error} (since {since.replace('+00:00', 'Z')})"


class ArchiveWriter:
    """Owns the archive of one stream: the operator in the Fjord and the task writing segments.

    Use as an async context manager around the gateway's run; leaving it cuts and writes the last
    partial segment (the shutdown flush), for at most `shutdown_timeout_s` (`close`). Nothing the
    stream accepted is dropped while the disk works: the writer writes every pending segment per
    wake-up (one thread hop for many small segments), retries a failing disk with backoff
    (`retry_seconds` doubling up to `max_retry_seconds`), and counts what a full input queue
    still had to drop (`rows_dropped`) and what the shutdown could not write (`rows_unwritten`).

    `headroom_rows` (default: four times the Fjord's queue bound) is room for what is on its way
    when the gateway stops reading: an MQTT client's inbound queue, the proxies' intake, the
    stream's queue and this archive's input can each hold up to a queue bound.

    `directory` is the archive's root (a path, a URL or a `Storage`); `gateway` the id written
    into the segments (default: the host name's)."""

    def __init__(
        self,
        fjord: Any,
        stream: str,
        directory: str | os.PathLike[str] | Storage,
        *,
        gateway: str | None = None,
        segment_rows: int = 50_000,
        segment_seconds: float = 300.0,
        max_pending_rows: int = 200_000,
        headroom_rows: int | None = None,
        retry_seconds: float = 1.0,
        max_retry_seconds: float = 5.0,
        shutdown_timeout_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.fjord = fjord
        self.stream = stream
        self.storage = directory if isinstance(directory, Storage) else Storage(directory)
        self.gateway = layout.default_gateway_id() if gateway is None else gateway
        if not GATEWAY_ID.match(self.gateway):
            raise ValueError(f"gateway id {self.gateway!r} does not fit {GATEWAY_ID.pattern}")
        #: the gateway's directory of the stream (its date directories are under it)
        self.gateway_dir = self.storage.path(stream, f"gateway={self.gateway}")
        self.schema: Schema = fjord.streams[stream].info.schema
        self.clock = clock
        #: failed writes by reason (ERROR_REASONS), and the temporary files of unfinished ones
        #: removed (at start, after a failed write)
        self.errors: dict[str, int] = {}
        self.temp_files_removed = 0
        #: set while the disk refuses writes: /healthz says degraded, /status shows it
        self.failing: WriteFailure | None = None
        self._logged: dict[str, float] = {}  # reason -> when last logged (monotonic)
        self._cleanup()
        self.seq = layout.next_seq(
            layout.segments(self.storage, stream, self.gateway)
            + layout.segments(self.storage, stream, None)
        )
        #: segments numbered below it were written by earlier runs (before this history began)
        self.first_seq = self.seq
        self.ready: deque[list[tuple]] = deque()
        self.input = PushQueue(fjord.queue_bound, name=f"archive:{stream}")
        self.op = ArchiveOperator(
            self.input,
            self.ready,
            time_index=self.schema.index(self.schema.time),
            segment_rows=segment_rows,
            segment_seconds=segment_seconds,
            max_pending_rows=max(max_pending_rows, 1),
            headroom_rows=4 * fjord.queue_bound if headroom_rows is None else headroom_rows,
            on_segment=self._on_segment,
            name=f"archive:{stream}",
        )
        self.retry_seconds = retry_seconds
        self.backoff = Backoff(retry_seconds, max(retry_seconds, max_retry_seconds))
        self.shutdown_timeout_s = shutdown_timeout_s
        self.written: list[str] = []  # paths in the storage
        self.rows_written = 0
        self.write_errors = 0
        #: rows the shutdown flush could not write (or not confirm) within its timeout
        self.rows_unwritten = 0
        self._wake = asyncio.Event()
        self._retry_now = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task | None = None

    def _on_segment(self) -> None:
        self._wake.set()

    def demand(self, sample_period_s: float | None) -> Demand:
        """What the archive asks of the stream's sensors, as a query with no condition and no
        window would: every field of every reading, every `sample_period_s` at least (None:
        at each sensor's own period, as a query without SAMPLE PERIOD)."""
        return Demand(
            stream=self.stream,
            sample_period_s=sample_period_s,
            lifetime_s=None,
            fields=tuple(f.name for f in self.schema.fields),
            atoms=(),
            filtered_only_by_atoms=True,
            aggregates=(),
            window=None,
            group_by=(),
        )

    def pending_rows(self) -> int:
        return self.op.pending_rows

    def pending(self) -> list[tuple]:
        """Every row taken and not yet in a committed segment numbered below `seq`: the cut
        segments waiting for the disk (from number `seq` on: one may be renamed into place
        while the event loop has not yet heard), the segment being cut, the input queue."""
        out = [row for rows in self.ready for row in rows]
        out += self.op._rows
        out += [item for item in self.input.peek() if item.__class__ is tuple]
        return out

    def stats(self) -> dict[str, int]:
        """Counters for /metrics: rows and segments written, and every way a row could be lost."""
        return {
            "rows_written": self.rows_written,
            "segments_written": len(self.written),
            "rows_pending": self.op.pending_rows + len(self.op._rows) + len(self.input),
            "rows_dropped": self.input.drops,
            "rows_unwritten": self.rows_unwritten,
            "backpressure": self.op.backpressure,
            "write_errors": self.write_errors,
            "temp_files_removed": self.temp_files_removed,
        }

    def status(self) -> dict[str, Any]:
        """/status: the counters, the errors by reason, and why it cannot write now (or null)."""
        f = self.failing
        return {
            **self.stats(),
            "errors": dict(self.errors),
            "cannot_write": None
            if f is None
            else {"reason": f.reason, "error": f.error, "since": f.since, "attempts": f.attempts},
        }

    def health(self) -> list[str]:
        """Degraded while the disk refuses writes (the rows wait in memory, then are dropped)."""
        f = self.failing
        if f is None:
            return []
        return [
            f"archive {self.stream} cannot write: {f.describe()}; {f.attempts} failed "
            f"attempt(s), {self.stats()['rows_pending']} rows waiting"
        ]

    def _temp_dirs(self) -> list[Path]:
        """Where a local write of this gateway may have left a temporary file: its date
        directories of the stream, and the stream's legacy flat directory."""
        if not self.storage.local:
            return []  # an object store has no temporary objects; HDFS's are hidden names
        gdir = Path(self.gateway_dir)
        return [Path(self.storage.path(self.stream)), *sorted(gdir.glob("date=*"))]

    def _cleanup(self) -> None:
        """What unfinished writes of an earlier run left: removed, counted, logged."""
        removed = 0
        try:
            for d in self._temp_dirs():
                removed += remove_temp_files(d)
        except OSError as e:  # a read-only or unreadable archive: the writes will say so too
            log.error("archive %s: cannot remove the temporary files in %s: %s", self.stream,
                      self.gateway_dir, e)  # fmt: skip
        if removed:
            self.temp_files_removed += removed
            log.warning(
                "archive %s: removed %d temporary file(s) of unfinished writes from %s",
                self.stream,
                removed,
                self.gateway_dir,
            )

    async def __aenter__(self) -> ArchiveWriter:
        router = self.fjord.streams[self.stream].router
        self.fjord.scheduler.add(self.op)
        # late for windows, still part of the stream
        router.add("__archive__", [], None, self.input.put_many, late=self.input.put)
        self._task = asyncio.create_task(self._drain(), name=f"archive:{self.stream}")
        # A writer that dies (a bug) is logged at once, not found at shutdown.
        self._task.add_done_callback(
            partial(log_task_failure, logger=log, consequence="segments are no longer written")
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, deadline: float | None = None) -> None:
        """The shutdown flush: write what is pending until `deadline` (the event loop's clock;
        default: `shutdown_timeout_s` from now). A write under way is never cut half-way, but
        past the deadline it is no longer waited for: its thread is a daemon thread, and what
        was not written is counted (`rows_unwritten`, a drop) and logged."""
        loop = asyncio.get_running_loop()
        if deadline is None:
            deadline = loop.time() + self.shutdown_timeout_s
        self.fjord.run_until_idle()  # route what was pushed before stopping: it belongs in the archive
        router = self.fjord.streams[self.stream].router
        router.remove("__archive__")
        self.fjord.scheduler.remove(self.op)
        self._closing = True
        self._wake.set()
        self._retry_now.set()  # a writer waiting to retry tries once more now
        task = self._task
        if task is None:
            return
        done, _ = await asyncio.wait({task}, timeout=max(0.0, deadline - loop.time()))
        if done:
            await task  # a writer that died raises here, as it always did
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        lost = len(self.pending())
        self.rows_unwritten += lost
        why = (
            f"the disk still refuses writes: {self.failing.describe()}"
            if self.failing is not None
            else "the disk was too slow (a write is still under way and abandoned)"
        )
        log.error(
            "archive %s: %d rows not written: [archive] shutdown_timeout_s (%g s) ran out and %s; "
            "stopping without them",
            self.stream,
            lost,
            self.shutdown_timeout_s,
            why,
        )

    async def _drain(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self._write_pending()
            if self._closing:
                # What the operator still holds (it may have been held back): cut and write it.
                op = self.op
                op.max_pending_rows = sys.maxsize  # shutting down: take everything, then write it
                while len(self.input):
                    op.transition()
                op.cut()
                await self._write_pending()
                return

    async def _write_pending(self) -> None:
        while self.ready:
            batch = list(self.ready)
            self._retry_now.clear()  # set from now on (the shutdown began): retry without a pause
            try:
                paths, error, removed = await _in_daemon_thread(
                    f"archive-write:{self.stream}",
                    _write_many,
                    self.storage,
                    self.stream,
                    self.gateway,
                    self.seq,
                    self.schema,
                    batch,
                )
            except OSError as e:  # no thread to write in: retried like a failed write
                paths, error, removed = [], e, 0
            for rows in batch[: len(paths)]:
                self.ready.popleft()
                self.op.pending_rows -= len(rows)
                self.rows_written += len(rows)
            self.seq += len(paths)
            self.written.extend(paths)
            if removed:
                self.temp_files_removed += removed
                log.warning(
                    "archive %s: removed %d temporary file(s) of unfinished writes after a "
                    "failed write",
                    self.stream,
                    removed,
                )
            if error is not None:
                delay = self.backoff.next()
                self._failed(error, len(batch) - len(paths), delay)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._retry_now.wait(), delay)
                continue
            self._recovered()
            log.debug("archived %d segment(s) up to %s", len(paths), paths[-1])
            if not self.op.blocked and not self.op.scheduled:
                self.fjord.scheduler.wake(self.op)  # it may have stopped reading for us

    def _failed(self, e: Exception, segments_left: int, delay: float) -> None:
        """Count a failed write; log it the first time per reason, then once a minute."""
        reason = error_reason(e)
        self.write_errors += 1
        self.errors[reason] = self.errors.get(reason, 0) + 1
        code = getattr(e, "errno", None) if isinstance(e, OSError) else None
        what = os.strerror(code).lower() if code else str(e) or type(e).__name__
        f = self.failing
        if f is None or f.reason != reason:
            self.failing = f = WriteFailure(reason, what, self.clock())
        else:
            f.attempts += 1
        now = time.monotonic()
        last = self._logged.get(reason)
        if last is not None and now - last < LOG_EVERY_S:
            return
        self._logged[reason] = now
        log.error(
            "archive %s cannot write: %s (%s; %d failed attempt(s) so far, counted in "
            "fjords_archive_errors_total{reason=%r}); %d segment(s) wait, retrying in %.1f s; "
            "rows past its bounded buffer are dropped meanwhile, counted in "
            "fjords_dropped_total{stage='archive'} (logged again at most once a minute)",
            self.stream, f.describe(), e, f.attempts, reason, segments_left, delay,
        )  # fmt: skip

    def _recovered(self) -> None:
        f = self.failing
        self.backoff.reset()
        if f is None:
            return
        self.failing = None
        now = time.monotonic()
        last = self._logged.get("writes_again")
        if last is not None and now - last < LOG_EVERY_S:
            return  # a flapping disk: its failures are counted, its recoveries not all logged
        self._logged["writes_again"] = now
        log.warning(
            "archive %s writes again, after %d failed attempt(s): %s",
            self.stream,
            f.attempts,
            f.describe(),
        )


async def _in_daemon_thread(name: str, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` in a thread of its own, a daemon thread. A write can block in the kernel for
    as long as the disk likes (a dead NFS server, a dying disk); the default executor's threads
    would then keep the process from exiting (asyncio.run joins them, and so does the
    interpreter), whatever the shutdown timeout says. Cancelling the await abandons the call."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if fut.cancelled():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)

    def run() -> None:
        try:
            result, error = fn(*args), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting task
            result, error = None, e
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            loop.call_soon_threadsafe(settle, result, error)

    try:
        threading.Thread(target=run, name=name, daemon=True).start()
    except RuntimeError as e:  # "can't start new thread": out of memory or of a ulimit
        raise OSError(errno.EAGAIN, f"cannot start a thread to write in: {e}") from e
    return await fut


def _write_many(
    storage: Storage, stream: str, gateway: str, seq: int, schema: Schema, batch: list[list[tuple]]
) -> tuple[list[str], Exception | None, int]:
    """Write consecutive segments in one worker-thread hop. A failure part-way (an OSError, or
    any error of pyarrow's filesystems) keeps the ones written (they are whole and numbered) and
    is returned, with how many temporary files of unfinished writes were then removed; the
    caller retries from the first unwritten segment, so no number is used twice."""
    out: list[str] = []
    for rows in batch:
        try:
            out.append(commit_segment(storage, stream, gateway, seq + len(out), schema, rows))
        except (OSError, pa.ArrowException) as e:
            removed = 0
            if storage.local:
                with contextlib.suppress(OSError):
                    removed = remove_temp_files(
                        Path(segment_dir(storage, stream, gateway, schema, rows))
                    )
            return out, e, removed
    return out, None, 0
