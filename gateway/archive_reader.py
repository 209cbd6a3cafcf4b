"""The archive as the streams' historical segment: what snapshots answer from where the history
no longer holds every reading (`fjords.snapshot.HistoricalSource`).

The history holds every reading of this run from its `complete_from` (B) on; the archive holds
every reading the stream accepted since it began (this run's and earlier runs'). So the part
of a snapshot the archive answers is, of `[from, to)`:

- this run's readings with time < B: from the segments this run committed (numbered from the
  writer's `first_seq` to below its `seq`) and from the rows not yet on disk (the writer's
  `pending()`: late readings with time < B may have arrived a moment ago);
- every reading of the segments earlier runs wrote (numbered below `first_seq`): this run's
  history never had them, whatever their time.

The segments are this gateway's (`gateway=<id>/`, each part once: `archive_layout.live`) and
the stream's legacy flat ones (written before gateways had ids, all numbered below the first of
the new layout). A compacted file covering parts `first..last` counts as one segment numbered
`last`. A segment numbered `seq` or above is on its way (its rows are still among the pending ones, and
counted there), and hidden temporary files are never segments. Only the row groups whose time
statistics meet the range are read, and only the columns the query reads.

An unreadable segment (corrupt, truncated, another schema) is skipped: counted once per file
(`unreadable`, /metrics), logged the first time, and named in the answer, which is then not
complete. So is an answer while the writer has dropped rows (its input queue overflowed), or
holds pre-aggregated windows (no readings). What `complete` cannot know: readings a run without
`[archive] dir`, or a crash before their segment was written, never archived; an archive whose
first segments were deleted by hand.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from fjords.partial import Partial
from fjords.runtime.history import Historical
from gateway import archive_layout as layout
from gateway.archive import ArchiveWriter
from gateway.archive_layout import Storage

__all__ = ["ArchiveHistory", "Selection"]

log = logging.getLogger("gateway.archive")


@dataclass
class Selection:
    """The part of a range an archive holds that its stream's history does not (see the
    module docstring): segments with the end of the time range to read of each, and the
    writer's pending rows in the range (readings; `aggregated`: some were not)."""

    writer: ArchiveWriter
    ranges: list[tuple[str, float]]  # paths in the writer's storage
    pending: list[tuple]
    aggregated: bool
    #: what could not even be listed (the storage refused: an object store out of reach)
    unlisted: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        """Nothing lost on the way (readable segments aside)."""
        return not self.aggregated and self.writer.input.drops == 0


class ArchiveHistory:
    """The archives of the streams (stream -> ArchiveWriter) as a `HistoricalSource`."""

    def __init__(self, archives: Mapping[str, ArchiveWriter]) -> None:
        self.archives = archives
        #: segments found unreadable, by stream (each file once)
        self.unreadable: dict[str, set[str]] = {name: set() for name in archives}
        #: snapshots answered without the archive's segments: its storage could not list them
        self.list_failures: dict[str, int] = {}

    def unreadable_counts(self) -> dict[str, int]:
        return {name: len(paths) for name, paths in self.unreadable.items()}

    def select(self, stream: str, start: float, end: float, before: float) -> Selection | None:
        """Which segments (each with the end of the time range to read of it) and which of
        the writer's pending rows hold the part of `[start, end)` the history does not."""
        writer = self.archives.get(stream)
        if writer is None:
            return None
        ranges: list[tuple[str, float]] = []
        mine_end = min(end, before)  # this run's segments: what the history no longer holds
        unlisted: tuple[str, ...] = ()
        try:
            found = archived(writer)
        except (OSError, pa.ArrowException) as e:
            found, unlisted = [], (writer.gateway_dir,)
            failures = self.list_failures.get(stream, 0)
            self.list_failures[stream] = failures + 1
            if failures == 0:
                log.error(
                    "archive %s: cannot list the segments in %s (%s); snapshots answer without "
                    "them, not complete, naming it (each such snapshot counted)",
                    stream,
                    writer.gateway_dir,
                    e,
                )
        for seg in found:
            if seg.last >= writer.seq:
                continue  # still pending: read from the writer below
            t1 = end if seg.last < writer.first_seq else mine_end
            if t1 > start:
                ranges.append((seg.path, t1))
        pending: list[tuple] = []
        aggregated = False
        if mine_end > start:
            time = writer.schema.time
            assert time is not None
            ti = writer.schema.index(time)
            for row in writer.pending():
                if start <= row[ti] < mine_end:
                    if any(v.__class__ is Partial for v in row):
                        aggregated = True
                    else:
                        pending.append(row)
        return Selection(writer, ranges, pending, aggregated, unlisted)

    def readings(
        self, stream: str, start: float, end: float, before: float, fields: frozenset[str]
    ) -> Historical | None:
        chosen = self.select(stream, start, end, before)
        if chosen is None:
            return None
        schema = chosen.writer.schema
        time = schema.time
        assert time is not None
        names = [n for n in schema.names if n in fields or n == time]
        tables: list[pa.Table] = []
        skipped: list[str] = list(chosen.unlisted)
        storage = chosen.writer.storage
        for path, t1 in chosen.ranges:
            try:
                table = _read(storage, path, names, time, start, t1)
            except (OSError, pa.ArrowException, ValueError, KeyError) as e:
                self.unreadable_segment(stream, path, e)
                skipped.append(segment_name(path))
                continue
            if table is not None and table.num_rows:
                tables.append(table)
        pending = chosen.pending
        count = sum(t.num_rows for t in tables) + len(pending)

        def tuples() -> list[tuple]:
            out = [row for t in tables for row in _as_tuples(t, schema.names)]
            return out + pending

        return Historical(count, tuples, chosen.complete and not skipped, tuple(skipped))

    def unreadable_segment(self, stream: str, path: str, error: Exception) -> None:
        seen = self.unreadable.setdefault(stream, set())
        name = segment_name(path)
        if name not in seen:
            seen.add(name)
            log.error(
                "archive %s: segment %s is unreadable (%s); snapshots skip it and say so",
                stream,
                path,
                error,
            )


def archived(writer: ArchiveWriter) -> list[layout.Segment]:
    """The stream's committed segments a reader of this gateway reads: the legacy flat ones,
    then the gateway's own (each part once)."""
    storage, stream = writer.storage, writer.stream
    legacy = layout.segments(storage, stream, None)
    return legacy + layout.live(layout.segments(storage, stream, writer.gateway))


def segment_name(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _read(
    storage: Storage, path: str, names: list[str], time: str, t0: float, t1: float
) -> pa.Table | None:
    """The rows of `names` with `t0 <= time < t1`, reading only the row groups whose time
    statistics meet the range (None: none do)."""
    with storage.open_input(path) as source:
        return _read_file(pq.ParquetFile(source), names, time, t0, t1)


def _read_file(
    f: pq.ParquetFile, names: list[str], time: str, t0: float, t1: float
) -> pa.Table | None:
    meta = f.metadata
    ti = f.schema_arrow.get_field_index(time)
    if ti < 0:
        raise ValueError(f"no column {time!r}")
    groups = []
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(ti).statistics
        if stats is not None and stats.has_min_max and (stats.max < t0 or stats.min >= t1):
            continue
        groups.append(g)
    if not groups:
        return None
    table = f.read_row_groups(groups, columns=names)
    times = table.column(time).to_numpy(zero_copy_only=False)
    mask = (times >= t0) & (times < t1)
    return table if mask.all() else table.filter(pa.array(mask))


def _as_tuples(table: pa.Table, schema_names: tuple[str, ...] | list[str]) -> list[tuple]:
    """Stream tuples (the columns not read are None)."""
    n = table.num_rows
    have = set(table.column_names)
    cols = [table.column(name).to_pylist() if name in have else [None] * n for name in schema_names]
    return list(zip(*cols, strict=True)) if n else []
