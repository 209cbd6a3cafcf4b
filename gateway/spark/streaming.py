"""Streaming: a Structured Streaming job over the gateway's archive directory.

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

import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gateway.spark.compiler import compile_query
from gateway.spark.query_plan import SparkQuery
from gateway.spark.session import is_remote
from gateway.spark.sinks import SparkSink
from gateway.spark.sources import StaticTable, archive_schema, stream_archive

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

DEFAULT_WATERMARK = "5 minutes"


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
    """One query over one archive directory; `start()`, then `stop()` or `await_termination()`."""

    def __init__(
        self,
        spark: SparkSession,
        sql: str,
        archive: str | os.PathLike[str],
        *,
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
        """`trigger` is a processing-time interval ('10 seconds'); `available_now` processes
        what the archive holds now (in batches of `max_files_per_trigger` files) and stops.
        `right`: (stream, archive) of the second stream of a join of two streams."""
        self.spark = spark
        self.archive = str(archive)
        self.checkpoint = str(checkpoint)
        self.sink = sink
        self.tables = dict(tables or {})
        self.watermark = watermark
        self.trigger = trigger
        self.available_now = available_now
        self.max_files_per_trigger = max_files_per_trigger
        self.name = name
        self.schema = archive_schema(spark, self.archive)
        streams = {stream: self.schema}
        self.right = None if right is None else (right[0], str(right[1]))
        if self.right is not None:
            streams[self.right[0]] = archive_schema(spark, self.right[1])
        self.query: SparkQuery = compile_query(
            sql, streams, {n: t.schema for n, t in self.tables.items()}
        )
        self._handle: StreamingQuery | None = None
        self._lock = threading.Lock()
        self.batches = 0
        self._finish = FinishBatch(self.query, self.tables, self.sink)
        self._remote = False

    def _batch(self, partials: DataFrame, batch_id: int) -> None:
        self._finish(partials, batch_id)
        with self._lock:
            self.batches += 1

    def start(self) -> StreamingQuery:
        src = stream_archive(
            self.spark,
            self.archive,
            self.schema,
            max_files_per_trigger=self.max_files_per_trigger,
        )
        other = None
        if self.right is not None:
            other = stream_archive(
                self.spark,
                self.right[1],
                archive_schema(self.spark, self.right[1]),
                max_files_per_trigger=self.max_files_per_trigger,
            )
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
            # Rows later than the watermark are dropped by Spark; this is its count for the batch.
            "late_rows_dropped": sum(
                op.get("numRowsDroppedByWatermark", 0) for op in progress.get("stateOperators", [])
            ),
            "error": None if exc is None else str(exc).splitlines()[0],
        }
