"""Streaming: a Structured Streaming job over a fleet's archive (one or more roots).

Each gateway under the roots is a file source of its own (`sources.stream_archive`) with its own
watermark; their union runs the query with `spark.sql.streaming.multipleWatermarkPolicy = min`,
so a gateway behind the others in event time holds windows open instead of having its readings
dropped as late. What Spark still drops is counted per gateway, in readings, across all batches
(gateway/spark/progress.py says how), as are segments the declared schema refuses. A join of two
streams keeps one watermark per side (the union of its gateways): Spark's join state needs
the event-time column it derives itself; its late readings are not counted.

The gateways a job reads are fixed when its checkpoint is created (`fjords-fleet.json` in it):
Spark cannot add a source to a query restarted from a checkpoint. A gateway appearing under a
root later is logged and listed in `status()["gateways_unread"]`; a job with a new checkpoint
reads it.

The file source picks up each committed segment; stage A (filters, `window()`, the windowed
partial aggregate) runs as Spark's stateful streaming aggregation with a watermark in append
mode, so a window is output once, when the watermark passes its end. Stage B (the static-table
join, regroup, HAVING) runs per micro-batch in `foreachBatch`, reloading tables whose file
changed. Offsets and aggregation state live in the checkpoint directory: a job killed and
restarted from it resumes after the last committed micro-batch, and the uncommitted one is
replayed with the same id and rows, which the Parquet sink overwrites (exactly once).

Windows still open at the end of the archive are output when later segments move the watermark
past their end (the Fjord flushes them at end of file; a live archive has no end).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from functools import reduce
from typing import TYPE_CHECKING, Any

from fjords.schema import Schema
from gateway.archive_layout import Storage
from gateway.spark.compiler import compile_query
from gateway.spark.expressions import TS
from gateway.spark.progress import FleetProgress, window_slide
from gateway.spark.query_plan import SparkQuery
from gateway.spark.session import is_remote
from gateway.spark.sinks import SparkSink
from gateway.spark.sources import (
    Refusals,
    Source,
    StaticTable,
    arrow_declared,
    declared_stream_schema,
    fleet_sources,
    roots_of,
    stream_archive,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

DEFAULT_WATERMARK = "5 minutes"
FLEET_FILE = "fjords-fleet.json"

log = logging.getLogger("gateway.spark.streaming")


class FinishBatch:
    """Stage B of one micro-batch (`foreachBatch`): the table join, regroup and HAVING, then the
    sink. Module-level and holding no session: under Spark Connect it is pickled and run in a
    Python worker on the server, which imports `gateway` there."""

    def __init__(
        self, query: SparkQuery, tables: Mapping[str, StaticTable], sink: SparkSink
    ) -> None:
        self.query = query
        self.tables = dict(tables)
        self.sink = sink

    def __call__(self, partials: DataFrame, batch_id: int) -> None:
        table_df = None
        if self.query.table is not None:
            table_df = self.tables[self.query.table].dataframe(partials.sparkSession)
        result = self.query.finish(partials, table_df)
        self.sink.write(result, batch_id)


class StreamingJob:
    """One query over a fleet's archive; `start()`, then `stop()` or `await_termination()`."""

    def __init__(
        self,
        spark: SparkSession,
        sql: str,
        archive: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        gateways: Sequence[str] | None = None,
        declared: Mapping[str, Schema] | None = None,
        sink: SparkSink,
        checkpoint: str | os.PathLike[str],
        stream: str = "traffic",
        right: tuple[str, str | os.PathLike[str]] | None = None,
        tables: Mapping[str, StaticTable] | None = None,
        watermark: str = DEFAULT_WATERMARK,
        trigger: str | None = None,
        available_now: bool = False,
        max_files_per_trigger: int | None = None,
        name: str | None = None,
    ) -> None:
        """`archive`: the fleet's root(s); `gateways` the ones to read (default: all);
        `declared`: streams' declared schemas (`[[mqtt.streams]]`; default: the built-in
        ones, else the newest segment's). `trigger` is a processing-time interval
        ('10 seconds'); `available_now` processes what the archive holds now (in batches of
        `max_files_per_trigger` files per gateway) and stops. `right`: (stream, root) of the
        second stream of a join of two streams."""
        self.spark = spark
        self.roots = roots_of(archive)
        self.archive = ", ".join(r.url for r in self.roots)
        self.checkpoint = str(checkpoint)
        self.sink = sink
        self.tables = dict(tables or {})
        self.watermark = watermark
        self.trigger = trigger
        self.available_now = available_now
        self.max_files_per_trigger = max_files_per_trigger
        self.name = name
        self.stream = stream
        declared = dict(declared or {})
        self.schema = declared_stream_schema(self.roots, stream, declared.get(stream))
        streams = {stream: self.schema}
        self.sources = self._fleet(fleet_sources(self.roots, stream, gateways))
        self.right = None if right is None else (right[0], str(right[1]))
        self.right_sources: list[Source] = []
        if self.right is not None:
            right_roots = roots_of(self.right[1])
            self.right_schema = declared_stream_schema(
                right_roots, self.right[0], declared.get(self.right[0])
            )
            streams[self.right[0]] = self.right_schema
            self.right_sources = fleet_sources(right_roots, self.right[0], gateways)
        self.query: SparkQuery = compile_query(
            sql, streams, {n: t.schema for n, t in self.tables.items()}
        )
        self.refusals = Refusals(stream)
        joined = getattr(self.query, "right_stream", None) is not None
        self.progress = FleetProgress(
            self.checkpoint,
            [*self.sources, *self.right_sources],
            arrow_declared(self.schema),
            self.refusals,
            slide_s=window_slide(self.query.window) if self.query.windowed else None,
            counts_late=not joined,
            time_column=self.schema.time or "time",
        )
        #: one watermark per gateway (a join's sides keep one each: see `start`)
        self.per_gateway_watermarks = self.query.windowed and not joined
        self._handle: StreamingQuery | None = None
        self._lock = threading.Lock()
        self.batches = 0
        self._finish = FinishBatch(self.query, self.tables, self.sink)
        self._remote = False

    def _fleet(self, found: list[Source]) -> list[Source]:
        """The sources this job's checkpoint was created with (new ones logged, left unread);
        a new checkpoint records `found`."""
        ckpt = Storage(self.checkpoint)
        path = ckpt.path(FLEET_FILE)
        self.gateways_unread: list[str] = []
        try:
            with ckpt.open_input(path) as f:
                recorded = [tuple(x) for x in json.loads(f.read().decode())["sources"]]
        except (FileNotFoundError, OSError, ValueError, KeyError):
            if not found:
                raise ValueError(
                    f"archive {self.archive}: no readable Parquet segments of stream "
                    f"{self.stream!r} (no gateway has written one yet)"
                ) from None
            ckpt.fs.create_dir(ckpt.root, recursive=True)
            with ckpt.fs.open_output_stream(path) as out:
                rows = [[s.storage.url, s.gateway] for s in found]
                out.write(json.dumps({"stream": self.stream, "sources": rows}).encode())
            log.info(
                "stream %s: reading gateways %s", self.stream, ", ".join(s.label for s in found)
            )
            return found
        by_key = {(s.storage.url, s.gateway): s for s in found}
        kept = [by_key.get((u, g)) or Source(Storage(u), self.stream, g) for u, g in recorded]
        self._note_unread([s for k, s in by_key.items() if k not in set(recorded)])
        return kept

    def _note_unread(self, new: list[Source]) -> None:
        for s in new:
            if s.label not in self.gateways_unread:
                self.gateways_unread.append(s.label)
                log.warning(
                    "stream %s: gateway %s under %s is not read by this job (its checkpoint "
                    "fixed the gateways it reads); a job with a new checkpoint reads it",
                    self.stream,
                    s.label,
                    s.storage.url,
                )

    def _source(self, sources: list[Source], schema: Schema, watermark: bool) -> DataFrame:
        """The union of the gateways' streams; `watermark`: each with its own."""
        from pyspark.sql import functions as F

        frames = []
        for s in sources:
            df = stream_archive(
                self.spark, s, schema, max_files_per_trigger=self.max_files_per_trigger
            )
            if watermark:
                df = df.withColumn(
                    TS, F.timestamp_seconds(F.col(schema.time or "time"))
                ).withWatermark(TS, self.watermark)
            frames.append(df)
        return reduce(lambda a, b: a.unionByName(b), frames)

    def _batch(self, partials: DataFrame, batch_id: int) -> None:
        self._finish(partials, batch_id)
        with self._lock:
            self.batches += 1

    def start(self) -> StreamingQuery:
        # a slow gateway's watermark holds the others' windows (Spark's default, made explicit)
        self.spark.conf.set("spark.sql.streaming.multipleWatermarkPolicy", "min")
        src = self._source(self.sources, self.schema, self.per_gateway_watermarks)
        other = None
        if self.right is not None:
            other = self._source(self.right_sources, self.right_schema, False)
        partials = (
            self.query.stream_stage(src, watermark=self.watermark)
            if other is None
            else self.query.stream_stage(src, watermark=self.watermark, right=other)
        )
        # Under Connect the function runs on the server: the picklable stage B alone (its
        # sink must write somewhere the gateway reads back: gateway/spark/supervisor.py).
        self._remote = is_remote(self.spark)
        writer = (
            partials.writeStream.outputMode("append")
            .option("checkpointLocation", self.checkpoint)
            .foreachBatch(self._finish if self._remote else self._batch)
        )
        if self.name:
            writer = writer.queryName(self.name)
        if self.available_now:
            writer = writer.trigger(availableNow=True)
        elif self.trigger:
            writer = writer.trigger(processingTime=self.trigger)
        self._handle = writer.start()
        return self._handle

    @property
    def handle(self) -> StreamingQuery:
        if self._handle is None:
            raise RuntimeError("the job has not been started")
        return self._handle

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.stop()

    def await_termination(self, timeout: int | None = None) -> bool | None:
        """Wait for the job to end; re-raises the job's failure (StreamingQueryException)."""
        if timeout is None:
            return self.handle.awaitTermination()
        return self.handle.awaitTermination(timeout)

    def process_all_available(self) -> None:
        self.handle.processAllAvailable()

    def status(self) -> dict[str, Any]:
        """For `GET /queries/{id}`: state, progress and the failure, if any. Raises (py4j, gRPC)
        when the driver is gone: the supervisor takes that as the job failing."""
        if self._handle is None:
            return {"engine": "spark", "state": "created", "columns": list(self.query.columns)}
        h = self._handle
        exc = h.exception()
        progress: dict[str, Any] = h.lastProgress or {}
        batches = self.batches
        if self._remote:  # the batches run on the server: counted from its progress
            batches = int(progress.get("batchId", -1)) + 1
        state = "failed" if exc is not None else ("running" if h.isActive else "stopped")
        return {
            "engine": "spark",
            "state": state,
            "id": str(h.id),
            "run_id": str(h.runId),
            "columns": list(self.query.columns),
            "message": h.status.get("message"),
            "batches": batches,
            "last_batch_id": progress.get("batchId"),
            "input_rows": progress.get("numInputRows"),
            "watermark": (progress.get("eventTime") or {}).get("watermark"),
            # Spark's own count for the last batch: groups (window, keys), not readings
            "late_rows_dropped": sum(
                op.get("numRowsDroppedByWatermark", 0) for op in progress.get("stateOperators", [])
            ),
            "error": None if exc is None else str(exc).splitlines()[0],
            **self.fleet_status(),
        }

    def fleet_status(self) -> dict[str, Any]:
        """Per gateway, across all batches: readings dropped as late, segments refused, and
        gateways under the roots this job does not read."""
        self.progress.update()
        found = fleet_sources(self.roots, self.stream)
        known = {(s.storage.url, s.gateway) for s in self.sources}
        self._note_unread([s for s in found if (s.storage.url, s.gateway) not in known])
        return {
            **self.progress.status(),
            "gateways": [s.label for s in self.sources],
            "gateways_unread": list(self.gateways_unread),
        }
