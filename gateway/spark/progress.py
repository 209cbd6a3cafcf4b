"""Per-gateway accounting of a fleet's streaming job, by the driver, from the job's checkpoint.

Why from the checkpoint: Spark drops late data at its stateful aggregation, AFTER the partial
aggregate, so its `numRowsDroppedByWatermark` counts groups (window, keys) of one batch, not
readings. What it drops is decided by two things the checkpoint records for every batch: the
files each source read (`sources/<i>/<batch>`, the file source's log) and the watermark
(`offsets/<batch>`: `batchWatermarkMs` and each source's log id). A group of batch N is dropped when its window ends at
or before the late-event watermark of batch N, which is the global watermark of batch N-1
(Spark >= 3.4: `eventTimeWatermarkForLateEvents`). So the driver reads the `time` column of
each committed batch's files (and their footers, applying `sources.classify`, the rule the
executors' decoder applies) and counts, per gateway, the readings whose earliest window ends at
or before that watermark (for sliding windows: a reading dropped from at least one window),
and the files refused. This counts readings exactly, across all batches and restarts (the
totals are kept in `fjords-progress.json` in the checkpoint), costs no extra Spark stage and
keeps the query's plan untouched. Readings a WHERE clause would drop anyway are counted too
when late.

A per-gateway stateful step dropping at reading granularity would count inside the job, but it
adds a state store per gateway and a Python state function to every stream.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections import defaultdict
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from gateway.archive_layout import Storage
from gateway.spark.sources import Refusals, Source, gateway_of_path, judge

log = logging.getLogger("gateway.spark.progress")

STATE_FILE = "fjords-progress.json"
#: the label of readings without a gateway (legacy flat segments)
LEGACY = "(legacy)"


def late_readings(times: pa.Array, slide_s: float, watermark_ms: int) -> int:
    """How many readings at `times` (epoch seconds) fall in a window (aligned to multiples of
    `slide_s`) that ends at or before `watermark_ms`: the earliest window of a reading at t
    ends at floor(t / slide) * slide + slide."""
    if watermark_ms <= 0 or len(times) == 0:
        return 0
    t = pc.cast(times, pa.float64())
    ends = pc.add(pc.multiply(pc.floor(pc.divide(t, slide_s)), slide_s), slide_s)
    late = pc.less_equal(pc.multiply(ends, 1000.0), float(watermark_ms))
    return int(pc.sum(pc.cast(pc.fill_null(late, False), pa.int64())).as_py() or 0)


def _read_lines(storage: Storage, path: str) -> list[str]:
    with storage.open_input(path) as f:
        return f.read().decode().splitlines()


class FleetProgress:
    """What a fleet stream's committed batches read: late readings per gateway, refused files."""

    def __init__(
        self,
        checkpoint: str,
        sources: Sequence[Source],
        declared: pa.Schema,
        refusals: Refusals,
        *,
        slide_s: float | None,
        time_column: str = "time",
        counts_late: bool = True,
    ) -> None:
        """`slide_s`: the window slide of a windowed query (None: no stateful aggregation,
        nothing is dropped as late). `counts_late` False: a join of two streams, whose state
        Spark evicts by the join's own rule: its late readings are not counted (None)."""
        self.ckpt = Storage(checkpoint)
        self.sources = list(sources)
        self.declared = declared
        self.refusals = refusals
        self.slide_s = slide_s
        self.time_column = time_column
        self.counts_late = counts_late
        self.late: dict[str, int] = defaultdict(int)
        self.done = -1  # the last batch accounted
        self.watermark_ms = 0  # that batch's watermark (the next one's late-event watermark)
        self.source_ends: list[int | None] = []  # each source's log id at that batch
        self._lock = threading.Lock()
        self._load()

    # -- the persisted totals ---------------------------------------------------------------

    def _load(self) -> None:
        try:
            st = json.loads("\n".join(_read_lines(self.ckpt, self.ckpt.path(STATE_FILE))))
        except (FileNotFoundError, OSError, ValueError):
            return
        self.late.update({str(k): int(v) for k, v in st.get("late", {}).items()})
        self.done = int(st.get("done", -1))
        self.watermark_ms = int(st.get("watermark_ms", 0))
        self.source_ends = [None if x is None else int(x) for x in st.get("source_ends", [])]

    def _save(self) -> None:
        text = json.dumps(
            {
                "late": dict(self.late),
                "done": self.done,
                "watermark_ms": self.watermark_ms,
                "source_ends": self.source_ends,
            }
        )
        tmp = self.ckpt.path(f".{STATE_FILE}.tmp")
        self.ckpt.fs.create_dir(self.ckpt.root, recursive=True)
        with self.ckpt.fs.open_output_stream(tmp) as out:
            out.write(text.encode())
        self.ckpt.fs.move(tmp, self.ckpt.path(STATE_FILE))

    # -- Spark's checkpoint -------------------------------------------------------------------

    def _ids(self, directory: str) -> dict[int, str]:
        out = {}
        for info in self.ckpt.list_dir(directory):
            name = info.base_name
            stem = name.removesuffix(".compact")
            if info.type == pafs.FileType.File and stem.isdigit():
                out[int(stem)] = name
        return out

    def _offsets(self, batch: int) -> tuple[int, list[int | None]] | None:
        """Batch `batch`'s watermark and each source's end offset (its file log's id)."""
        try:
            lines = _read_lines(self.ckpt, self.ckpt.path("offsets", str(batch)))
        except (FileNotFoundError, OSError):
            return None
        if len(lines) < 2:
            return None
        wm = int(json.loads(lines[1]).get("batchWatermarkMs", 0))
        ends: list[int | None] = []
        for line in lines[2:]:
            try:
                ends.append(int(json.loads(line)["logOffset"]))
            except (ValueError, KeyError, TypeError):
                ends.append(None)  # "-": the source had no offset yet
        return wm, ends

    def _files(self, source: int, after: int, upto: int) -> list[str]:
        """The files source `source` logged with ids after..upto (its log, compacted or not)."""
        d = self.ckpt.path("sources", str(source))
        ids = self._ids(d)
        names = set()
        for i in range(after + 1, upto + 1):
            if i in ids:
                names.add(ids[i])
            else:  # compacted into the next .compact log file
                later = [j for j, n in ids.items() if j >= i and n.endswith(".compact")]
                if later:
                    names.add(ids[min(later)])
        out = []
        for name in sorted(names):
            for line in _read_lines(self.ckpt, f"{d}/{name}")[1:]:
                if line.strip():
                    entry = json.loads(line)
                    if after < int(entry.get("batchId", -1)) <= upto:
                        out.append(str(entry["path"]))
        return out

    def _storage_path(self, url: str) -> tuple[Source, str] | None:
        for s in self.sources:
            base = s.storage.spark_url(s.storage.root)
            if url.startswith(base) or unquote(url).startswith(base):
                if s.storage.local:
                    return s, unquote(urlsplit(url).path)
                return s, s.storage.root + unquote(url)[len(base) :]
        return None

    # -- accounting ---------------------------------------------------------------------------

    def update(self) -> None:
        """Account every batch committed since the last call."""
        with self._lock:
            committed = self._ids(self.ckpt.path("commits"))
            last = max(committed, default=-1)
            if last <= self.done:
                return
            for b in range(self.done + 1, last + 1):
                found = self._offsets(b)
                if found is None:  # purged by Spark (kept: its last 100 batches)
                    self.done = b
                    continue
                wm, ends = found
                for i, end in enumerate(ends):
                    prev = self.source_ends[i] if i < len(self.source_ends) else None
                    if end is None:
                        continue
                    for url in self._files(i, -1 if prev is None else prev, end):
                        self._account(url, self.watermark_ms)
                self.source_ends = ends
                self.watermark_ms = wm
                self.done = b
            try:
                self._save()
            except OSError as e:
                log.warning("cannot save %s in %s: %s", STATE_FILE, self.ckpt.url, e)

    def _account(self, url: str, late_wm: int) -> None:
        found = self._storage_path(url)
        if found is None:
            return
        source, path = found
        why = judge(source.storage, path, self.declared)
        if why is not None:
            self.refusals.add(url, why)
            return
        if self.slide_s is None or not self.counts_late or late_wm <= 0:
            return
        try:
            with source.storage.open_input(path) as f:
                t = pq.read_table(f, columns=[self.time_column])[self.time_column]
        except (pa.ArrowException, OSError, KeyError) as e:
            log.warning("cannot read %s for the late count: %s", url, e)
            return
        n = late_readings(t.combine_chunks(), self.slide_s, late_wm)
        if n:
            label = gateway_of_path(path) or LEGACY
            if self.late[label] == 0:
                log.warning(
                    "gateway %s: %d readings of %s later than the watermark; Spark drops them "
                    "(counted in late_readings_dropped)",
                    label,
                    n,
                    url,
                )
            self.late[label] += n

    def status(self) -> dict[str, Any]:
        with self._lock:
            late = {**{s.gateway or LEGACY: 0 for s in self.sources}, **self.late}
            return {
                "late_readings_dropped": late if self.counts_late else None,
                "segments_refused": self.refusals.count,
                "refused_segments": dict(self.refusals.paths),
            }


def window_slide(window: tuple[float, float] | None) -> float | None:
    if window is None:
        return None
    rng, slide = window
    return slide if slide and math.isfinite(slide) else rng
