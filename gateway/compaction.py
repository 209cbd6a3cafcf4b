"""Archive compaction: a closed day's small segments rewritten into few large ones.

A gateway writes a segment every `[archive] segment_rows` rows or `segment_seconds` of event
time, so a day of one gateway is hundreds of small files; Spark lists, tracks and opens each.
`compact` rewrites the live segments of each closed, quiet date directory
(gateway/archive_layout.py) into `compact-<first>-<last>-<uuid>.parquet` files of about
`target_rows` rows: it commits each output (`Storage.commit`), then deletes its inputs. Readers
taking `live(segments(...))` prefer a compacted file over the parts it covers, so they see each
row once at every step, and a run stopped between a commit and its deletes is finished by the
next run (the covered leftovers are deleted first).

What runs are rewritten is decided by pure functions over `segments()` and the files' stats
(`leftovers`, `why_not`, `plan_date`); the I/O (footers, reads, commits, deletes) is around them.

Spark file streams (`maxFileAge` = STREAM_MAX_FILE_AGE_S): a compacted file's mtime is set more
than that before its oldest input's, so a stream that has read any of the inputs (its newest
file seen is at least as new) ignores the copy; a stream started later reads the copy alone.
Only dates whose files are all older than COMPACT_QUIET_S are rewritten, so running streams have
read their parts. Where the mtime cannot be set (HDFS, object stores through pyarrow) compaction
refuses unless told no file stream reads the archive (`file_streams=False`): docs/fleet.md.

Segments are only merged while contiguous in their gateway's numbering (a compacted file covers
the numbers first..last, and `live` hides any part in that range) and while they share one
schema (Arrow types and the stream's declared schema in their metadata). A segment that cannot
be read is named, counted, left where it is and never merged over.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from gateway.archive_layout import (
    COMPACT_QUIET_S,
    STREAM_MAX_FILE_AGE_S,
    Segment,
    Storage,
    compact_name,
    gateways,
    live,
    segments,
)

log = logging.getLogger("gateway.compaction")

DEFAULT_TARGET_ROWS = 1_000_000
#: a compacted file is dated this long before its oldest input (see the module docstring)
MTIME_BACK_S = STREAM_MAX_FILE_AGE_S + 1.0
#: metadata keys of a segment that are the stream's, not pyarrow's
_META_PREFIX = b"fjords."
#: a compaction's temporary file (Storage.commit) is stale, left by a killed run, this much later
STALE_TEMP_S = 3600.0
_TEMP = re.compile(r"^\.compact-\d{8}-\d{8}-[0-9a-f]+\.parquet\.tmp$")
#: unreadable segments already logged at warning level (a schedule meets them every run)
_logged_unreadable: set[str] = set()


class CompactionError(Exception):
    """Compaction cannot run at all (no archive root, storage that cannot honour it)."""


@dataclass(frozen=True)
class FileStat:
    mtime: float  # seconds since the epoch
    size: int


@dataclass(frozen=True)
class Footer:
    """What planning needs of a readable segment: its rows and what its schema is."""

    rows: int
    schema_key: str


@dataclass(frozen=True)
class Rewrite:
    """Live segments of one date directory, contiguous in their gateway's numbering and of one
    schema, to be replaced by one compacted file."""

    stream: str
    gateway: str
    date: str
    inputs: tuple[Segment, ...]
    rows: int

    @property
    def first(self) -> int:
        return self.inputs[0].first

    @property
    def last(self) -> int:
        return self.inputs[-1].last

    @property
    def directory(self) -> str:
        return self.inputs[0].path.rsplit("/", 1)[0]


# -- planning (pure) -------------------------------------------------------------------------


def leftovers(found: Sequence[Segment]) -> list[Segment]:
    """Files of `found` (one gateway's, as `segments` returns them) wholly covered by a live
    compacted file of their own date directory: the inputs a stopped compaction did not delete,
    or the loser of two compactions of the same parts. Readers skip them; they can go."""
    taken = [s for s in live(list(found)) if s.compacted]
    taken_paths = {s.path for s in taken}
    out = []
    for s in found:
        if s.path in taken_paths:
            continue
        if any(c.date == s.date and c.first <= s.first and s.last <= c.last for c in taken):
            out.append(s)
    return out


def why_not(date: str, stats: Iterable[FileStat], *, today: str, now: float, quiet_s: float) -> str:
    """Why a date directory must not be rewritten now ("" when it may): today's (or a later)
    date is still being written; a file younger than `quiet_s` means it may still change or a
    file stream may not have read it yet."""
    if date >= today:
        return "today" if date == today else "future"
    newest = max((s.mtime for s in stats), default=0.0)
    if now - newest < quiet_s:
        return "not quiet"
    return ""


def plan_date(
    found_live: Sequence[Segment],
    date: str,
    footers: Mapping[str, Footer],
    target_rows: int,
) -> list[list[Segment]]:
    """The groups of `date`'s live segments to rewrite, each into one file: runs of segments
    adjacent in the gateway's live order (another date's segment, an unreadable one (absent
    from `footers`) or a change of schema ends a run), packed greedily up to `target_rows`.
    A group of one file is left as it is, so a second plan over the output is empty."""
    groups: list[list[Segment]] = []
    current: list[Segment] = []
    rows = 0

    def close() -> None:
        if len(current) > 1:
            groups.append(list(current))
        current.clear()

    for s in found_live:
        f = footers.get(s.path)
        if s.date != date or f is None:
            close()
            rows = 0
            continue
        if current and (
            footers[current[-1].path].schema_key != f.schema_key or rows + f.rows > target_rows
        ):
            close()
            rows = 0
        current.append(s)
        rows += f.rows
    close()
    return groups


# -- I/O -------------------------------------------------------------------------------------


def streams(storage: Storage) -> list[str]:
    """The streams under the root that have gateway directories, sorted."""
    out = []
    for info in storage.list_dir(storage.root):
        name = info.base_name
        if info.type == pafs.FileType.Directory and name[:1] not in (".", "_"):
            if gateways(storage, name):
                out.append(name)
    return sorted(out)


def file_stats(storage: Storage, paths: Sequence[str]) -> dict[str, FileStat]:
    infos = storage.fs.get_file_info(list(paths)) if paths else []
    return {
        i.path: FileStat(i.mtime.timestamp() if i.mtime else 0.0, i.size or 0)
        for i in infos
        if i.type == pafs.FileType.File
    }


def _schema_key(schema: pa.Schema) -> str:
    meta = {k: v for k, v in (schema.metadata or {}).items() if k.startswith(_META_PREFIX)}
    fields = [(f.name, str(f.type)) for f in schema]
    return json.dumps([fields, sorted((k.decode(), v.decode()) for k, v in meta.items())])


def read_footer(storage: Storage, path: str) -> Footer:
    with storage.open_input(path) as f:
        pf = pq.ParquetFile(f)
        return Footer(pf.metadata.num_rows, _schema_key(pf.schema_arrow))


def read_inputs(storage: Storage, rw: Rewrite) -> pa.Table:
    """The inputs' rows in part order (each part's rows as written), with their metadata."""
    tables = []
    for s in rw.inputs:
        with storage.open_input(s.path) as f:
            tables.append(pq.ParquetFile(f).read())
    meta = {
        k: v for k, v in (tables[0].schema.metadata or {}).items() if k.startswith(_META_PREFIX)
    }
    table = pa.concat_tables([t.replace_schema_metadata(None) for t in tables])
    if table.num_rows != rw.rows:
        raise ValueError(f"read {table.num_rows} rows where the footers say {rw.rows}")
    return table.replace_schema_metadata(meta or None)


def commit_rewrite(
    storage: Storage, rw: Rewrite, table: pa.Table, stats: Mapping[str, FileStat]
) -> str:
    """Commit the compacted file (dated before its oldest input, where storage allows)."""
    mtime = None
    if storage.local:
        oldest = min(stats[s.path].mtime for s in rw.inputs)
        mtime = max(oldest - MTIME_BACK_S, 0.0)
    return storage.commit(rw.directory, compact_name(rw.first, rw.last), table, mtime=mtime)


def delete_files(storage: Storage, files: Iterable[Segment]) -> int:
    """Delete `files`; on local storage each directory is fsynced once, after its deletes (a
    day is hundreds of parts: an fsync per delete would be most of the run)."""
    files = list(files)
    if not storage.local:
        for s in files:
            storage.delete(s.path)
        return len(files)
    directories = set()
    for s in files:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(s.path)
        directories.add(s.path.rsplit("/", 1)[0])
    for d in sorted(directories):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return len(files)


@dataclass
class DateResult:
    """One date directory of one gateway's stream: what was (or, dry, would be) done."""

    stream: str
    gateway: str
    date: str
    files_in: int = 0
    files_out: int = 0
    rows: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    leftovers_deleted: int = 0
    temp_files_removed: int = 0
    unreadable: list[str] = field(default_factory=list)
    skipped: str = ""  # why it was not rewritten ("" when it was)

    def line(self, dry_run: bool) -> str:
        where = f"{self.stream}/gateway={self.gateway}/date={self.date}"
        if self.skipped:
            return f"{where}: skipped ({self.skipped})"
        verb = "would rewrite" if dry_run else "rewrote"
        parts = []
        if self.files_in:
            parts.append(
                f"{verb} {self.files_in} files ({self.rows:,} rows, {_mb(self.bytes_in)})"
                f" into {self.files_out}" + ("" if dry_run else f" ({_mb(self.bytes_out)})")
            )
        if self.leftovers_deleted:
            parts.append(
                f"{'would delete' if dry_run else 'deleted'} {self.leftovers_deleted} "
                "files an earlier run had replaced"
            )
        if self.temp_files_removed:
            parts.append(f"removed {self.temp_files_removed} stale temporary files")
        if self.unreadable:
            parts.append(f"{len(self.unreadable)} unreadable kept: {', '.join(self.unreadable)}")
        return f"{where}: " + "; ".join(parts)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


@dataclass
class Report:
    """A run's summary (`--json`)."""

    dry_run: bool = False
    dates: int = 0  # date directories rewritten (or with leftovers deleted)
    files_in: int = 0
    files_out: int = 0
    rows: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    leftovers_deleted: int = 0
    temp_files_removed: int = 0
    unreadable: list[str] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # dates not rewritten, by why
    seconds: float = 0.0

    def add(self, r: DateResult) -> None:
        if r.skipped:
            self.skipped[r.skipped] = self.skipped.get(r.skipped, 0) + 1
        if r.files_in or r.leftovers_deleted:
            self.dates += 1
        self.files_in += r.files_in
        self.files_out += r.files_out
        self.rows += r.rows
        self.bytes_in += r.bytes_in
        self.bytes_out += r.bytes_out
        self.leftovers_deleted += r.leftovers_deleted
        self.temp_files_removed += r.temp_files_removed
        self.unreadable += r.unreadable

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compact(
    storage: Storage,
    *,
    stream: str | None = None,
    gateway: str | None = None,
    date: str | None = None,
    target_rows: int = DEFAULT_TARGET_ROWS,
    quiet_s: float = COMPACT_QUIET_S,
    now: float | None = None,
    dry_run: bool = False,
    file_streams: bool = True,
    progress: Callable[[DateResult], None] | None = None,
    stop: threading.Event | None = None,
) -> Report:
    """Compact every closed, quiet date of the selected streams and gateways (all by default);
    `progress` is told of each date acted on or skipped for a reason; `stop` ends the run
    between two rewrites (the daemon's shutdown)."""
    if target_rows < 1:
        raise CompactionError(f"target rows must be >= 1, not {target_rows}")
    if storage.fs.get_file_info(storage.root).type != pafs.FileType.Directory:
        raise CompactionError(f"archive {storage.url}: no such directory")
    if not storage.local and file_streams and not dry_run:
        raise CompactionError(
            f"archive {storage.url}: a compacted file's mtime cannot be set on "
            f"{storage.scheme}, so a running Spark file stream would read it again; compact "
            "there only where no file stream reads the archive (--no-file-streams)"
        )
    started = time.monotonic()
    now = time.time() if now is None else now
    today = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d")
    report = Report(dry_run=dry_run)
    for st in [stream] if stream else streams(storage):
        for gw in [gateway] if gateway else gateways(storage, st):
            for r in _compact_gateway(
                storage, st, gw, date, target_rows, quiet_s, now, today, dry_run, stop
            ):
                report.add(r)
                if progress is not None:
                    progress(r)
            if stop is not None and stop.is_set():
                break
    report.seconds = round(time.monotonic() - started, 3)
    return report


def _compact_gateway(
    storage: Storage,
    stream: str,
    gateway: str,
    only_date: str | None,
    target_rows: int,
    quiet_s: float,
    now: float,
    today: str,
    dry_run: bool,
    stop: threading.Event | None,
) -> Iterable[DateResult]:
    found = segments(storage, stream, gateway)
    stats = file_stats(storage, [s.path for s in found])
    found = [s for s in found if s.path in stats]  # gone since the listing
    done = leftovers(found)
    alive = live(found)
    dates = sorted({s.date for s in found if s.date is not None})
    for d in dates:
        if only_date is not None and d != only_date:
            continue
        if stop is not None and stop.is_set():
            return
        result = DateResult(stream, gateway, d)
        gone = [s for s in done if s.date == d]
        if gone:
            result.leftovers_deleted = len(gone) if dry_run else delete_files(storage, gone)
        in_date = [s for s in alive if s.date == d]
        reason = why_not(d, [stats[s.path] for s in in_date], today=today, now=now, quiet_s=quiet_s)
        if reason:
            if len(in_date) > 1:
                result.skipped = reason
            if gone or result.skipped:
                yield result
            continue
        if not dry_run:
            result.temp_files_removed = _remove_stale_temps(storage, in_date, now)
        if len(in_date) < 2:
            if gone or result.temp_files_removed:
                yield result
            continue
        footers: dict[str, Footer] = {}
        for s in in_date:
            try:
                footers[s.path] = read_footer(storage, s.path)
            except (OSError, pa.ArrowException, ValueError) as e:
                _unreadable(result, s, e)
        for group in plan_date(alive, d, footers, target_rows):
            rw = Rewrite(stream, gateway, d, tuple(group), sum(footers[s.path].rows for s in group))
            size = sum(stats[s.path].size for s in group)
            if not dry_run:
                try:
                    table = read_inputs(storage, rw)
                except (OSError, pa.ArrowException, ValueError) as e:
                    bad = _first_unreadable(storage, group)
                    _unreadable(result, bad or group[0], e)
                    continue
                path = commit_rewrite(storage, rw, table, stats)
                with contextlib.suppress(OSError, pa.ArrowException):
                    result.bytes_out += storage.fs.get_file_info(path).size or 0
                delete_files(storage, group)
            result.files_in += len(group)
            result.files_out += 1
            result.rows += rw.rows
            result.bytes_in += size
            if stop is not None and stop.is_set():
                break
        done_something = (
            result.files_in,
            result.leftovers_deleted,
            result.unreadable,
            result.temp_files_removed,
        )
        if any(done_something):
            yield result


def _remove_stale_temps(storage: Storage, in_date: Sequence[Segment], now: float) -> int:
    """Remove what a compaction killed mid-write left in the date's directory: its hidden
    temporary files, once older than `STALE_TEMP_S` (a younger one may be another run's)."""
    if not in_date:
        return 0
    removed = 0
    for info in storage.list_dir(in_date[0].path.rsplit("/", 1)[0]):
        if info.type != pafs.FileType.File or not _TEMP.match(info.base_name):
            continue
        if info.mtime is not None and now - info.mtime.timestamp() >= STALE_TEMP_S:
            with contextlib.suppress(OSError):
                storage.fs.delete_file(info.path)
                removed += 1
    return removed


def _first_unreadable(storage: Storage, group: Sequence[Segment]) -> Segment | None:
    for s in group:
        try:
            with storage.open_input(s.path) as f:
                pq.ParquetFile(f).read()
        except (OSError, pa.ArrowException, ValueError):
            return s
    return None


def _unreadable(result: DateResult, s: Segment, e: BaseException) -> None:
    result.unreadable.append(s.path)
    level = logging.DEBUG if s.path in _logged_unreadable else logging.WARNING
    _logged_unreadable.add(s.path)
    log.log(level, "archive compaction: %s is unreadable, kept as it is: %s", s.path, e)


# -- the daemon's schedule -------------------------------------------------------------------


@dataclass
class CompactionStats:
    """The daemon's scheduled compactions, for /metrics."""

    runs: int = 0
    failures: int = 0
    files_in: int = 0
    files_out: int = 0
    rows: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    unreadable: int = 0

    def add(self, report: Report) -> None:
        self.runs += 1
        self.files_in += report.files_in + report.leftovers_deleted
        self.files_out += report.files_out
        self.rows += report.rows
        self.bytes_in += report.bytes_in
        self.bytes_out += report.bytes_out
        self.unreadable += len(report.unreadable)


def schedule_problem(root: str) -> str:
    """Why `[archive] compact_every_s` cannot be honoured for this `[archive] dir` ("" if it
    can): the schedule keeps running Spark file streams safe, which needs settable mtimes."""
    if "://" in root and not root.startswith("file://"):
        return (
            f"[archive] compact_every_s: {root} is not local storage, where a compacted file's "
            "mtime cannot be set (running Spark file streams would read it again); run "
            "`fjords-gateway archive compact --no-file-streams` there instead (docs/fleet.md)"
        )
    return ""


def run_scheduled(root: str, gateway: str, stats: CompactionStats, stop: threading.Event) -> Report:
    """One scheduled run over the gateway's own directories (in a worker thread)."""
    storage = Storage(root)
    if storage.fs.get_file_info(storage.root).type == pafs.FileType.NotFound:
        stats.runs += 1  # nothing written yet
        return Report()
    report = compact(storage, gateway=gateway, stop=stop)
    stats.add(report)
    log.info(
        "archive compaction: %d dates, %d files into %d (%d rows), %d replaced files deleted, "
        "%d unreadable, in %.1f s",
        report.dates,
        report.files_in,
        report.files_out,
        report.rows,
        report.leftovers_deleted,
        len(report.unreadable),
        report.seconds,
    )
    return report


# -- the CLI ---------------------------------------------------------------------------------


def add_commands(sub: argparse._SubParsersAction) -> None:
    """`fjords-gateway archive compact`."""
    archive = sub.add_parser("archive", help="maintain an archive root")
    asub = archive.add_subparsers(dest="archive_command", required=True)
    c = asub.add_parser(
        "compact",
        help="rewrite closed days' small segments into few large ones",
        description=(
            "Rewrite the live segments of each closed, quiet date (never today's, none with a "
            f"file younger than {COMPACT_QUIET_S:.0f} s) of each gateway into files of about "
            "--target-rows rows; readers see every row once throughout, and a run stopped "
            "midway is finished by the next. A line per date goes to stderr, the summary to "
            "stdout. Exit 0: done; 1: done, but unreadable segments were kept (named); 2: "
            "could not run (no such root, bad option)."
        ),
    )
    c.add_argument("--dir", required=True, metavar="ROOT", help="the archive root (path or URL)")
    c.add_argument("--stream", help="only this stream (default: every stream under ROOT)")
    c.add_argument("--gateway", metavar="ID", help="only this gateway (default: every one)")
    c.add_argument("--date", metavar="YYYY-MM-DD", help="only this date")
    c.add_argument("--dry-run", action="store_true", help="say what would be done; change nothing")
    c.add_argument("--json", action="store_true", help="the summary as JSON")
    c.add_argument(
        "--target-rows",
        type=int,
        default=DEFAULT_TARGET_ROWS,
        metavar="N",
        help=f"rows per compacted file (default {DEFAULT_TARGET_ROWS:,})",
    )
    c.add_argument(
        "--quiet-seconds",
        type=float,
        default=COMPACT_QUIET_S,
        metavar="N",
        help=f"a date is quiet once its newest file is N s old (default {COMPACT_QUIET_S:.0f}, "
        "twice the file streams' maxFileAge); lower it for tests and backfills only where no "
        "Spark file stream is behind",
    )
    c.add_argument(
        "--no-file-streams",
        action="store_true",
        help="no Spark file stream reads this archive: allows HDFS and object stores, where a "
        "compacted file's mtime cannot be set",
    )
    c.set_defaults(func=cmd_compact)


def _selection_problem(storage: Storage, stream: str | None, gateway: str | None) -> str:
    """Why `--stream` / `--gateway` name nothing under the root ("" when they do): a typo
    should not pass for an archive with nothing to do."""
    if storage.fs.get_file_info(storage.root).type != pafs.FileType.Directory:
        return ""  # compact() says so
    known = streams(storage)
    if stream is not None and stream not in known:
        return f"--stream {stream!r}: no such stream under {storage.url} (found: {known})"
    if gateway is not None and not any(
        gateway in gateways(storage, s) for s in ([stream] if stream else known)
    ):
        return f"--gateway {gateway!r}: no such gateway under {storage.url}"
    return ""


def cmd_compact(args: argparse.Namespace) -> int:
    if args.date is not None:
        try:
            datetime.strptime(args.date, "%Y-%m-%d")
        except ValueError:
            print(f"fjords-gateway: --date {args.date!r}: expected YYYY-MM-DD", file=sys.stderr)
            return 2
    if args.quiet_seconds < 0:
        print("fjords-gateway: --quiet-seconds must be >= 0", file=sys.stderr)
        return 2

    def progress(r: DateResult) -> None:
        print(r.line(args.dry_run), file=sys.stderr, flush=True)

    try:
        storage = Storage(args.dir)
        if problem := _selection_problem(storage, args.stream, args.gateway):
            print(f"fjords-gateway: {problem}", file=sys.stderr)
            return 2
        report = compact(
            storage,
            stream=args.stream,
            gateway=args.gateway,
            date=args.date,
            target_rows=args.target_rows,
            quiet_s=args.quiet_seconds,
            dry_run=args.dry_run,
            file_streams=not args.no_file_streams,
            progress=progress,
        )
    except (CompactionError, ValueError) as e:
        print(f"fjords-gateway: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"fjords-gateway: archive compaction failed: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_dict()))
    else:
        verb = "would rewrite" if report.dry_run else "rewrote"
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(report.skipped.items()))
        print(
            f"{verb} {report.dates} dates: {report.files_in} files ({report.rows:,} rows, "
            f"{_mb(report.bytes_in)}) into {report.files_out}"
            + ("" if report.dry_run else f" ({_mb(report.bytes_out)})")
            + f"; {report.leftovers_deleted} replaced files deleted"
            + f"; {len(report.unreadable)} unreadable kept"
            + (f"; dates skipped: {skipped}" if skipped else "")
            + f"; {report.seconds:.1f} s"
        )
    return 1 if report.unreadable else 0
