"""Where a streaming job's result rows go, one micro-batch at a time (`write(df, batch_id)`).

Spark replays a micro-batch after a crash with the same id and the same rows, so a sink that
replaces the batch's output by id is exactly-once (Parquet); sinks that deliver elsewhere
(console, callback, MQTT) are at-least-once across a restart and skip ids they already delivered
within a run.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from gateway.spark.batch import sort_rows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

Rows = list[dict[str, Any]]


class SparkSink(Protocol):
    """Takes each micro-batch of a streaming job (`foreachBatch`) as a DataFrame; the daemon's
    per-query sinks read the result hub instead (`gateway.sinks.base.ResultSink`)."""

    def write(self, df: DataFrame, batch_id: int) -> None: ...


class ParquetSink:
    """One directory per micro-batch, `batch=<id>`, overwritten when a batch is replayed: the
    union of all batch directories is every result row exactly once."""

    def __init__(self, path: str) -> None:
        self.path = str(path).rstrip("/")

    def write(self, df: DataFrame, batch_id: int) -> None:
        df.write.mode("overwrite").parquet(f"{self.path}/batch={batch_id}")

    def read(self, spark: SparkSession) -> DataFrame:
        """Every row written so far (with its `batch` column)."""
        return spark.read.parquet(self.path)


class _Delivering:
    """Collects each batch's rows (result rows are windowed aggregates: few per batch)."""

    def __init__(self) -> None:
        self.last_batch = -1

    def write(self, df: DataFrame, batch_id: int) -> None:
        if batch_id <= self.last_batch:
            return  # replayed within this run: already delivered
        rows = sort_rows(r.asDict() for r in df.collect())
        if rows:
            self.deliver(batch_id, rows)
        self.last_batch = batch_id

    def deliver(self, batch_id: int, rows: Rows) -> None:
        raise NotImplementedError


class ConsoleSink(_Delivering):
    """NDJSON lines, one per row, like `python -m fjords` prints them."""

    def __init__(self, out: TextIO | None = None, query_index: int | None = None) -> None:
        super().__init__()
        self.out = out
        self.query_index = query_index

    def deliver(self, batch_id: int, rows: Rows) -> None:
        out = self.out or sys.stdout
        for r in rows:
            obj = r if self.query_index is None else {"query": self.query_index, **r}
            out.write(json.dumps(obj) + "\n")
        out.flush()


class CallbackSink(_Delivering):
    """Rows handed to a function, e.g. the daemon's result stream for the query."""

    def __init__(self, fn: Callable[[int, Rows], None]) -> None:
        super().__init__()
        self.fn = fn

    def deliver(self, batch_id: int, rows: Rows) -> None:
        self.fn(batch_id, rows)


class SparkMqttSink(_Delivering):
    """Each row published as JSON to `topic` (QoS 1), through the gateway's broker."""

    def __init__(self, host: str, topic: str, *, port: int = 1883, qos: int = 1) -> None:
        super().__init__()
        self.host, self.port, self.topic, self.qos = host, port, topic, qos

    def deliver(self, batch_id: int, rows: Rows) -> None:
        import asyncio

        import aiomqtt

        from sensors.transports.broker import NO_DELAY

        async def publish() -> None:
            async with aiomqtt.Client(self.host, port=self.port, socket_options=NO_DELAY) as client:
                for r in rows:
                    await client.publish(self.topic, json.dumps(r), qos=self.qos)

        # foreachBatch calls run on a Spark callback thread, never on the gateway's loop.
        asyncio.run(publish())


def sink_from_spec(spec: str, *, out: TextIO | None = None) -> SparkSink:
    """`console`, `parquet:DIR`, or `mqtt://HOST[:PORT]/TOPIC` (the CLI's --sink)."""
    if spec == "console":
        return ConsoleSink(out)
    if spec.startswith("parquet:"):
        path = spec.removeprefix("parquet:")
        if not path:
            raise ValueError("parquet sink needs a directory: parquet:DIR")
        return ParquetSink(str(Path(path)))
    if spec.startswith("mqtt://"):
        rest = spec.removeprefix("mqtt://")
        hostport, sep, topic = rest.partition("/")
        if not sep or not topic or not hostport:
            raise ValueError(f"mqtt sink needs mqtt://HOST[:PORT]/TOPIC, got {spec!r}")
        host, _, port = hostport.partition(":")
        try:
            return SparkMqttSink(host, topic, port=int(port) if port else 1883)
        except ValueError:
            raise ValueError(f"bad MQTT port in {spec!r}") from None
    raise ValueError(f"unknown sink {spec!r}: use console, parquet:DIR or mqtt://HOST[:PORT]/TOPIC")
