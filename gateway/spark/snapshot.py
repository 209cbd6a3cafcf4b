"""`"engine": "spark"` on a snapshot: the archive's part aggregated per sensor key by a Spark
batch job (`fjords.snapshot.AggregateSource`).

The segments and pending rows are the ones `ArchiveHistory.select` chooses (the same part of the
range the archive answers without Spark). Each segment's footer is read here first: a segment
whose time statistics miss the range is left out, and one whose footer cannot be read (or lacks
a column) is skipped, counted and named as `ArchiveHistory` does. The job reads the static
columns, the measure and the time of the rest, keeps `start <= time < t1` (t1 per segment), and
groups by the static columns: count(*), count(measure), sum, min, max, collected to the driver.
The writer's pending rows (few) are given as readings. Segments are read through the
writer's `Storage` (footers with pyarrow, the job with the URL Spark knows the storage by); the
job's schema is the stream's, so the `gateway` column of the new layout is not read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from fjords.runtime.history import HistoricalAggregates
from gateway.archive_layout import Storage
from gateway.archive_reader import ArchiveHistory, segment_name
from gateway.spark.schemas import spark_schema

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SparkArchiveAggregates"]


class SparkArchiveAggregates:
    """The archives (`ArchiveHistory`) aggregated on Spark; `session()` gives the SparkSession
    (called in the worker thread that runs the job: the JVM may start there)."""

    name = "spark"

    def __init__(self, archive: ArchiveHistory, session: Callable[[], SparkSession]) -> None:
        self.archive = archive
        self.session = session

    def aggregates(
        self,
        stream: str,
        start: float,
        end: float,
        before: float,
        static: tuple[str, ...],
        measure: str,
    ) -> HistoricalAggregates | None:
        chosen = self.archive.select(stream, start, end, before)
        if chosen is None:
            return None
        schema = chosen.writer.schema
        time = schema.time
        assert time is not None
        names = [*static, measure, time]
        by_end: dict[float, list[str]] = {}
        skipped: list[str] = list(chosen.unlisted)
        storage = chosen.writer.storage
        for path, t1 in chosen.ranges:
            try:
                if _meets(storage, path, names, time, start, t1):
                    by_end.setdefault(t1, []).append(storage.spark_url(path))
            except (OSError, pa.ArrowException, ValueError, KeyError) as e:
                self.archive.unreadable_segment(stream, path, e)
                skipped.append(segment_name(path))
        struct = spark_schema(schema)

        def groups() -> list[tuple]:
            if not by_end:
                return []
            from pyspark.sql import functions as F

            spark = self.session()
            parts = [
                spark.read.schema(struct)
                .parquet(*paths)
                .select(*names)
                .where((F.col(time) >= start) & (F.col(time) < t1))
                for t1, paths in by_end.items()
            ]
            df = parts[0]
            for p in parts[1:]:
                df = df.unionByName(p)
            m = F.col(measure)
            agg = df.groupBy(*static).agg(
                F.count(F.lit(1)).alias("_rows"),
                F.count(m).alias("_n"),
                F.sum(m).alias("_sum"),
                F.min(m).alias("_min"),
                F.max(m).alias("_max"),
            )
            return [tuple(r) for r in agg.collect()]

        return HistoricalAggregates(
            groups, chosen.pending, chosen.complete and not skipped, tuple(skipped)
        )


def _meets(storage: Storage, path: str, names: list[str], time: str, t0: float, t1: float) -> bool:
    """Whether the segment may hold a row of `t0 <= time < t1`, by its row groups' time
    statistics (ValueError: it lacks a column the job reads)."""
    with storage.open_input(path) as source:
        meta = pq.read_metadata(source)
    have = meta.schema.to_arrow_schema().names
    missing = [n for n in names if n not in have]
    if missing:
        raise ValueError(f"no column {missing[0]!r}")
    ti = have.index(time)
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(ti).statistics
        if stats is None or not stats.has_min_max or (stats.max >= t0 and stats.min < t1):
            return True
    return False
