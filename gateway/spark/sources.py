"""Where Spark reads from: the gateways' Parquet archives (batch or file streams), trace files,
and static tables that are reloaded when their file changes.

Archive layout: gateway/archive_layout.py (ROOT/<stream>/gateway=<id>/date=<day>/part-*.parquet,
compacted files replacing parts, legacy flat ROOT/<stream>/part-* segments). A fleet is one or
more roots; every gateway under a root is read, each as a source of its own (so a streaming job
gives each gateway its own watermark), unless a `gateways` filter names the ones to read.

Schema: a stream is read with its DECLARED schema (`declared_stream_schema`), never one file's:
each segment is judged against it by `classify` (one pure function, applied by the driver to
the footers and by the executors' decoder to the files they read): a declared column a segment
lacks reads as NULL, a type that widens safely (ints to int64, ints to float64, float32 to
float64) is cast, anything else refuses the segment, which yields no rows and is named in a log
line and counted (`Refusals`), never a failed job. Files are read as `binaryFile` rows decoded
by pyarrow in `mapInArrow` (`decode_segments`), so no Parquet schema merge in Spark can fail a
job. The `gateway` column comes from the segment, or from its `gateway=` directory; legacy flat
segments read with `gateway` NULL.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from fjords.schema import Field, Schema
from fjords.tables import Table, TableError
from fjords.trace import Trace
from gateway import archive_layout as layout
from gateway.archive_layout import GATEWAY_COLUMN, STREAM_MAX_FILE_AGE_S, Segment, Storage
from gateway.spark.schemas import spark_schema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("gateway.spark.sources")

_ARROW = {"int": pa.int64(), "float": pa.float64(), "str": pa.string(), "bool": pa.bool_()}
_KIND = {v: k for k, v in _ARROW.items()}
#: the only files of a gateway's directories a stream reads (`archive_layout` names)
SEGMENT_GLOB = "{part,compact}-*.parquet"


# -- writing (tests, benchmarks, demos) -----------------------------------------------------


def write_segment(
    root: str | os.PathLike[str],
    table: pa.Table,
    seq: int,
    *,
    gateway: str | None,
    stream: str = "traffic",
) -> str:
    """Commit one segment of `table` exactly as a gateway's archive does: under
    ROOT/<stream>/gateway=<id>/date=<day>/ with the `gateway` column and the segment metadata
    (`gateway` None: a legacy flat segment, ROOT/<stream>/part-*, as it is)."""
    storage = Storage(root)
    if gateway is None:
        return storage.commit(storage.path(stream), layout.part_name(seq), table)
    declared = schema_of_arrow(
        table.drop_columns([c for c in table.column_names if c == GATEWAY_COLUMN]).schema
    )
    if GATEWAY_COLUMN not in table.column_names:
        table = table.add_column(
            0, GATEWAY_COLUMN, pa.array([gateway] * table.num_rows, pa.string())
        )
    meta = {**(table.schema.metadata or {}), **layout.segment_metadata(gateway, stream, declared)}
    table = table.replace_schema_metadata(meta)
    times = table["time"] if "time" in table.column_names else None
    first = pc.min(times).as_py() if times is not None and table.num_rows else None
    date = layout.date_of(float(first)) if first is not None else layout.date_of(0)
    directory = storage.path(stream, f"gateway={gateway}", f"date={date}")
    return storage.commit(directory, layout.part_name(seq), table)


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


def archive_table(
    t: pa.Table,
    root: str | os.PathLike[str],
    *,
    gateway: str | None,
    stream: str = "traffic",
    segments: int = 8,
    first_seq: int = 0,
) -> list[str]:
    """Write `t` as `segments` segments of one gateway, in row order."""
    n = t.num_rows
    step = max(1, -(-n // segments))
    return [
        write_segment(root, t.slice(off, step), first_seq + i, gateway=gateway, stream=stream)
        for i, off in enumerate(range(0, n, step))
    ]


def archive_trace(
    readings: str | os.PathLike[str],
    stations: str | os.PathLike[str] | None,
    root: str | os.PathLike[str],
    *,
    gateway: str | None,
    stream: str = "traffic",
    segments: int = 8,
    first_seq: int = 0,
) -> list[str]:
    """Write a trace as one gateway's `segments` archive segments in time order."""
    t = trace_table(readings, stations)
    return archive_table(
        t, root, gateway=gateway, stream=stream, segments=segments, first_seq=first_seq
    )


# -- the declared schema and the one rule for segments ----------------------------------------

#: physical types cast to the declared one (the value never changes)
_SAFE = {
    pa.int64(): {pa.int8(), pa.int16(), pa.int32(), pa.uint8(), pa.uint16(), pa.uint32()},
    pa.float64(): {
        pa.float16(), pa.float32(), pa.int8(), pa.int16(), pa.int32(), pa.int64(),
        pa.uint8(), pa.uint16(), pa.uint32(),
    },
    pa.string(): {pa.large_string()},
}  # fmt: skip


def classify(physical: pa.Schema, declared: pa.Schema) -> str | None:
    """Why a segment with `physical` columns cannot be read as `declared` (None: it can: a
    missing column reads NULL, a safe widening is cast, an undeclared column is left out)."""
    for f in declared:
        i = physical.get_field_index(f.name)
        if i < 0:
            if f.name == "time":
                return "no 'time' column"
            continue
        got = physical.field(i).type
        if got == f.type or pa.types.is_null(got) or got in _SAFE.get(f.type, ()):
            continue
        if pa.types.is_dictionary(got) and got.value_type in (f.type, *_SAFE.get(f.type, ())):
            continue
        return f"column {f.name!r} is {got}, declared {f.type}"
    return None


def gateway_of_path(path: str) -> str | None:
    """The gateway a segment's `gateway=` directory names (None: a legacy flat segment)."""
    parts = path.split("/")
    for p in reversed(parts[:-1]):
        if p.startswith("gateway="):
            return p[len("gateway=") :]
    return None


def conform(table: pa.Table, declared: pa.Schema, gateway: str | None) -> pa.Table:
    """`table` (which `classify` accepted) as `declared`: columns cast, missing ones NULL, the
    `gateway` column filled from the segment's directory where the segment has none."""
    cols = []
    for f in declared:
        if f.name in table.column_names:
            col = table[f.name]
            if pa.types.is_dictionary(col.type):
                col = col.cast(col.type.value_type)
            col = col.cast(f.type)
            if f.name == GATEWAY_COLUMN and gateway is not None and col.null_count:
                col = pc.fill_null(col, gateway)
        elif f.name == GATEWAY_COLUMN and gateway is not None:
            col = pa.chunked_array([pa.array([gateway] * table.num_rows, f.type)], f.type)
        else:
            col = pa.chunked_array([pa.nulls(table.num_rows, f.type)], f.type)
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=declared)


def decode_segments(
    batches: Iterable[pa.RecordBatch], *, declared: pa.Schema
) -> Iterator[pa.RecordBatch]:
    """`mapInArrow` over `binaryFile` rows: each file decoded by pyarrow and conformed to the
    declared schema; a file `classify` refuses (or that is unreadable) yields no rows (the
    driver, applying the same rule to the footers, counts and names it)."""
    for batch in batches:
        paths = batch.column("path").to_pylist()
        contents = batch.column("content")
        for i, path in enumerate(paths):
            data = contents[i].as_buffer()
            if data is None:
                continue
            try:
                table = pq.read_table(pa.BufferReader(data))
            except (pa.ArrowException, OSError):
                continue
            if classify(table.schema, declared) is not None:
                continue
            yield from conform(table, declared, gateway_of_path(path)).to_batches()


def footer_schema(storage: Storage, path: str) -> pa.Schema:
    with storage.open_input(path) as f:
        return pq.read_schema(f)


def judge(storage: Storage, path: str, declared: pa.Schema) -> str | None:
    """`classify` of a file by its footer; an unreadable footer is a refusal too."""
    try:
        physical = footer_schema(storage, path)
    except (pa.ArrowException, OSError) as e:
        return f"unreadable footer ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
    return classify(physical, declared)


@dataclass
class Refusals:
    """Segments refused by the declared schema: counted, each named in a log line once."""

    stream: str
    paths: dict[str, str] = field(default_factory=dict)  # path -> why
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, path: str, why: str) -> None:
        with self._lock:
            if path in self.paths:
                return
            self.paths[path] = why
        log.warning(
            "stream %s: segment %s refused (%s); its rows are not read", self.stream, path, why
        )

    @property
    def count(self) -> int:
        return len(self.paths)


def builtin_schema(stream: str) -> Schema | None:
    """The gateway's own streams' declarations (gateway/daemon.py)."""
    if stream not in ("traffic", "vehicles"):
        return None
    from gateway.daemon import TRAFFIC_SCHEMA, VEHICLES_SCHEMA

    return TRAFFIC_SCHEMA if stream == "traffic" else VEHICLES_SCHEMA


def _newest_metadata(storage: Storage, stream: str) -> tuple[str, pa.Schema] | None:
    """The newest segment (last by number of the gateway whose last file is newest): its path
    and footer schema (with metadata)."""
    best: tuple[float, str] | None = None
    for g in [*layout.gateways(storage, stream), None]:
        segs = layout.live(layout.segments(storage, stream, g))
        if not segs:
            continue
        info = storage.fs.get_file_info(segs[-1].path)
        mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
        if best is None or mtime > best[0]:
            best = (mtime, segs[-1].path)
    if best is None:
        return None
    return best[1], footer_schema(storage, best[1])


def declared_stream_schema(
    roots: Sequence[Storage], stream: str, declared: Schema | None = None
) -> Schema:
    """The schema a fleet's stream is read with, `gateway` (str) added last: `declared` (a
    `[[mqtt.streams]]` declaration), else the gateway's own (traffic, vehicles), else the
    newest segment's `fjords.schema` metadata, else (legacy segments without metadata) the
    newest segment's columns, said in a log line."""
    schema = declared or builtin_schema(stream)
    if schema is None:
        found = [(r, m) for r in roots if (m := _newest_metadata(r, stream)) is not None]
        if not found:
            where = ", ".join(r.url for r in roots)
            raise TableError(f"archive {where}: no segments of stream {stream!r}")
        _, (path, physical) = found[-1]
        fields = layout.declared_schema(physical.metadata)
        if fields is not None:
            schema = Schema([Field(n, t) for n, t in fields], time="time")
        else:
            log.warning(
                "stream %s: newest segment %s has no declared schema (a legacy segment): its "
                "columns are the stream's",
                stream,
                path,
            )
            schema = schema_of_arrow(physical)
    if schema.time is None or "time" not in schema.names:
        raise TableError(f"stream {stream!r}: segments need a 'time' column (epoch seconds)")
    return layout.with_gateway(schema)


def schema_of_arrow(physical: pa.Schema) -> Schema:
    """The Fjord schema of a segment's columns (ints int, floats float, booleans bool, the
    rest str)."""
    fields = []
    for f in physical:
        t = f.type
        kind = (
            "int" if pa.types.is_integer(t)
            else "float" if pa.types.is_floating(t)
            else "bool" if pa.types.is_boolean(t)
            else "str"
        )  # fmt: skip
        fields.append(Field(f.name, kind))
    return Schema(fields, time="time" if "time" in physical.names else None)


def arrow_declared(schema: Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, _ARROW[f.type]) for f in schema.fields])


# -- the fleet's sources ----------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """One gateway's segments of a stream under one root (`gateway` None: legacy flat)."""

    storage: Storage
    stream: str
    gateway: str | None

    @property
    def label(self) -> str:
        return self.gateway if self.gateway is not None else "(legacy)"

    def directory(self) -> str:
        if self.gateway is None:
            return self.storage.path(self.stream)
        return self.storage.path(self.stream, f"gateway={self.gateway}")

    def segments(self) -> list[Segment]:
        return layout.live(layout.segments(self.storage, self.stream, self.gateway))


def roots_of(archives: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[Storage]:
    items = [archives] if isinstance(archives, (str, os.PathLike)) else list(archives)
    if not items:
        raise ValueError("no archive root given")
    urls = [os.fspath(a) for a in items]
    if len(set(urls)) != len(urls):
        raise ValueError(f"archive roots given twice: {urls}")
    return [Storage(u) for u in urls]


def fleet_sources(
    roots: Sequence[Storage], stream: str, gateways: Sequence[str] | None = None
) -> list[Source]:
    """Every gateway of `stream` under each root (legacy flat segments as one more source),
    or only `gateways`; a gateway named but found under no root is an error."""
    wanted = None if not gateways else set(gateways)
    out: list[Source] = []
    seen: set[str] = set()
    for r in roots:
        for g in layout.gateways(r, stream):
            seen.add(g)
            if wanted is None or g in wanted:
                out.append(Source(r, stream, g))
        if wanted is None and layout.segments(r, stream, None):
            out.append(Source(r, stream, None))
    if wanted is not None and (missing := wanted - seen):
        raise ValueError(f"stream {stream!r}: no gateway {sorted(missing)} under the archive")
    return out


def _decoded(df: DataFrame, schema: Schema) -> DataFrame:
    declared = arrow_declared(schema)
    return df.select("path", "content").mapInArrow(
        functools.partial(decode_segments, declared=declared), spark_schema(schema)
    )


def read_archive(
    spark: SparkSession,
    sources: Sequence[Source],
    schema: Schema,
    refusals: Refusals | None = None,
) -> DataFrame:
    """The sources' live segments as one batch DataFrame of the declared `schema`; segments
    it refuses (by their footers) are left out and added to `refusals`."""
    refusals = refusals if refusals is not None else Refusals(schema_stream(sources))
    declared = arrow_declared(schema)
    urls: list[str] = []
    for s in sources:
        for seg in s.segments():
            why = judge(s.storage, seg.path, declared)
            if why is not None:
                refusals.add(s.storage.spark_url(seg.path), why)
            else:
                urls.append(s.storage.spark_url(seg.path))
    if not urls:
        return spark.createDataFrame([], spark_schema(schema))
    return _decoded(spark.read.format("binaryFile").load(urls), schema)


def schema_stream(sources: Sequence[Source]) -> str:
    return sources[0].stream if sources else "?"


def stream_archive(
    spark: SparkSession,
    source: Source,
    schema: Schema,
    *,
    max_files_per_trigger: int | None = None,
) -> DataFrame:
    """One gateway's segments as a file stream (new segments picked up as they are
    committed), decoded to the declared `schema`. `maxFileAge` is the archive's
    (`STREAM_MAX_FILE_AGE_S`): compaction relies on it."""
    from pyspark.sql import types as T

    binary = T.StructType(
        [
            T.StructField("path", T.StringType(), True),
            T.StructField("modificationTime", T.TimestampType(), True),
            T.StructField("length", T.LongType(), True),
            T.StructField("content", T.BinaryType(), True),
        ]
    )
    reader = (
        spark.readStream.format("binaryFile")
        .schema(binary)
        .option("maxFileAge", f"{STREAM_MAX_FILE_AGE_S}s")
    )
    if max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
    if source.gateway is None:  # the flat files only, not the gateways' directories beside them
        url = source.storage.spark_url(f"{source.directory()}/part-*.parquet")
    else:  # every date directory; no partition columns inferred from the directory names
        reader = reader.option("recursiveFileLookup", "true").option("pathGlobFilter", SEGMENT_GLOB)
        url = source.storage.spark_url(source.directory())
    return _decoded(reader.load(url), schema)


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
