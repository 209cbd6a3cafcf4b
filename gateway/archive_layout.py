"""Where the archive keeps what: the storage, the paths, names and metadata of its segments.

One place for the writer (gateway/archive.py), the gateway's readers (gateway/archive_reader.py,
gateway/spark/snapshot.py), compaction and Spark's sources (gateway/spark/sources.py):

    ROOT/<stream>/gateway=<id>/date=<YYYY-MM-DD>/part-<seq:08d>-<uuid>.parquet
    ROOT/<stream>/gateway=<id>/date=<YYYY-MM-DD>/compact-<first:08d>-<last:08d>-<uuid>.parquet

- ROOT is a local path or a `file://`, `hdfs://` or `s3://` URL (`Storage`); URLs stay URLs.
- One gateway writes a `gateway=` directory: segment numbers run per (stream, gateway) across
  its dates, so a reader orders a gateway's segments by number.
- `date=` is the UTC date of a segment's earliest reading (event time).
- A compacted file replaces the parts numbered `first..last` of its date directory. While both
  exist (compaction stopped between its commit and its deletes), readers take the compacted file
  and skip the parts it covers (`live`), so compaction is atomic for them.
- Before gateways had identities a stream's parts lay directly in ROOT/<stream>/; they are still
  read (`gateway` None: the local gateway's) and numbered before the new ones.

Names starting with '.' or '_' are never segments (Spark's file source skips them too): that is
how a partial write stays invisible.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from fjords.schema import Schema

__all__ = [
    "GATEWAY_COLUMN",
    "Segment",
    "Storage",
    "arrow_schema",
    "date_of",
    "declared_schema",
    "default_gateway_id",
    "gateways",
    "live",
    "schema_version",
    "segment_metadata",
    "segments",
    "with_gateway",
]

#: the column naming the gateway that accepted a reading (written into every segment)
GATEWAY_COLUMN = "gateway"
#: Parquet key-value metadata of a segment
META_GATEWAY = b"fjords.gateway"
META_STREAM = b"fjords.stream"
META_SCHEMA_VERSION = b"fjords.schema_version"
META_SCHEMA = b"fjords.schema"  # the stream's declared fields, JSON: [[name, type], ...]

_PART = re.compile(r"^part-(\d{8})-[0-9a-f]+\.parquet$")
_COMPACT = re.compile(r"^compact-(\d{8})-(\d{8})-[0-9a-f]+\.parquet$")
_GATEWAY_DIR = re.compile(r"^gateway=(.+)$")
_DATE_DIR = re.compile(r"^date=(\d{4}-\d{2}-\d{2})$")
#: Spark's file streams over the archive ignore a file this much older (mtime) than the newest
#: they have seen (their `maxFileAge`: FileStreamSource.SeenFilesMap takes a file only if its
#: mtime >= newest seen - maxAge), but a new stream's first batch takes every file.
#: Compaction gives its output an mtime more than this before its OLDEST input's and only
#: rewrites a date whose files are all older than `COMPACT_QUIET_S`: a stream that has read any
#: of the parts never reads their compacted copy; a stream started later reads it alone.
#: (The newest input's mtime would not do: a stream that has seen nothing newer than the date,
#: e.g. of a gateway that stopped writing, would read the copy as new: docs/fleet.md.)
STREAM_MAX_FILE_AGE_S = 86_400
COMPACT_QUIET_S = 2 * STREAM_MAX_FILE_AGE_S
#: what a gateway id may be: it is a directory name and a partition value
GATEWAY_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
#: the URL schemes an archive root may have (beside a plain path)
URL_SCHEMES = frozenset({"file", "hdfs", "s3", "s3a"})
_ARROW = {"int": pa.int64(), "float": pa.float64(), "str": pa.string(), "bool": pa.bool_()}
#: pyarrow's name for a URL scheme, where Hadoop's differs
_SCHEMES = {"s3a": "s3", "s3n": "s3", "gcs": "gs"}


def default_gateway_id() -> str:
    """The host name, made to fit GATEWAY_ID (what `[gateway] id` defaults to)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", socket.gethostname()).lstrip("._-")[:63]
    return name if GATEWAY_ID.match(name) else "gateway"


def arrow_schema(schema: Schema, *, gateway: bool = False) -> pa.Schema:
    """The Arrow schema of a stream's segments (`gateway`: with the gateway column first)."""
    fields = [pa.field(f.name, _ARROW[f.type]) for f in schema.fields]
    if gateway and GATEWAY_COLUMN not in schema.names:
        fields.insert(0, pa.field(GATEWAY_COLUMN, pa.string()))
    return pa.schema(fields)


def with_gateway(schema: Schema) -> Schema:
    """A stream's schema as a reader of the fleet's archive sees it: the `gateway` column last."""
    from fjords.schema import Field

    kept = [f for f in schema.fields if f.name != GATEWAY_COLUMN]
    return Schema([*kept, Field(GATEWAY_COLUMN, "str")], time=schema.time)


def schema_version(schema: Schema) -> str:
    """A short fingerprint of the declared fields (names and types, in order): segments written
    under one declaration share it, so a reader sees at a glance which ones differ."""
    text = json.dumps([[f.name, f.type] for f in schema.fields])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def segment_metadata(gateway: str, stream: str, schema: Schema) -> dict[bytes, bytes]:
    return {
        META_GATEWAY: gateway.encode(),
        META_STREAM: stream.encode(),
        META_SCHEMA_VERSION: schema_version(schema).encode(),
        META_SCHEMA: json.dumps([[f.name, f.type] for f in schema.fields]).encode(),
    }


def declared_schema(metadata: dict[bytes, bytes] | None) -> list[tuple[str, str]] | None:
    """The declared fields a segment was written under (None: a segment without metadata)."""
    if not metadata or META_SCHEMA not in metadata:
        return None
    return [(str(n), str(t)) for n, t in json.loads(metadata[META_SCHEMA])]


def date_of(t: float) -> str:
    """The `date=` partition of a segment whose earliest reading is at `t` (epoch seconds)."""
    try:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d")
    except (OverflowError, OSError, ValueError):  # a clock far off: kept, under a date of its own
        return "0000-00-00" if t < 0 else "9999-12-31"


@dataclass(frozen=True)
class Segment:
    """A committed file of the archive: its path (inside the storage), the gateway and date
    directories it is in (None: the legacy flat layout) and the part numbers it holds."""

    path: str
    gateway: str | None
    date: str | None
    first: int
    last: int
    compacted: bool

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


def parse_name(directory: str, name: str, gateway: str | None, date: str | None) -> Segment | None:
    """The segment a file name denotes (None: not a segment: temporary, hidden, foreign)."""
    if m := _PART.match(name):
        n = int(m.group(1))
        return Segment(f"{directory}/{name}", gateway, date, n, n, False)
    if m := _COMPACT.match(name):
        first, last = int(m.group(1)), int(m.group(2))
        if first <= last:
            return Segment(f"{directory}/{name}", gateway, date, first, last, True)
    return None


def part_name(seq: int) -> str:
    return f"part-{seq:08d}-{uuid.uuid4().hex[:12]}.parquet"


def compact_name(first: int, last: int) -> str:
    return f"compact-{first:08d}-{last:08d}-{uuid.uuid4().hex[:12]}.parquet"


class Storage:
    """The archive's root on a filesystem: a local directory (written with fsync and an atomic
    rename, so a crash leaves no partial segment under a segment's name), or HDFS or an object
    store through pyarrow's filesystems (an object store has no rename: a segment is one object,
    visible whole when its upload completes)."""

    def __init__(self, url: str | os.PathLike[str], *, fs: pafs.FileSystem | None = None) -> None:
        """`fs`: the filesystem to use instead of the one the URL names (`url` then gives the
        scheme, which decides how a segment is committed, and the root's path in `fs`)."""
        text = os.fspath(url)
        self.url = text
        scheme = urlsplit(text).scheme if "://" in text else ""
        self.fs: pafs.FileSystem
        if fs is not None:
            split = urlsplit(text)
            self.fs = fs
            self.root = f"{split.netloc}{split.path}".rstrip("/") if scheme else text.rstrip("/")
            self.scheme = scheme or "file"
        elif scheme in ("", "file"):
            path = urlsplit(text).path if scheme else text
            self.fs = pafs.LocalFileSystem()
            self.root = str(Path(path).absolute())
            self.scheme = "file"
        else:
            fs_scheme = _SCHEMES.get(scheme, scheme)
            rest = text[len(scheme) + 3 :]
            try:
                self.fs, self.root = pafs.FileSystem.from_uri(f"{fs_scheme}://{rest}")
            except (pa.ArrowException, OSError, ValueError) as e:  # no libhdfs, no such bucket
                why = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise ValueError(f"archive {text}: cannot open its filesystem: {why}") from None
            self.root = self.root.rstrip("/")
            self.scheme = scheme
        self.local = isinstance(self.fs, pafs.LocalFileSystem)

    def __repr__(self) -> str:
        return f"Storage({self.url!r})"

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def spark_url(self, path: str | None = None) -> str:
        """`path` (default: the root) as Spark names it: file:///..., hdfs://..., s3a://..."""
        path = self.root if path is None else path
        if self.local:
            return f"file://{path}"  # unquoted: Hadoop's Path quotes what it must itself
        scheme = "s3a" if self.scheme in ("s3", "s3a", "s3n") else self.scheme
        netloc = urlsplit(self.url).netloc if self.scheme == "hdfs" else ""
        return f"{scheme}://{netloc}{'/' if netloc else ''}{path.lstrip('/')}"

    def list_dir(self, directory: str) -> list[pafs.FileInfo]:
        """The entries of `directory` (none if it does not exist)."""
        try:
            return self.fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
        except FileNotFoundError:
            return []

    def open_input(self, path: str) -> pa.NativeFile:
        return self.fs.open_input_file(path)

    def commit(
        self, directory: str, name: str, table: pa.Table, *, mtime: float | None = None
    ) -> str:
        """Write `table` as `directory/name`, whole or not at all; returns its path. `mtime`
        (local storage only: elsewhere a ValueError) is the file's modification time from the
        moment it is visible, so a Spark file stream never sees it with another one."""
        final = f"{directory}/{name}"
        if self.local:
            _commit_local(Path(directory), name, table, mtime)
            return final
        if mtime is not None:
            raise ValueError(f"archive {self.url}: a file's mtime cannot be set on {self.scheme}")
        self.fs.create_dir(directory, recursive=True)
        if self.scheme == "hdfs":  # a rename is atomic there: as on a local disk
            tmp = f"{directory}/.{name}.tmp"
            try:
                with self.fs.open_output_stream(tmp) as out:
                    pq.write_table(table, out)
                self.fs.move(tmp, final)
            except BaseException:
                with contextlib.suppress(OSError, pa.ArrowException):
                    self.fs.delete_file(tmp)
                raise
            return final
        with self.fs.open_output_stream(final) as out:  # one object: visible when complete
            pq.write_table(table, out)
        return final

    def delete(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(path)
        if self.local:
            _fsync_dir(Path(path).parent)


def _commit_local(directory: Path, name: str, table: pa.Table, mtime: float | None = None) -> None:
    """Hidden temporary file, fsync, rename, fsync the directory: a crash leaves at most the
    temporary file (removed at the next start), never a partial segment under its name."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{name}.tmp"
    try:
        with open(tmp, "wb") as f:
            pq.write_table(table, f)
            f.flush()
            if mtime is not None:  # after the last write, before the name is visible
                os.utime(f.fileno(), (mtime, mtime))
            os.fsync(f.fileno())
        os.replace(tmp, directory / name)
    except BaseException:
        with contextlib.suppress(OSError):  # a failed write leaves nothing behind if it can
            tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename (or delete) itself is durable
    finally:
        os.close(dir_fd)


def gateways(storage: Storage, stream: str) -> list[str]:
    """The gateways with a directory under the stream, sorted."""
    out = []
    for info in storage.list_dir(storage.path(stream)):
        if info.type == pafs.FileType.Directory and (m := _GATEWAY_DIR.match(info.base_name)):
            out.append(m.group(1))
    return sorted(out)


def _files(storage: Storage, directory: str) -> Iterable[pafs.FileInfo]:
    return (i for i in storage.list_dir(directory) if i.type == pafs.FileType.File)


def segments(storage: Storage, stream: str, gateway: str | None) -> list[Segment]:
    """Every committed file of one gateway's stream (`gateway` None: the legacy flat layout
    only), compacted or not, ordered by first part number."""
    out: list[Segment] = []
    if gateway is None:
        base = storage.path(stream)
        for info in _files(storage, base):
            if (s := parse_name(base, info.base_name, None, None)) and not s.compacted:
                out.append(s)
    else:
        gdir = storage.path(stream, f"gateway={gateway}")
        for d in storage.list_dir(gdir):
            if d.type != pafs.FileType.Directory or not (m := _DATE_DIR.match(d.base_name)):
                continue
            ddir = f"{gdir}/{d.base_name}"
            for info in _files(storage, ddir):
                if s := parse_name(ddir, info.base_name, gateway, m.group(1)):
                    out.append(s)
    return sorted(out, key=lambda s: (s.first, -s.last, s.path))


def live(found: list[Segment]) -> list[Segment]:
    """What a reader reads of `found` (one gateway's, sorted as `segments` returns them): each
    part once, from a compacted file where one covers it. Two compacted files over the same
    parts (compaction stopped before deleting its input): the wider one, then the first."""
    out: list[Segment] = []
    covered = -1  # the highest part number taken so far
    for s in found:
        if s.last <= covered:
            continue  # covered by a compacted file already taken
        if s.first <= covered:
            continue  # overlaps one taken: a compacted file's leftover input, or a foreign one
        out.append(s)
        covered = s.last
    return out


def next_seq(found: list[Segment]) -> int:
    """The number of a gateway's next segment."""
    return max((s.last for s in found), default=-1) + 1
