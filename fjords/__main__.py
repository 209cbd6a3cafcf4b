"""Push a recorded trace through one shared Fjord and print every result row as it is produced.

  python -m fjords --trace readings.csv --stations stations.csv \
      --query "SELECT segment, AVG(speed) AS avg_speed FROM traffic [RANGE 15 MINUTES] GROUP BY segment"

One JSON object per line: the query's 0-based index under "query", then the row (windowed rows
carry window_start and window_end, epoch seconds). At the end of the trace every window that
has data is closed and emitted.
"""

from __future__ import annotations

# ruff: noqa: E402 (the settings below come before numpy and the rest are imported)
import os

# numpy's OpenBLAS starts a thread per core when imported: ~70 ms of CPU time at every start,
# for linear algebra nothing here does. The caller's own setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import gc

# Run as the command line (not imported): young objects are collected less often from the
# start. Importing numpy, pyarrow and the parser, and planning 1,000 queries, made ~60
# collections over a growing heap (~15 ms); the plan is frozen out of the way later. While
# replaying, a trace block's rows (~40,000 tuples, tracked until a collection looks at them)
# live until the block is routed: above that many, a young collection rarely comes while they
# are alive (at 20,000: 20 collections scanning every row once, ~30 ms of a 0.7 s run of
# 1,000 filters; at 200,000: 2, ~0.1 ms). The count is of objects made and not yet freed:
# rows freed after their block do not bring a collection nearer; cycles still do.
QUIET_GC = (200_000, 50, 1_000)
if __name__ == "__main__":
    gc.set_threshold(*QUIET_GC)

import argparse
import contextlib
import heapq
import itertools
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from operator import itemgetter
from typing import TextIO

from fjords.engine import Engine
from fjords.errors import FjordsError, QuerySyntaxError
from fjords.output import NdjsonWriter
from fjords.runtime.fjord import Fjord
from fjords.runtime.progress import ProgressPolicy
from fjords.trace import Trace

# Rows pushed between scheduler drains, and the stream router's batch: a file has no latency
# to keep, and each query's work per batch (its slice of the predicate index, its delivery,
# its output's one write) is then spread over ~16x more rows. At most the queue bound.
CHUNK = 65_536


def run_file(
    readings: str,
    queries: list[str],
    *,
    stations: str | None = None,
    stream: str = "traffic",
    tables: list[tuple[str, str]] = (),  # type: ignore[assignment]
    out: TextIO | None = None,
    as_json: bool = True,
    more: Sequence[tuple[str, str]] = (),
    quiet_gc: bool = False,
) -> Fjord:
    """`readings` is the trace of stream `stream`; `more` gives further (stream, trace file)
    pairs, e.g. for a join of two streams: all are replayed merged in time order. `quiet_gc`
    (the command line's own process) freezes the plan out of the garbage collector's way."""
    out = out if out is not None else sys.stdout  # looked up now: callers may have redirected it
    trace = Trace(readings, stations)
    # A file is complete: no sensor is ever given up on (not even after wall-clock silence).
    fjord = Fjord(max_lag=float("inf"), progress=ProgressPolicy(idle_timeout_s=float("inf")))
    fjord.add_stream(stream, trace.schema, sensor_field=trace.sensor_field).router.batch = CHUNK
    fjord.catalog.streams[stream].sensors = trace.attributes  # type: ignore[assignment]
    others = [(name, Trace(path)) for name, path in more]
    for name, t in others:
        if name in fjord.streams:
            raise FjordsError(f"two traces for stream {name!r}")
        fjord.add_stream(name, t.schema, sensor_field=t.sensor_field).router.batch = CHUNK
    for name, path in tables:
        fjord.add_table(name, path)
    writer = NdjsonWriter(out) if as_json else None
    engine = Engine(fjord)
    for i, sql in enumerate(queries):
        q = engine.add_query(sql, query_id=str(i))
        emit = writer.printer(i, q.columns) if writer else _text_printer(i, q.columns, out)
        q.sink.add_batch_callback(emit)
    if quiet_gc:
        _quiet_gc()
    flush = writer.flush if writer else lambda: None
    try:
        if others:
            _replay_merged(fjord, [(stream, trace), *others], readings, flush)
        else:
            _replay(fjord, stream, trace, readings, flush)
    finally:
        flush()  # what was routed before a failure is printed, as it came
    _raise_failures(fjord)
    return fjord


def _replay(fjord: Fjord, stream: str, trace: Trace, label: str, flush: Callable[[], None]) -> None:
    queue = fjord.streams[stream].queue
    put_many = getattr(queue, "put_many", None)  # one call per chunk where the queue has it
    put = queue.put
    # A chunk the router takes in one transition: its queue hands it over as one list.
    chunk_rows = min(CHUNK, fjord.streams[stream].router.batch)
    with _progress(label) as advance:
        for batch in trace.batches():
            for i in range(0, len(batch), chunk_rows):
                chunk = batch[i : i + chunk_rows]
                if put_many is not None:
                    put_many(chunk)
                else:
                    for t in chunk:
                        put(t)
                fjord.run_until_idle()
                flush()
                advance(len(chunk))
                if fjord.failed:  # a batch run stops at the first failed query
                    return
        fjord.end_of_stream()
        fjord.run_until_idle()


def _quiet_gc() -> None:
    """The plan is built and lives until the end: set it aside from the collector, and collect
    young objects less often. Replaying makes hundreds of thousands of row tuples, and the
    default thresholds ran a collection every 700 of them over the whole plan (~8% of a run of
    1,000 queries). Cycles are still collected."""
    gc.freeze()
    gc.set_threshold(*QUIET_GC)


def _replay_merged(
    fjord: Fjord, traces: list[tuple[str, Trace]], label: str, flush: Callable[[], None]
) -> None:
    """Several streams' traces pushed merged by time (each file is in time order), so each
    stream's progress keeps pace with the others' as it would live (a join holds only the
    open windows)."""

    def tagged(name: str, t: Trace) -> Iterator[tuple[float, str, tuple]]:
        ti = t.schema.time_index
        assert ti is not None  # a trace has a time column
        for row in t.rows():
            yield row[ti], name, row

    merged = heapq.merge(*(tagged(n, t) for n, t in traces), key=itemgetter(0))
    with _progress(label) as advance:
        n = 0
        for name, run in itertools.groupby(merged, key=itemgetter(1)):
            rows = [r for _, _, r in run]
            fjord.push_many(name, rows)
            n += len(rows)
            if n >= CHUNK:
                fjord.run_until_idle()
                flush()
                advance(n)
                n = 0
                if fjord.failed:
                    return
        fjord.run_until_idle()
        fjord.end_of_stream()
        fjord.run_until_idle()


def _raise_failures(fjord: Fjord) -> None:
    """A query that failed (isolated by the Fjord) still ends a batch run with its error; the
    reader going away (`| head`) ends it quietly."""
    for qid, q in fjord.failed.items():
        if "BrokenPipeError" in (q.error or ""):
            raise BrokenPipeError
        raise FjordsError(f"query {qid} failed: {q.error}")


@contextlib.contextmanager
def _progress(path: str) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr when it is a terminal (stdout carries the rows)."""
    if not sys.stderr.isatty():
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TextColumn("{task.completed:,} rows"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task(f"replaying {path}", total=None)
        yield lambda n: bar.advance(task, n)


def _text_printer(index: int, columns: tuple[str, ...], out: TextIO):
    def emit(rows: list[tuple]) -> None:
        for row in rows:
            out.write(
                "\t".join(
                    f"{k}={v}"
                    for k, v in {"query": index, **dict(zip(columns, row, strict=True))}.items()
                )
            )
            out.write("\n")

    return emit


def _table_arg(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=FILE, got {text!r}")
    return name, path


def _trace_arg(text: str) -> tuple[str | None, str]:
    """`FILE`, or `NAME=FILE` for the trace of stream NAME."""
    name, sep, path = text.partition("=")
    if sep and path and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        return name, path
    return None, text


class _Version(argparse.Action):
    """--version, looked up only when asked (importlib.metadata is slow to import)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        from fjords import version

        print(f"{parser.prog} {version()}")
        parser.exit()


def _take_queries(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """The `--query SQL` / `--query=SQL` values, in order, and the other arguments.

    argparse's scan for the next option is quadratic in the number of options: 1,000 queries
    took ~40 ms to parse. Taken out only when every option that could mean --query is spelt
    in full (an abbreviation such as --que is left to argparse, with the rest, in order)."""
    end = argv.index("--") if "--" in argv else len(argv)
    head = argv[:end]
    if any(a.startswith("--q") and a != "--query" and not a.startswith("--query=") for a in head):
        return [], list(argv)
    queries: list[str] = []
    rest: list[str] = []
    i = 0
    while i < end:
        a = argv[i]
        if a == "--query" and i + 1 < end and not argv[i + 1].startswith("-"):
            queries.append(argv[i + 1])
            i += 2
            continue
        if a.startswith("--query="):
            queries.append(a.partition("=")[2])
        else:
            rest.append(a)
        i += 1
    return queries, [*rest, *argv[end:]]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m fjords",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    p.add_argument(
        "--trace",
        "--readings",
        dest="readings",
        required=True,
        action="append",
        type=_trace_arg,
        metavar="[NAME=]FILE",
        help="trace file (CSV or Parquet, in time order) of the stream --stream; NAME=FILE is "
        "the trace of stream NAME (repeatable: a join of two streams); --readings is the same option",
    )
    p.add_argument("--stations", help="station attributes joined onto each row (CSV or Parquet)")
    p.add_argument(
        "--stream", default="traffic", help="stream name the queries read (default: traffic)"
    )
    p.add_argument(
        "--table",
        action="append",
        default=[],
        type=_table_arg,
        metavar="NAME=FILE",
        help="a static table for joins (CSV or Parquet); repeatable",
    )
    p.add_argument("--query", action="append", metavar="SQL", help="a query; repeatable (required)")
    p.add_argument(
        "--json", action="store_true", help="one JSON object per line (the default output form)"
    )
    p.add_argument("--text", action="store_true", help="key=value text instead of JSON")
    own = argv is None  # this process's own command line, not a caller's list
    queries, rest = _take_queries(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(rest)
    queries += args.query or []
    if not queries:
        p.error("the following arguments are required: --query")
    traces = [(name or args.stream, path) for name, path in args.readings]
    if len({name for name, _ in traces}) != len(traces):
        p.error("one trace per stream: name each with --trace NAME=FILE")
    (stream, readings), *more = traces
    try:
        run_file(
            readings,
            queries,
            stations=args.stations,
            stream=stream,
            tables=args.table,
            as_json=not args.text,
            more=more,
            quiet_gc=own,
        )
    except QuerySyntaxError as e:
        print(f"error: bad query: {e}", file=sys.stderr)
        return 2
    except FjordsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
