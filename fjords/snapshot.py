"""Answering a snapshot query from the streams' histories (`fjords.runtime.history`).

    text --parse--> syntax tree --plan_snapshot--> snapshot plan --answer--> rows

The snapshot plan (`fjords.compile.snapshot`) is a continuous query; `Snapshots.answer` runs it
once, in a Fjord of its own, over the readings of `[from, to)`, or, where the plan allows, over
one pre-aggregated tuple per sensor key (`fjords.partial.Partial` values made from the history's
cells): the same operators compute the answer either way, so HAVING, ORDER BY, LIMIT, DISTINCT,
CASE and joins with tables mean what they mean in a continuous query.

`to` is the stream's watermark: every reading before it has arrived. With `partial`, readings
past it are included too, and the answer says it may be incomplete.

The history holds every reading at or after its `complete_from` (B); an older part of the range
is answered from a `HistoricalSource` when one is given (the gateway's archive), by the same
operators: its readings of `[from, B)` go into the snapshot's Fjord with the history's of
`[B, to)` (the history's cells where the plan allows; the older part reading by reading), so no
reading is counted twice or missed at B. Without one, an answer reaching before B says
`complete: false`. `Snapshots.begin` with an `AggregateSource` (a batch job over the archive)
takes the older part as per-key aggregates instead, made into `Partial` tuples like the
history's cells, for the plans that have a `measure`; its blocking work (`SnapshotJob.run`)
may run in a worker thread, between taking the history's part and answering.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import numpy as np

from fjords.compile.analysis.bound import STREAM
from fjords.compile.snapshot import SnapshotPlan, plan_snapshot
from fjords.engine import Engine, Query
from fjords.errors import ClauseError, FjordsError
from fjords.partial import Partial
from fjords.runtime.fjord import Fjord
from fjords.runtime.history import (
    AggregateSource,
    Historical,
    HistoricalAggregates,
    HistoricalSource,
    History,
)
from fjords.runtime.progress import ProgressPolicy

__all__ = [
    "AggregateSource",
    "Historical",
    "HistoricalAggregates",
    "HistoricalSource",
    "SnapshotJob",
    "SnapshotResult",
    "Snapshots",
]

#: Tuples handed to the snapshot's Fjord between its runs (its queues hold them at once).
CHUNK = 4096


@dataclass
class SnapshotResult:
    columns: tuple[str, ...]
    rows: list[tuple]
    start: float  # the snapshot covers start <= time < end
    end: float
    complete: bool  # every reading of [start, end) was there to answer from
    sources: dict[str, int] = field(default_factory=dict)  # readings answered from, by source
    path: str = "readings"  # "cells" when answered from per-sensor aggregates
    skipped: tuple[str, ...] = ()  # parts of the historical source that could not be read
    engine: str | None = None  # what aggregated the older part (None: read here)

    def to_dict(self) -> dict[str, Any]:
        return (
            {
                "columns": list(self.columns),
                "rows": [dict(zip(self.columns, r, strict=True)) for r in self.rows],
                "from": _json_time(self.start),
                "to": _json_time(self.end),
                "complete": self.complete,
                "sources": self.sources,
            }
            | ({"skipped": list(self.skipped)} if self.skipped else {})
            | ({"engine": self.engine} if self.engine else {})
        )


def _json_time(t: float) -> float | None:
    return t if math.isfinite(t) else None


class Snapshots:
    """Answers snapshot queries over `engine`'s catalog from `histories` (stream -> History).
    `cells=False` reads every reading even where cells would do (the reference in tests);
    `historical`: where the readings older than a history's `complete_from` are."""

    def __init__(
        self,
        engine: Engine,
        histories: Mapping[str, History],
        *,
        cells: bool = True,
        historical: HistoricalSource | None = None,
    ) -> None:
        self.engine = engine
        self.histories = histories
        self.cells = cells
        self.historical = historical

    def plan(self, query: Query) -> SnapshotPlan:
        _, tree = self.engine.parse(query)
        catalog = self.engine.fjord.catalog
        streams = [r.name for r in getattr(tree, "sources", ()) if r.name in catalog.streams]
        history = self.histories.get(streams[0]) if streams else None
        if streams and history is None:
            raise ClauseError(
                f"stream {streams[0]!r} keeps no history: set [history] keep_s to answer snapshots"
            )
        return plan_snapshot(
            tree,
            catalog,
            self.engine.fjord.limits,
            measures=frozenset(history.measure_names) if history is not None else frozenset(),
        )

    def answer(self, query: Query, *, partial: bool = False) -> SnapshotResult:
        """The query's answer now; QueryError for a query a snapshot cannot answer."""
        job = self.begin(query, partial=partial)
        job.run()
        return job.finish()

    def begin(
        self, query: Query, *, partial: bool = False, aggregates: AggregateSource | None = None
    ) -> SnapshotJob:
        """A snapshot taken now (the history's part, and what the older part is to be), to be
        `run()` (the blocking work of `aggregates`; any thread) and `finish()`ed. With
        `aggregates`, the older part is aggregated per sensor key where it is, in place of
        `historical`'s readings: for plans with a `measure` only (others are refused)."""
        plan = self.plan(query)
        if aggregates is not None and plan.measure is None:
            raise ClauseError(
                f"engine {aggregates.name} answers snapshots whose aggregates read one measured "
                "column; this one needs every reading"
            )
        history = self.histories[plan.stream]
        live = self.engine.fjord.streams[plan.stream].router.progress
        to = live.watermark
        if partial and history.newest >= to:
            to = math.nextafter(history.newest, math.inf)
        if plan.lower > to and math.isfinite(to):
            raise ClauseError(
                f"the snapshot's time range starts at {plan.lower:g}, after the stream's data "
                f"ends ({to:g}): no reading can be there yet"
            )
        start, end = plan.span(to)
        start = max(start, 0.0)  # the all-time window begins in 1970
        engine = None if aggregates is None else aggregates.name
        job = SnapshotJob(self, query, plan, start, max(end, start), engine=engine)
        if not end > start:
            job.result = SnapshotResult(
                plan.columns, [], start, max(end, start), True, {"memory": 0}, engine=engine
            )
            return job
        boundary = history.complete_from
        older: Historical | HistoricalAggregates | None = None
        if aggregates is not None:
            assert plan.measure is not None
            older = aggregates.aggregates(
                plan.stream, start, end, boundary, history.static_names, plan.measure
            )
        elif self.historical is not None:
            info = self.engine.fjord.catalog.streams[plan.stream]
            fields = {*plan.bound.demand.fields, info.schema.time, info.sensor_field}
            older = self.historical.readings(
                plan.stream, start, end, boundary, frozenset(f for f in fields if f)
            )
        if older is None:
            lo, complete = start, start >= boundary
        else:  # the history from B on, the historical source before it
            lo, complete, job.skipped = max(start, boundary), older.complete, older.skipped
        job.complete = complete and not (partial and to > live.watermark)
        if isinstance(older, HistoricalAggregates):
            old = len(older.readings)  # read one by one; the groups are aggregated already
            job.groups, job.past = older.groups, older.readings
        else:
            old = 0 if older is None else older.count
        limits = self.engine.fjord.limits
        what = "readings a snapshot reads one by one"
        if plan.measure is not None and self.cells:
            limits.check("max_snapshot_readings", old, what)
            used = frozenset(r.name for r in plan.bound.refs.values() if r.side == STREAM)
            job.head, readings = _cell_tuples(history, plan.measure, lo, end, at=start, used=used)
            job.path = "cells"
        else:
            columns = history.columns(lo, end)
            readings = len(columns[0])
            limits.check("max_snapshot_readings", readings + old, what)
            job.tail = history.as_tuples(columns)
        job.sources = {"memory": readings}
        if isinstance(older, Historical):
            job.sources["archive"] = old
            if old:
                job.past = older.tuples()
        elif older is not None:
            job.sources["archive"] = old
        return job

    def _finish(self, job: SnapshotJob) -> SnapshotResult:
        plan = job.plan
        fjord = Fjord(
            max_lag=math.inf,
            progress=ProgressPolicy(idle_timeout_s=math.inf),
            limits=self.engine.fjord.limits,
        )
        stream = self.engine.fjord.catalog.streams[plan.stream]
        # No sensor field: the readings come in time order and all at once, so per-sensor
        # progress would only cost (a watermark at the end closes the one window).
        fjord.add_stream(plan.stream, stream.schema)
        for name, table in self.engine.fjord.catalog.tables.items():
            fjord.add_table(name, table)
        q = Engine(fjord).add_query(plan.query, query_id="snapshot")
        rows: list[tuple] = []
        q.sink.add_batch_callback(rows.extend)
        history = self.histories[plan.stream]
        head = job.head
        if job.grouped is not None:
            assert plan.measure is not None
            grouped, n = _group_tuples(history, plan.measure, job.grouped, at=job.start)
            head = head + grouped
            job.sources["archive"] = job.sources.get("archive", 0) + n
        # In time order, as the stream's router wants them: the per-key tuples are at `start`,
        # the older readings before the history's (which are at B or after).
        past = sorted(job.past, key=itemgetter(history.time_index)) if job.past else []
        tuples = head + past + job.tail
        queue = fjord.streams[plan.stream].queue
        for i in range(0, len(tuples), CHUNK):
            queue.put_many(tuples[i : i + CHUNK])
            fjord.run_until_idle()
        fjord.end_of_stream()
        fjord.run_until_idle()
        for q in fjord.failed.values():
            raise FjordsError(f"the snapshot failed: {q.error}")
        return SnapshotResult(
            plan.columns,
            _shape(plan, rows, job.start, job.end),
            job.start,
            job.end,
            job.complete,
            job.sources,
            job.path,
            job.skipped,
            job.engine,
        )


@dataclass
class SnapshotJob:
    """A snapshot begun (`Snapshots.begin`): what the history gave, and what the older part is
    still to give; `run()` does the blocking work (any thread), `finish()` answers."""

    snapshots: Snapshots
    query: Query
    plan: SnapshotPlan
    start: float
    end: float
    engine: str | None = None
    complete: bool = True
    skipped: tuple[str, ...] = ()
    sources: dict[str, int] = field(default_factory=dict)
    path: str = "readings"
    head: list[tuple] = field(default_factory=list)  # the history's cells (at `start`)
    past: list[tuple] = field(default_factory=list)  # older readings, one by one
    tail: list[tuple] = field(default_factory=list)  # the history's readings
    groups: Callable[[], list[tuple]] | None = None  # older readings, aggregated per key
    grouped: list[tuple] | None = None  # what `groups()` gave
    result: SnapshotResult | None = None  # answered already (an empty range)

    def run(self) -> None:
        if self.groups is not None and self.grouped is None:
            self.grouped = self.groups()

    def finish(self) -> SnapshotResult:
        if self.result is None:
            self.run()
            self.result = self.snapshots._finish(self)
        return self.result


def _group_tuples(
    history: History, measure: str, groups: list[tuple], *, at: float
) -> tuple[list[tuple], int]:
    """`_cell_tuples` for an aggregating source's rows (*static values, readings, values, sum,
    min, max): the tuples, and how many readings they stand for."""
    ns = len(history.static_names)
    mi = history.schema.index(measure)
    ti = history.time_index
    cast = int if history.schema.type_of(measure) == "int" else float
    width = len(history.schema)
    make = Partial.trusted
    out: list[tuple] = []
    total = 0
    for g in groups:
        rows, n, total_value, lo, hi = g[ns:]
        if not rows:
            continue
        total += rows
        row: list[object] = [None] * width
        for i, v in zip(history.static_index, g[:ns], strict=True):
            row[i] = v
        row[ti] = at
        if n:
            row[mi] = make(n, cast(total_value), cast(lo), cast(hi))
            out.append(tuple(row))
        if rows - n:
            row[mi] = make(rows - n, None, None, None)
            out.append(tuple(row))
    return out, total


def _cell_tuples(
    history: History,
    measure: str,
    start: float,
    end: float,
    *,
    at: float,
    used: frozenset[str] = frozenset(),
) -> tuple[list[tuple], int]:
    """One tuple per group of sensor keys alike in the static columns the query reads (`used`)
    with their readings of [start, end) as a Partial of `measure` (and a counts-only Partial for
    readings without a value), and how many readings they stand for. Aggregates merge, so keys
    the query cannot tell apart are merged first (a query over all sensors gets one tuple).
    Their time is `at` (the snapshot's start), which every time condition of the query admits."""
    cells = history.cells(start, end)
    j = history.measure_names.index(measure)
    mi = history.schema.index(measure)
    ti = history.time_index
    where = [
        i for n, i in zip(history.static_names, history.static_index, strict=True) if n in used
    ]
    at_key = [history.static_names.index(n) for n in history.static_names if n in used]
    values: dict[tuple, int] = {}
    gid = np.fromiter(
        (values.setdefault(tuple(key[p] for p in at_key), len(values)) for key in history.keys),
        dtype=np.int64,
        count=len(history.keys),
    )
    g = len(values)
    has = cells.count[j] > 0
    rows = np.bincount(gid, weights=cells.rows, minlength=g).astype(np.int64)
    count = np.bincount(gid, weights=cells.count[j], minlength=g).astype(np.int64)
    total = np.bincount(gid[has], weights=cells.sum[j][has], minlength=g)
    lo = np.full(g, np.inf)
    hi = np.full(g, -np.inf)
    np.minimum.at(lo, gid[has], cells.min[j][has])
    np.maximum.at(hi, gid[has], cells.max[j][has])
    cast = int if history.schema.type_of(measure) == "int" else float
    counts, nulls = count.tolist(), (rows - count).tolist()
    sums, los, his = total.tolist(), lo.tolist(), hi.tolist()
    out: list[tuple] = []
    make = Partial.trusted
    width = len(history.schema)
    for group, i in values.items():
        if not rows[i]:
            continue
        row: list[object] = [None] * width
        for pos, v in zip(where, group, strict=True):
            row[pos] = v
        row[ti] = at
        n = counts[i]
        if n:
            row[mi] = make(n, cast(sums[i]), cast(los[i]), cast(his[i]))
            out.append(tuple(row))
        if nulls[i]:
            row[mi] = make(nulls[i], None, None, None)
            out.append(tuple(row))
    return out, int(rows.sum())


def _nulls_last(i: int) -> Callable[[tuple], tuple[bool, Any]]:
    return lambda r: (r[i] is None, r[i])


def _shape(plan: SnapshotPlan, rows: list[tuple], start: float, end: float) -> list[tuple]:
    """The answer's rows: the window bounds made the snapshot's (or dropped), or, without
    aggregates, ORDER BY and LIMIT applied."""
    cols = plan.bound.columns
    if plan.aggregated:
        ws, we = cols.index("window_start"), cols.index("window_end")
        if plan.window_columns:
            return [(*r[:ws], start, end, *r[we + 1 :]) for r in rows]
        return [tuple(v for i, v in enumerate(r) if i not in (ws, we)) for r in rows]
    for i, descending in reversed(plan.order):  # stable sorts: the first key sorts last
        rows.sort(key=_nulls_last(i), reverse=descending)
    return rows if plan.limit is None else rows[: plan.limit]
