"""Archive compaction's budget per gateway-day: the METR-LA week as one gateway archives it at
the default segment size, compacted by the CLI.

    python -m benchmarks.compaction           # the week's 6 whole days: 6 gateway-days
    python -m benchmarks.compaction --days 1  # one day

The trace's readings (207 sensors, one each every 300 s) joined with their stations are cut as
the gateway's writer cuts them with `[archive]` defaults (`segment_rows` 50,000,
`segment_seconds` 300: a segment per 5 minutes of event time), written with the archive's layout
and metadata (one gateway, `date=` by event time), dated long ago, then
`fjords-gateway archive compact --json` runs in a child process: its CPU time (user + system),
wall time and peak memory come from the kernel's accounting of that child. Results go to
benchmarks/RESULTS.md (docs/fleet.md quotes them).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from benchmarks.common import console, markdown, record, table, under_load
from gateway.archive_layout import Storage, arrow_schema, date_of, part_name, segment_metadata
from gateway.config import ArchiveConfig
from gateway.daemon import TRAFFIC_SCHEMA

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "metr-la"
GATEWAY = "bench"


def readings() -> list[tuple]:
    where = {}
    with (SHARED / "stations.csv").open() as f:
        for r in csv.DictReader(f):
            where[r["station"]] = (float(r["latitude"]), float(r["longitude"]), r["segment"])
    rows = []
    with (SHARED / "readings.csv").open() as f:
        for r in csv.DictReader(f):
            lat, lon, seg = where[r["station"]]
            rows.append((float(r["time"]), r["station"], float(r["speed"]), lat, lon, seg))
    rows.sort(key=lambda r: r[0])
    days = {int(r[0] // 86_400) for r in rows}
    whole = days - {min(days), max(days)}  # the trace starts and ends at 08:00 UTC
    return [r for r in rows if int(r[0] // 86_400) in whole]


def write_archive(root: Path, rows: list[tuple], days: int) -> tuple[int, int]:
    """The writer's cut (rows or event seconds, whichever first); returns (files, bytes)."""
    cfg = ArchiveConfig()
    storage = Storage(root)
    schema = arrow_schema(TRAFFIC_SCHEMA, gateway=True).with_metadata(
        segment_metadata(GATEWAY, "traffic", TRAFFIC_SCHEMA)
    )
    first_day = int(rows[0][0] // 86_400)
    segments: list[list[tuple]] = []
    for r in rows:
        cur = segments[-1] if segments else None
        if cur is None or len(cur) >= cfg.segment_rows or r[0] - cur[0][0] >= cfg.segment_seconds:
            segments.append([r])
        else:
            cur.append(r)
    old = time.time() - 10 * 86_400
    files = size = 0
    for seq, seg in enumerate(segments):
        d = date_of(seg[0][0])
        if int(seg[0][0] // 86_400) - first_day >= days:
            break
        cols = list(zip(*seg, strict=True))
        t = pa.Table.from_arrays(
            [pa.array([GATEWAY] * len(seg)), *[pa.array(c) for c in cols]], schema=schema
        )
        path = storage.commit(
            storage.path("traffic", f"gateway={GATEWAY}", f"date={d}"), part_name(seq), t
        )
        os.utime(path, (old, old))
        files += 1
        size += os.path.getsize(path)
    return files, size


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.compaction", description=__doc__)
    p.add_argument("--days", type=int, default=6, help="gateway-days of the trace (1..6)")
    args = p.parse_args(argv)
    note = under_load()
    rows = readings()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "archive"
        files, size = write_archive(root, rows, args.days)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        run = subprocess.run(
            [sys.executable, "-m", "gateway.cli", "archive", "compact", "--dir", str(root)]
            + ["--json"],
            capture_output=True,
            text=True,
            check=True,
        )
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    report = json.loads(run.stdout)
    days = report["dates"]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    columns = ["per gateway-day", "value"]
    out = [
        ["readings", report["rows"] / days],
        ["segments in (default segment size)", report["files_in"] / days],
        ["files out", report["files_out"] / days],
        ["MB in", report["bytes_in"] / days / 1e6],
        ["MB out", report["bytes_out"] / days / 1e6],
        ["CPU s (user + system, the whole CLI run / days)", cpu / days],
        ["wall s (the whole CLI run / days)", wall / days],
        ["wall s of the compaction alone (no start-up) / days", report["seconds"] / days],
        ["peak RSS MB (the CLI process)", after.ru_maxrss / 1024],
    ]
    assert files == report["files_in"] and size == report["bytes_in"]
    console.print(table(f"archive compaction, {days} gateway-days of METR-LA", columns, out))
    body = (
        f"`python -m benchmarks.compaction --days {args.days}`: {days} gateway-days of the METR-LA "
        "trace archived at the default segment size (207 sensors, a reading per 300 s; a segment "
        "per 5 minutes of event time), compacted by `fjords-gateway archive compact` in a child "
        "process (its CPU and peak memory from the kernel; the peak includes the interpreter "
        "and pyarrow, ~100 MB).\n\n" + markdown(columns, out)
    )
    record("compaction", body, note)


if __name__ == "__main__":
    main()
