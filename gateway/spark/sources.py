"""Where Spark reads from: the gateway's Parquet archive (batch or file stream), trace files, and
static tables that are reloaded when their file changes.

Archive layout (written by the gateway; `write_segment` here follows the same contract): one
directory per stream holding `part-<seq:08d>-<uuid>.parquet` segments with exactly the stream's
columns. Each segment is written under a name starting with '.' and `os.replace`d into place, and
Spark's file source skips names starting with '.' or '_', so it never reads a partial segment.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from fjords.schema import Schema
from fjords.tables import Table, TableError
from fjords.trace import Trace
from gateway.archive import write_table
from gateway.spark.schemas import fjord_schema, spark_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_ARROW = {"int": pa.int64(), "float": pa.float64(), "str": pa.string(), "bool": pa.bool_()}


# -- archive -----------------------------------------------------------------------------------


def write_segment(directory: str | os.PathLike[str], table: pa.Table, seq: int) -> Path:
    """Commit one archive segment atomically, exactly as the gateway's archive does."""
    return write_table(directory, seq, table)


def trace_table(
    readings: str | os.PathLike[str], stations: str | os.PathLike[str] | None
) -> pa.Table:
    """A trace (CSV or Parquet) plus station attributes as one Arrow table, typed like the Fjord's
    Trace (identifier columns text, `time` int, other numbers float), rows in file order."""
    trace = Trace(readings, stations)
    base = [n for n in trace.schema.names if n in trace._columns]
    types = {f.name: _ARROW[f.type] for f in trace.schema.fields}
    path = Path(readings)
    if path.suffix.lower() in (".parquet", ".pq"):
        t = pq.read_table(path, columns=base)
        t = t.cast(pa.schema([(n, types[n]) for n in base]))
    else:
        t = pacsv.read_csv(
            path, convert_options=pacsv.ConvertOptions(column_types={n: types[n] for n in base})
        )
        t = t.select(base)
    if trace.stations is not None:
        st = trace.stations
        key = trace.sensor_field
        assert key is not None  # a trace with stations has their key column (fjords.trace)
        keys = pa.array([r[st.schema.index(key)] for r in st.rows], type=types[key])
        idx = pc.index_in(t[key], value_set=keys)
        for f in trace.schema.fields:
            if f.name in base:
                continue
            col = pa.array([r[st.schema.index(f.name)] for r in st.rows], type=_ARROW[f.type])
            t = t.append_column(f.name, col.take(idx))
    return t


def archive_trace(
    readings: str | os.PathLike[str],
    stations: str | os.PathLike[str] | None,
    directory: str | os.PathLike[str],
    *,
    segments: int = 8,
    first_seq: int = 0,
) -> list[Path]:
    """Write a trace as `segments` archive segments in time order (tests, benchmarks, demos)."""
    t = trace_table(readings, stations)
    n = t.num_rows
    step = max(1, -(-n // segments))
    return [
        write_segment(directory, t.slice(off, step), first_seq + i)
        for i, off in enumerate(range(0, n, step))
    ]


def archive_schema(spark: SparkSession, directory: str) -> Schema:
    """The stream's schema, from its segments (read through Spark: works on any file system)."""
    try:
        struct = spark.read.parquet(str(directory)).schema
    except Exception as e:  # noqa: BLE001 - AnalysisException when empty or missing
        raise TableError(f"archive {directory}: no readable Parquet segments ({e})") from None
    schema = fjord_schema(struct)
    if schema.time is None:
        raise TableError(f"archive {directory}: segments need a 'time' column (epoch seconds)")
    return schema


def read_archive(spark: SparkSession, directory: str, schema: Schema | None = None) -> DataFrame:
    """The whole archive as a batch DataFrame."""
    schema = schema or archive_schema(spark, directory)
    return spark.read.schema(spark_schema(schema)).parquet(str(directory))


def stream_archive(
    spark: SparkSession,
    directory: str,
    schema: Schema,
    *,
    max_files_per_trigger: int | None = None,
) -> DataFrame:
    """The archive as a file stream: new segments are picked up as the gateway commits them."""
    reader = spark.readStream.schema(spark_schema(schema))
    if max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
    return reader.parquet(str(directory))


def read_trace(
    spark: SparkSession,
    readings: str | os.PathLike[str],
    stations: str | os.PathLike[str] | None = None,
) -> tuple[DataFrame, Schema]:
    """A trace file (plus stations) as a batch DataFrame, typed like the Fjord reads it."""
    trace = Trace(readings, stations)
    base = [n for n in trace.schema.names if n in trace._columns]
    base_schema = Schema([trace.schema.fields[trace.schema.index(n)] for n in base], time="time")
    path = str(readings)
    if path.lower().endswith((".parquet", ".pq")):
        from pyspark.sql import functions as F

        df = spark.read.parquet(path)
        df = df.select(
            *[
                F.col(f.name).cast(spark_schema(base_schema)[f.name].dataType)
                for f in base_schema.fields
            ]
        )
    else:
        df = spark.read.csv(path, header=True, schema=spark_schema(base_schema), mode="FAILFAST")
    if trace.stations is not None and trace.sensor_field is not None:
        st = trace.stations
        extra = [f for f in trace.schema.fields if f.name not in base]
        keep = [st.schema.index(trace.sensor_field)] + [st.schema.index(f.name) for f in extra]
        st_schema = Schema(
            [base_schema.fields[base_schema.index(trace.sensor_field)], *extra], time=None
        )
        st_df = spark.createDataFrame(
            [tuple(r[i] for i in keep) for r in st.rows], spark_schema(st_schema)
        )
        df = df.join(st_df, on=trace.sensor_field, how="left").select(*trace.schema.names)
    return df, trace.schema


# -- static tables -----------------------------------------------------------------------------


class StaticTable:
    """A static table (CSV or Parquet) for joins; `dataframe()` reloads it when the file changed.

    Loaded with the Fjord's own loader, so both engines type every column the same way.
    """

    def __init__(self, name: str, path: str | os.PathLike[str]) -> None:
        self.name = name
        self.path = Path(path)
        self._table = Table.from_file(name, self.path)
        self._df: DataFrame | None = None
        self._df_version = -1
        self.reloads = 0

    @property
    def schema(self) -> Schema:
        return self._table.schema

    def check_changed(self) -> bool:
        """Re-read the file if it changed; a file that is briefly unreadable keeps the old rows."""
        try:
            changed = self._table.reload_if_changed()
        except TableError:
            return False
        if changed:
            self.reloads += 1
        return changed

    def dataframe(self, spark: SparkSession) -> DataFrame:
        self.check_changed()
        if self._df is None or self._df_version != self._table.version:
            self._df = spark.createDataFrame(self._table.rows, spark_schema(self._table.schema))
            self._df_version = self._table.version
        return self._df
