"""The archive: the raw sensor stream saved to rolling Parquet segments (the paper's save-to-disk
operator, Figure 6), the input of the Spark jobs and of later replays.

`ArchiveOperator` is an ordinary Fjord operator hanging off the stream's router like a query that
wants every tuple; it does no I/O. When a segment is full (rows or seconds of event time), it is
handed to `ArchiveWriter`, which writes it in a worker thread as a hidden temporary file, fsyncs
it, and renames it into place: a reader (Spark's file source) never sees a partial segment, and a
crash leaves at most a hidden temporary file, which the next start removes.

Layout: ARCHIVE_DIR/<stream>/part-<seq:08d>-<uuid>.parquet with exactly the stream's columns.

The archive is a consumer of the sensors like a query: its demand (`ArchiveWriter.demand`,
named `CONSUMER` among a sensor's consumers) keeps them sampling though no query asks, or
else it would hold only what the queries happen to take.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sys
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from fjords.demand import Demand
from fjords.runtime.operators.base import Operator
from fjords.runtime.progress import INF, Watermark
from fjords.runtime.queues import PushQueue
from fjords.schema import Schema
from fjords.supervision import log_task_failure

log = logging.getLogger("gateway.archive")

#: The archive's name among a sensor's consumers (/sensors, EXPLAIN).
CONSUMER = "archive"
_PART = re.compile(r"^part-(\d{8})-[0-9a-f]+\.parquet$")
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
    """Commit an Arrow table as segment `seq`: hidden temporary file, fsync, rename, fsync dir."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    name = f"part-{seq:08d}-{uuid.uuid4().hex[:12]}.parquet"
    tmp = directory / f".{name}.tmp"
    with open(tmp, "wb") as f:
        pq.write_table(table, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / name)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself is durable
    finally:
        os.close(dir_fd)
    return directory / name


def segment_seq(path: Path) -> int | None:
    """A committed segment's number (None for any other file)."""
    m = _PART.match(path.name)
    return int(m.group(1)) if m else None


def segments(directory: Path) -> list[Path]:
    """The committed segments, in order."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if _PART.match(p.name))


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


class ArchiveWriter:
    """Owns the archive of one stream: the operator in the Fjord and the task writing segments.

    Use as an async context manager around the gateway's run; leaving it cuts and writes the last
    partial segment (the shutdown flush). Nothing the stream accepted is dropped here: the writer
    writes every pending segment per wake-up (one thread hop for many small segments), retries a
    failing disk with backoff while the gateway holds its links back, and counts what a full
    input queue still had to drop (`rows_dropped`).

    `headroom_rows` (default: four times the Fjord's queue bound) is room for what is on its way
    when the gateway stops reading: an MQTT client's inbound queue, the proxies' intake, the
    stream's queue and this archive's input can each hold up to a queue bound."""

    def __init__(
        self,
        fjord: Any,
        stream: str,
        directory: str | os.PathLike[str],
        *,
        segment_rows: int = 50_000,
        segment_seconds: float = 300.0,
        max_pending_rows: int = 200_000,
        headroom_rows: int | None = None,
        retry_seconds: float = 1.0,
    ) -> None:
        self.fjord = fjord
        self.stream = stream
        self.directory = Path(directory) / stream
        self.schema: Schema = fjord.streams[stream].info.schema
        self._cleanup()
        existing = segments(self.directory)
        self.seq = int(_PART.match(existing[-1].name).group(1)) + 1 if existing else 0  # type: ignore[union-attr]
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
        self.written: list[Path] = []
        self.rows_written = 0
        self.write_errors = 0
        self._wake = asyncio.Event()
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
            "backpressure": self.op.backpressure,
            "write_errors": self.write_errors,
        }

    def _cleanup(self) -> None:
        if self.directory.is_dir():
            for p in self.directory.iterdir():
                if p.name.startswith(".part-") and p.name.endswith(".tmp"):
                    log.warning("removing the partial segment %s left by a crash", p)
                    p.unlink(missing_ok=True)

    async def __aenter__(self) -> ArchiveWriter:
        router = self.fjord.streams[self.stream].router
        self.fjord.scheduler.add(self.op)
        # late for windows, still part of the stream
        router.add("__archive__", [], None, self.input.put_many, late=self.input.put)
        self._task = asyncio.create_task(self._drain(), name=f"archive:{self.stream}")
        # A writer that dies (disk full, permissions) is logged at once, not found at shutdown.
        self._task.add_done_callback(
            partial(log_task_failure, logger=log, consequence="segments are no longer written")
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.fjord.run_until_idle()  # route what was pushed before stopping: it belongs in the archive
        router = self.fjord.streams[self.stream].router
        router.remove("__archive__")
        self.fjord.scheduler.remove(self.op)
        # Never cancel a write half-way: ask the writer to finish what is pending, then stop.
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task

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
            paths, error = await asyncio.to_thread(
                _write_many, self.directory, self.seq, self.schema, batch
            )
            for rows in batch[: len(paths)]:
                self.ready.popleft()
                self.op.pending_rows -= len(rows)
                self.rows_written += len(rows)
            self.seq += len(paths)
            self.written.extend(paths)
            if error is not None:
                e = error
                self.write_errors += 1
                if self.write_errors == 1 or self.write_errors % 100 == 0:
                    log.error(
                        "archive %s: writing %d pending segment(s) failed (%s); retrying in %.1f s, "
                        "the stream is held back meanwhile",
                        self.stream,
                        len(batch),
                        e,
                        self.retry_seconds,
                    )
                await asyncio.sleep(self.retry_seconds)
                continue
            log.debug("archived %d segment(s) up to %s", len(paths), paths[-1].name)
            if not self.op.blocked and not self.op.scheduled:
                self.fjord.scheduler.wake(self.op)  # it may have stopped reading for us


def _write_many(
    directory: Path, seq: int, schema: Schema, batch: list[list[tuple]]
) -> tuple[list[Path], OSError | None]:
    """Write consecutive segments in one worker-thread hop. A failure part-way keeps the ones
    written (they are whole and numbered) and is returned; the caller retries from the first
    unwritten segment, so no number is used twice."""
    out: list[Path] = []
    for rows in batch:
        try:
            out.append(write_segment(directory, seq + len(out), schema, rows))
        except OSError as e:
            return out, e
    return out, None
