"""The Fjord: one running plan holding every stream, table and query, driven by one scheduler.

Proxies push each sample once into its stream (`push`); queries are folded into the plan while
tuples flow (`add_query` / `remove_query`) and each gets its results through its sink.

A query is a unit of failure: an exception in one of its operators (or in its filter, while the
shared router routes) removes that query alone and marks it failed with the reason
(`RunningQuery.state`, `.error`, `Fjord.failed`, `on_query_failed`); a shared aggregate that
raises fails the queries using it. Other queries and the stream go on.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from fjords.catalog import Catalog, StreamInfo
from fjords.compile.planner import Plan, Route, UnionPlan, plan_query
from fjords.compile.sql import ast
from fjords.compile.sql.text import atom as sql_atom
from fjords.demand import Demand
from fjords.errors import QueryError
from fjords.limits import DEFAULT_LIMITS, Limits
from fjords.runtime.operators.aggregate import Finish, WindowAggregate
from fjords.runtime.operators.base import Operator
from fjords.runtime.operators.router import StreamRouter
from fjords.runtime.operators.simple import Multiplex, Project
from fjords.runtime.operators.sink import Sink
from fjords.runtime.predicate_index import Projection
from fjords.runtime.progress import (
    IDLE_CHECK,
    INF,
    Heartbeat,
    Pace,
    ProgressPolicy,
    Release,
    Watermark,
)
from fjords.runtime.queues import DEFAULT_BOUND, PushQueue
from fjords.runtime.scheduler import RoundRobinScheduler, Scheduler
from fjords.schema import Schema
from fjords.tables import Table

log = logging.getLogger(__name__)

QueryFailed = Callable[[str, str], None]  # (query id, reason)
BatchTarget = Callable[[list[tuple]], None]


class DeliveryError(Exception):
    """An operator of a fused delivery raised while the router delivered a batch: `where`
    names the operator, `error` is what it raised (the query fails with both)."""

    def __init__(self, where: str, error: Exception) -> None:
        super().__init__(f"{where}: {error!r}")
        self.where = where
        self.error = error


class _Guarded:
    """`fn`, with what it raises wrapped in a DeliveryError naming `where` (a small object,
    not a closure: one per installed query, and memory per query counts at 10,000)."""

    __slots__ = ("fn", "where")

    def __init__(self, fn: BatchTarget, where: str) -> None:
        self.fn, self.where = fn, where

    def __call__(self, rows: list[tuple]) -> None:
        try:
            self.fn(rows)
        except Exception as e:
            raise DeliveryError(self.where, e) from e


_guarded = _Guarded


def _router_predicates(plan: Plan) -> list[str]:
    """What the stream router indexes for `plan`, as query text."""
    names = plan.bound.schema.names  # type: ignore[union-attr]
    return [sql_atom(names[a.field], a.op, a.value) for a in plan.atoms]


def fuse(plan: Plan) -> BatchTarget | None:
    """The query's work after its filter as one direct callback per batch, or None.

    A filter query (SELECT *: the sink) or a filter + projection (Project, then the sink) is
    fused: the router calls the result with the query's rows of each batch and the rows are
    projected and handed to the sink's consumers right there, with no queue and no scheduler
    step per row. Any other plan shape (joins, windows: see `_join_shared`) returns None and
    keeps its operators and queues. The plan is only read: the planner is untouched."""
    ops, sink = plan.operators, plan.sink
    if len(ops) == 1 and ops[0] is sink and sink.inputs and sink.inputs[0] is plan.target:
        return _guarded(sink.deliver, sink.name)
    if (
        len(ops) == 2
        and type(ops[0]) is Project
        and ops[1] is sink
        and ops[0].inputs[0] is plan.target
        and ops[0].outputs == sink.inputs
    ):
        return _ProjectDeliver(ops[0], sink)  # type: ignore[arg-type]
    return None


class _ProjectDeliver:
    """A filter query's projection and sink as one callback per batch (`fuse`)."""

    __slots__ = ("project", "sink")

    def __init__(self, project: Project, sink: Sink) -> None:
        self.project, self.sink = project, sink

    def __call__(self, rows: list[tuple]) -> None:
        try:
            out = self.project.map_batch(rows)
        except Exception as e:
            raise DeliveryError(self.project.name, e) from e
        self.projected(out)

    def projected(self, rows: list[tuple]) -> None:
        """Rows the router already projected with this query's columns (`projection`)."""
        n = len(rows)
        self.project.tuples_in += n
        self.project.tuples_out += n
        try:
            self.sink.deliver(rows)
        except Exception as e:
            raise DeliveryError(self.sink.name, e) from e

    def projection(self) -> Projection | None:
        """For the router: the columns it picks, when all are plain (None: computed)."""
        positions = self.project.positions
        if positions is None:
            return None
        return Projection(positions, self.project.fn, self.projected)


@dataclass
class SharedAggregate:
    """A windowed aggregate serving every query with its filter, groups, aggregates and window."""

    aggregate: Operator
    fanout: Multiplex | None  # None: fused, the aggregate hands its rows to `direct` users
    router_key: str
    users: set[str] = field(default_factory=set)
    priorities: Counter[int] = field(default_factory=Counter)  # its users' PRIORITY values
    # Fused users: query id -> (its Finish, its Sink); errors of their part, until handled.
    direct: dict[str, tuple[Finish, Sink]] = field(default_factory=dict)
    errors: list[tuple[str, str, Exception]] = field(default_factory=list)
    # Users that want some groups only (planner `_group_filters_last`): column index -> how
    # many of them want each value; `ungated`: users that want every group.
    gates: dict[int, Counter] = field(default_factory=dict)
    ungated: int = 0
    # Fused gated users: query id -> `Plan.group_pick` (the gated column's position in the
    # window's rows, the values it wants, its finalize for them): `fan_out` hands each only
    # its groups' rows.
    picks: dict[str, tuple[int, frozenset, Callable]] = field(default_factory=dict)
    # Windows' fan-outs cut short: (items, their rows by value, the users still to serve,
    # last first). A list, not a deque: one per shared aggregate, rarely more than one item.
    _fanning: list = field(default_factory=list, init=False, repr=False)

    def gate(self, plan: Plan, joins: bool) -> None:
        """Count a user's groups in (`joins`) or out."""
        gate = plan.group_gate
        if gate is None:
            self.ungated += 1 if joins else -1
            return
        counts = self.gates.setdefault(gate[0], Counter())
        for v in gate[1]:
            counts[v] += 1 if joins else -1
            if counts[v] <= 0:
                del counts[v]

    def admits(self, rest: Callable[[tuple], bool] | None) -> Callable[[tuple], bool]:
        """The router's check for the aggregate: a row of a group some user wants, then the
        rest of the shared filter. (Installed when the aggregate starts with a gated user.)"""
        gates = self.gates

        def admit(t: tuple) -> bool:
            if self.ungated:
                return rest is None or rest(t)
            for i, c in gates.items():  # a loop, not any(<genexpr>): this runs per row
                if t[i] in c:
                    return rest is None or rest(t)
            return False

        return admit

    # Work per aggregate transition on a window's fan-out: a user costs its rows plus
    # USER_COST (its finalize, sink and consumers' calls). ~0.5 ms here: a window of 10,000
    # dashboards goes out over many transitions, with the stream's samples routed between
    # them, instead of holding the event loop for one long step.
    STEP_BUDGET: ClassVar[int] = 2048
    USER_COST: ClassVar[int] = 16

    def fan_out(self, items: list) -> None:
        """A window's rows (or the end-of-input watermark) to every fused user: its start
        time, HAVING and SELECT list (its Finish), then its sink, one list per user. A user
        whose part raises is recorded (`errors`), failed after the transition; not the rest.
        Stops after STEP_BUDGET (`pending`; the aggregate (its `fan`) resumes it with `drain` and closes
        nothing newer before it is out); the users are those of the moment it was emitted.

        A gated user (`picks`) is handed only the rows of its groups: 200 dashboards of two
        segments each over a window of 200 segments check 400 rows, not 40,000 (a close of
        that size held the event loop ~3 ms, and every sample arriving meanwhile waited).
        Its HAVING (less the condition the pick met) and SELECT list run on those rows, in
        their order."""
        by_value = _RowsByValue(items) if self.picks else None
        self._fanning.append((items, by_value, list(self.direct)[::-1]))
        self.drain()

    @property
    def pending(self) -> bool:
        """Whether a window's fan-out was cut short (`drain` goes on with it)."""
        return bool(self._fanning)

    def drain(self) -> bool:
        """Go on with the fan-outs cut short, within one STEP_BUDGET; True when all are out."""
        budget = self.STEP_BUDGET
        fanning, direct, picks = self._fanning, self.direct, self.picks
        while fanning:
            items, by_value, users = fanning[0]
            while users:
                if budget <= 0:
                    return False
                qid = users.pop()
                user = direct.get(qid)
                if user is None:  # removed since
                    continue
                fin, sink = user
                mine, finalize = items, None
                pick = picks.get(qid) if by_value is not None else None
                if pick is not None:
                    mine = by_value.select(pick[0], pick[1])  # type: ignore[union-attr]
                    finalize = pick[2]  # its HAVING without the condition the pick met
                budget -= len(mine) + self.USER_COST
                if mine:
                    self._deliver(qid, fin, sink, mine, finalize)
            del fanning[0]
        return True

    def _deliver(
        self, qid: str, fin: Finish, sink: Sink, items: list, finalize: Callable | None
    ) -> None:
        try:
            out, mark = fin.finish_batch(items, finalize)  # start, HAVING, SELECT: one batch
            if mark is not None and mark > sink.watermark:
                sink.watermark = mark
        except Exception as e:  # noqa: BLE001 - this query fails, not the others
            self.errors.append((qid, fin.name, e))
            return
        if out:
            try:
                sink.deliver(out)
            except Exception as e:  # noqa: BLE001
                self.errors.append((qid, sink.name, e))


class _RowsByValue:
    """A window's items indexed by the value at one position of its rows, built for the first
    user that asks about that position (`SharedAggregate.fan_out`)."""

    __slots__ = ("items", "marks", "_at")

    def __init__(self, items: list) -> None:
        self.items = items
        self.marks = [t for t in items if t.__class__ is not tuple]  # watermarks go to all
        self._at: dict[int, dict[Hashable, list[int]]] = {}

    def select(self, position: int, values: frozenset) -> list:
        """The rows whose value at `position` is one of `values`, in order, then the marks."""
        index = self._at.get(position)
        if index is None:
            index = self._at[position] = {}
            for i, t in enumerate(self.items):
                if t.__class__ is tuple:
                    index.setdefault(t[position], []).append(i)
        found = [index[v] for v in values if v in index]
        if not found:
            return self.marks
        at = found[0] if len(found) == 1 else sorted(i for f in found for i in f)
        items = self.items
        return [items[i] for i in at] + self.marks


@dataclass
class Stream:
    info: StreamInfo
    queue: PushQueue
    router: StreamRouter


class RunningQuery:
    """A query folded into the Fjord: its id, text, plan, result columns and sink."""

    def __init__(
        self, qid: str, sql: str | None, query: ast.Query, plan: Plan, start_time: float
    ) -> None:
        self.id = qid
        self.sql = sql
        self.ast = query
        self.plan = plan
        self.columns = plan.columns
        self.sink: Sink = plan.sink
        self.start_time = start_time
        self.state = "running"  # or "failed" (then `error` says why)
        # Its operators run inside the router's transition (fused), not as scheduled steps.
        self.fused = False
        self.error: str | None = None

    @property
    def demand(self) -> Demand:
        return self.plan.demand

    @property
    def demands(self) -> tuple[Demand, ...]:
        """Every input's demand: a UNION ALL's per branch, a stream-stream join's per side."""
        right = getattr(self.plan.bound, "right", None)
        if right is not None:
            return (self.plan.demand, right.demand)
        return getattr(self.plan, "demands", (self.plan.demand,))

    @property
    def operators(self) -> list[Operator]:
        return self.plan.operators

    def as_dict(self, row: tuple) -> dict[str, Any]:
        return dict(zip(self.columns, row, strict=True))

    def on_row(self, fn: Callable[[dict[str, Any]], None]) -> None:
        """Call `fn` with each result row as a dict."""
        cols = self.columns
        self.sink.add_callback(lambda row: fn(dict(zip(cols, row, strict=True))))

    def _shared(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [
            {
                "operator": "stream_router",
                "stream": p.stream,
                "predicates": [sql_atom(*a) for a in p.demand.atoms],
            }
            for p in getattr(self.plan, "branches", [self.plan])  # a union: one per branch
        ]
        b = self.plan.bound
        if getattr(b, "right", None) is not None:  # a stream-stream join: each side's filter
            out[0]["predicates"] = [
                sql_atom(b.schema.names[a.field], a.op, a.value) for a in b.atoms
            ]
            rs = b.right.schema
            out.append(
                {
                    "operator": "stream_router",
                    "stream": b.right.stream,
                    "predicates": [
                        sql_atom(rs.names[a.field], a.op, a.value) for a in b.right.atoms
                    ],
                }
            )
        users = self.plan.shared_with
        if users is not None:
            agg = self.plan.aggregate
            out.append({**agg.describe(), "queries_sharing": len(users)})
        if getattr(self.plan, "group_filter", ()):  # (a union's plan has none)
            # checked on the window's rows, not by the router
            out[0]["predicates"] = _router_predicates(self.plan)
            out[-1]["groups_of_this_query"] = list(self.plan.group_filter)
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "sql": self.sql,
            "stream": self.plan.stream,
            "shape": self.plan.shape,
            "columns": list(self.columns),
            "shared": self._shared(),
            "operators": [op.describe() for op in self.plan.operators],
            "rows": self.sink.rows,
            "priority": self.ast.tickets,
            "state": self.state,
            "error": self.error,
        }


@dataclass
class PreparedQuery:
    """A parsed and planned query, not installed yet (`Fjord.prepare`, then `add_query`)."""

    id: str
    sql: str | None
    tree: ast.Query
    plan: Plan
    start_time: float


class Fjord:
    def __init__(
        self,
        scheduler: Scheduler | None = None,
        *,
        queue_bound: int = DEFAULT_BOUND,
        max_lag: float = INF,
        progress: ProgressPolicy | None = None,
        limits: Limits = DEFAULT_LIMITS,
        fuse: bool = True,
        share_group_filters: bool = True,
    ) -> None:
        self.catalog = Catalog()
        # Over a tumbling window, WHERE conditions on the groups alone run after the aggregate
        # so that queries differing only in their groups share it (planner
        # `_group_filters_last`). Off: each such query aggregates only its own groups.
        self.share_group_filters = share_group_filters
        # Fused delivery (`fuse`): filters, projections, sinks and window updates run inside
        # the router's transition, per batch. False keeps one operator and queue per step
        # (the reference the tests compare against).
        self.fuse = fuse
        self.scheduler = scheduler or RoundRobinScheduler()
        self.scheduler.on_error = self._operator_failed
        self.queue_bound = queue_bound
        self.max_lag = max_lag
        # Per-sensor progress (fjords.runtime.progress); `max_lag` is an optional event-time cap.
        self.progress_policy = progress
        self.limits = limits
        self.streams: dict[str, Stream] = {}
        self.queries: dict[str, RunningQuery] = {}
        self.failed: dict[str, RunningQuery] = {}  # queries stopped by an error, with it
        self.query_failures = 0
        self.operator_errors = 0  # errors no query could be blamed for (logged the first time)
        self.on_query_failed: list[QueryFailed] = []
        self._owners: dict[Operator, set[str]] = {}  # operator -> ids of the queries using it
        self._route_owners: dict[Hashable, set[str]] = {}  # router key -> query ids
        self._shared: dict[tuple, SharedAggregate] = {}
        self._stream_priorities: dict[str, Counter[int]] = {}  # stream -> its queries' PRIORITY
        self._ids = itertools.count(1)

    # -- sources ---------------------------------------------------------------------------
    def add_stream(self, name: str, schema: Schema, sensor_field: str | None = None) -> Stream:
        """Register a sensor stream; `sensor_field` names the column identifying the sensor."""
        if schema.time is None:
            raise QueryError(f"stream {name!r} needs a time field")
        if sensor_field is not None:
            schema.index(sensor_field)
        info = StreamInfo(name, schema, sensor_field)
        self.catalog.add_stream(info)
        q = PushQueue(self.queue_bound, name=f"stream:{name}")
        router = StreamRouter(
            q,
            time_index=schema.index(schema.time),
            sensor_index=None if sensor_field is None else schema.index(sensor_field),
            max_lag=self.max_lag,
            policy=self.progress_policy,
            name=f"router:{name}",
        )
        router.on_route_error = self._route_failed
        self.scheduler.add(router)
        stream = self.streams[name] = Stream(info, q, router)
        return stream

    def add_table(self, name: str, source: Table | str | os.PathLike[str]) -> Table:
        table = source if isinstance(source, Table) else Table.from_file(name, source)
        table.name = name
        self.catalog.add_table(table)
        return table

    def _stream(self, name: str) -> Stream:
        try:
            return self.streams[name]
        except KeyError:
            raise QueryError(f"unknown stream {name!r}") from None

    def push(self, stream: str, t: tuple) -> None:
        """Push one sample (a tuple in the stream's schema). It is never copied afterwards."""
        self.streams[stream].queue.put(t)

    def push_many(self, stream: str, rows: Iterable[tuple]) -> None:
        self.streams[stream].queue.put_many(list(rows))

    def push_row(self, stream: str, values: Mapping[str, object]) -> None:
        s = self._stream(stream)
        s.queue.put(s.info.schema.make(values))

    def heartbeat(self, stream: str, sensor: object, time: float) -> None:
        """A sensor with nothing to send has still reached `time` (lets windows close)."""
        self._stream(stream).queue.put(Heartbeat(sensor, time))

    def pace(self, stream: str, sensor: object, gap_s: float) -> None:
        """A sensor sends about every `gap_s` seconds: its silence bound until arrivals show."""
        self._stream(stream).queue.put(Pace(sensor, gap_s))

    def release(self, stream: str, sensor: object, *, forget: bool = False) -> None:
        """A sensor stops holding the stream's progress: asleep, or (`forget`) gone for good."""
        self._stream(stream).queue.put(Release(sensor, forget))

    def check_idle(self) -> None:
        """Let every stream notice idle sensors though no data flows (call every second or so)."""
        for s in self.streams.values():
            if not len(s.queue):
                s.queue.put(IDLE_CHECK)

    def end_of_stream(self, stream: str | None = None) -> None:
        """No more input: every window that has data closes and is emitted."""
        for name in [stream] if stream else list(self.streams):
            self._stream(name).queue.put(Watermark(INF))

    # -- queries ---------------------------------------------------------------------------
    def prepare(self, query: str | ast.Query, *, query_id: str | None = None) -> PreparedQuery:
        """Parse and plan a query without installing anything (no side effects), so the caller
        can save it first and install it after. Raises QuerySyntaxError / QueryError."""
        sql, tree = self._parse(query)
        qid = query_id or f"q{next(self._ids)}"
        if qid in self.queries or qid in self.failed:
            raise QueryError(f"query id {qid!r} is already in use")
        # Failed queries count until deleted: failing ones cannot pile up without bound.
        n = len(self.queries) + len(self.failed) + 1
        self.limits.check("max_queries", n, "number of queries (running and failed)")
        # A stream's routers must be known before planning (to read its progress).
        stream_names = [r.name for r in tree.sources if r.name in self.streams]
        start = -math.inf
        if stream_names:
            router = self.streams[stream_names[0]].router
            # Windows that began before the query did would be incomplete; skip them.
            start = router.progress.max_time if router.progress.max_time > -INF else -math.inf
        plan = plan_query(
            tree,
            self.catalog,
            queue_bound=self.queue_bound,
            start_time=start,
            limits=self.limits,
            share_group_filters=self.share_group_filters,
        )
        return PreparedQuery(qid, sql, tree, plan, start)

    def add_query(
        self, query: str | ast.Query | PreparedQuery, *, query_id: str | None = None
    ) -> RunningQuery:
        """Fold a query into the running plan. Raises QuerySyntaxError / QueryError on bad input."""
        prepared = (
            query if isinstance(query, PreparedQuery) else self.prepare(query, query_id=query_id)
        )
        qid, plan = prepared.id, prepared.plan
        if qid in self.queries or qid in self.failed:
            raise QueryError(f"query id {qid!r} is already in use")
        if isinstance(plan, UnionPlan):
            return self._add_union(prepared, plan)
        stream = self.streams[plan.stream]
        key = plan.share_key
        fused = None if key is not None or not self.fuse else fuse(plan)
        direct = key is not None and self._fusable_window(plan)
        for op in plan.operators:  # PRIORITY n (a fused query's share is its router's)
            op.tickets = prepared.tree.tickets
        if fused is None and not direct:  # fused operators are never scheduled
            for op in plan.operators:
                self.scheduler.add(op)
                self._owners[op] = {qid}
        if key is not None:
            self._join_shared(qid, key, plan, stream)
        else:
            stream.router.add(
                qid,
                plan.atoms,
                plan.residual,
                plan.target.put,
                progress=plan.target.put if plan.needs_progress else None,
                batch_target=fused if fused is not None else plan.target.put_many,
                priority=prepared.tree.tickets,  # fused: its rows first within a batch
                projection=fused.projection() if isinstance(fused, _ProjectDeliver) else None,
            )
            # (a query routed under its own id needs no owner set: see _route_failed)
        for rkey, route in _extra_route_keys(qid, plan):  # a stream-stream join's second side
            self._route_input(qid, rkey, route, prepared.tree.tickets)
        rq = RunningQuery(qid, prepared.sql, prepared.tree, plan, prepared.start_time)
        rq.fused = fused is not None or direct
        self.queries[qid] = rq
        tickets = prepared.tree.tickets
        self._count_priority(plan, tickets)
        shared = self._shared[key] if key is not None else None
        if shared is not None:
            shared.priorities[tickets] += 1
        self._share_tickets(plan.stream, shared)
        for other in _input_streams(plan)[1:]:  # a join's second stream
            self._share_tickets(other)
        return rq

    def _route_input(self, qid: str, key: str, src: Plan | Route, tickets: int) -> None:
        """One more input of query `qid` on its stream's router under `key` (a union's branch,
        a join's second side): scheduled, never fused, with watermarks."""
        self._route_owners[key] = {qid}
        self.streams[src.stream].router.add(
            key,
            src.atoms,
            src.residual,
            src.target.put,
            progress=src.target.put,
            batch_target=src.target.put_many,
            priority=tickets,
        )

    def _add_union(self, prepared: PreparedQuery, plan: UnionPlan) -> RunningQuery:
        """A UNION ALL: each branch routed under its own key (`qid#i`) on its stream's router,
        with watermarks (the merge waits for them); all its operators scheduled, none fused."""
        qid, tickets = prepared.id, prepared.tree.tickets
        for op in plan.operators:
            op.tickets = tickets
            self.scheduler.add(op)
            self._owners[op] = {qid}
        plan.routes = []
        for i, bp in enumerate(plan.branches):
            key = f"{qid}#{i}"
            self._route_input(qid, key, bp, tickets)
            plan.routes.append((key, bp.stream))
        # A branch whose stream has no sensor holding it back is not waited for.
        plan.merge.idle = [
            lambda tracker=self.streams[bp.stream].router.progress: not tracker.holding()
            for bp in plan.branches
        ]
        rq = RunningQuery(
            qid,
            prepared.sql,
            prepared.tree,
            plan,  # type: ignore[arg-type]  # a UnionPlan reads like a Plan
            prepared.start_time,
        )
        self.queries[qid] = rq
        self._count_priority(plan, tickets)  # type: ignore[arg-type]
        for stream in _input_streams(plan):
            self._share_tickets(stream)
        return rq

    def _parse(self, query: str | ast.Query) -> tuple[str | None, ast.Query]:
        if not isinstance(query, str):
            return None, query
        from fjords.compile.sql.parser import parse

        self.limits.check("max_sql_chars", len(query), "query text length (characters)")
        return query, parse(query)

    def plan(self, query: str | ast.Query) -> Plan:
        """The plan a query would get, without installing it."""
        _, tree = self._parse(query)
        return plan_query(
            tree,
            self.catalog,
            queue_bound=self.queue_bound,
            limits=self.limits,
            share_group_filters=self.share_group_filters,
        )

    def explain(self, query: str | ast.Query | Plan) -> dict[str, Any]:
        """The plan a query would get (or `plan` itself), as JSON, without installing it."""
        tree = None if isinstance(query, Plan) else self._parse(query)[1]
        plan = query if isinstance(query, Plan) else self.plan(tree)  # type: ignore[arg-type]
        atoms = plan.demand.atoms
        same_filter = [
            qid
            for qid, q in self.queries.items()
            if atoms and q.plan.stream == plan.stream and set(q.demand.atoms) == set(atoms)
        ]
        key = plan.share_key
        shared_agg = self._shared.get(key) if key is not None else None
        return {
            "aggregate_shared_with": sorted(shared_agg.users) if shared_agg else [],
            "stream": plan.stream,
            "shape": plan.shape,
            "columns": list(plan.columns),
            "shared": {
                "operator": "stream_router",
                "stream": plan.stream,
                "queries_already_sharing": len(self.streams[plan.stream].router.index),
                "same_filter_as": same_filter,  # one index entry serves them all
            },
            "predicates": (
                _router_predicates(plan)
                if plan.group_filter
                else [sql_atom(*a) for a in plan.demand.atoms]
            ),
            **({"group_filter": list(plan.group_filter)} if plan.group_filter else {}),
            "operators": [op.describe() for op in plan.operators],
            **({} if tree is None else {"priority": tree.tickets}),
        }

    def remove_query(self, qid: str) -> None:
        if self.failed.pop(qid, None) is not None:  # already out of the plan
            return
        try:
            rq = self.queries.pop(qid)
        except KeyError:
            raise QueryError(f"unknown query id {qid!r}") from None
        tickets = rq.ast.tickets
        streams = _input_streams(rq.plan)
        for stream in streams:
            _uncount(self._stream_priorities[stream], tickets)
        for op in rq.plan.operators:
            self.scheduler.remove(op)
            self._owners.pop(op, None)
        if isinstance(rq.plan, UnionPlan):
            for key, stream in rq.plan.routes or ():
                self.streams[stream].router.remove(key)
                self._route_owners.pop(key, None)
            for stream in streams:
                self._share_tickets(stream)
            return
        for rkey, route in _extra_route_keys(qid, rq.plan):
            self.streams[route.stream].router.remove(rkey)
            self._route_owners.pop(rkey, None)
        for other in streams[1:]:  # a join's second stream
            self._share_tickets(other)
        key = rq.plan.share_key
        if key is None:
            self.streams[rq.plan.stream].router.remove(qid)
            self._share_tickets(rq.plan.stream)
            return
        shared = self._shared[key]
        shared.users.discard(qid)
        shared.gate(rq.plan, joins=False)
        self._gate_limits(shared)
        _uncount(shared.priorities, tickets)
        if shared.fanout is None:
            shared.direct.pop(qid, None)
            shared.picks.pop(qid, None)
        else:
            shared.fanout.outputs.remove(rq.plan.finish_input)
        if not shared.users:  # the last query using it: the aggregate goes too
            self.streams[rq.plan.stream].router.remove(shared.router_key)
            self._route_owners.pop(shared.router_key, None)
            self.scheduler.remove(shared.aggregate)
            self._owners.pop(shared.aggregate, None)
            if shared.fanout is not None:
                self.scheduler.remove(shared.fanout)
                self._owners.pop(shared.fanout, None)
            del self._shared[key]
            shared.aggregate.release_state()  # type: ignore[attr-defined]
            shared = None
        self._share_tickets(rq.plan.stream, shared)

    def _count_priority(self, plan: Plan, tickets: int) -> None:
        """The query's PRIORITY counted on every stream it reads."""
        for stream in _input_streams(plan):
            self._stream_priorities.setdefault(stream, Counter())[tickets] += 1

    def _share_tickets(self, stream: str, shared: SharedAggregate | None = None) -> None:
        """Operators serving several queries (stream routers, shared aggregates) run with the
        highest PRIORITY among them, so a shared stage never holds a high-priority query back.

        Only the stages of the query just added or removed (its stream's router, its shared
        aggregate) can change; their users' priorities are kept counted, so installing n
        queries costs O(n), not O(n^2) (it was most of the install time at 1,000 queries)."""
        router = self.streams[stream].router
        counts = self._stream_priorities.get(stream)
        router.tickets = max(counts) if counts else ast.DEFAULT_PRIORITY
        if shared is None:
            return
        top = max(shared.priorities) if shared.priorities else ast.DEFAULT_PRIORITY
        shared.aggregate.tickets = top
        router.set_priority(shared.router_key, top)  # its rows' turn within a router batch
        if shared.fanout is not None:
            shared.fanout.tickets = top

    # -- failures ----------------------------------------------------------------------------
    def fail_query(self, qid: str, reason: str, exc: BaseException | None = None) -> None:
        """Take a running query out of the plan and mark it failed with `reason` (`exc`, the
        exception, only goes to the log with its traceback)."""
        rq = self.queries.get(qid)
        if rq is None:
            return
        self.remove_query(qid)
        _release(rq)
        rq.state, rq.error = "failed", reason
        self.failed[qid] = rq
        self.query_failures += 1
        log.warning("query %s failed and was stopped: %s", qid, reason, exc_info=exc)
        for fn in list(self.on_query_failed):
            try:
                fn(qid, reason)
            except Exception:  # a listener's bug must not undo the isolation
                log.exception("on_query_failed listener failed for query %s", qid)

    def _operator_failed(self, op: Operator, exc: Exception) -> None:
        owners = self._owners.get(op)
        if not owners:
            # Not a query's operator (a stream router outside routing): its batch is lost.
            self.operator_errors += 1
            if self.operator_errors == 1:
                log.error("operator %s failed; its batch is dropped", op.name, exc_info=exc)
            return
        reason = _reason(op.name, exc)
        for qid in sorted(owners):  # a shared aggregate: every query using it
            self.fail_query(qid, reason, exc)

    def _route_failed(self, key: Hashable, exc: Exception) -> None:
        if isinstance(exc, DeliveryError):  # an operator of a fused delivery
            reason = _reason(exc.where, exc.error)
            exc = exc.error
        else:
            reason = _reason("filter", exc)
        owners = self._route_owners.get(key)
        if owners is None:  # a query routed under its own id
            owners = {key} if key in self.queries else set()  # type: ignore[arg-type]
        for qid in sorted(owners):  # type: ignore[type-var]
            self.fail_query(qid, reason, exc)

    def _fusable_window(self, plan: Plan) -> bool:
        """Whether a windowed plan runs fused: a time-window aggregate of its own stream (not
        ROWS, not partial), then Finish, then the sink."""
        agg, ops = plan.aggregate, plan.operators
        return (
            self.fuse
            and type(agg) is WindowAggregate
            and not agg.rows
            and not agg.partial
            and len(ops) == 2
            and type(ops[0]) is Finish
            and ops[1] is plan.sink
            and ops[0].outputs == plan.sink.inputs
        )

    def _join_shared(self, qid: str, key: tuple, plan: Plan, stream: Stream) -> None:
        """Fold a windowed aggregate in: reuse a running one with the same filter, groups,
        aggregates and window (this query only adds its Finish), or start it.

        Fused (time windows, `fuse`): the router hands the aggregate its tuples a batch at a
        time (`add_rows`; watermarks still come through its queue, after them) and each
        emitted window goes straight to every user's Finish and sink (`fan_out`)."""
        finish_in = plan.finish_input
        shared = self._shared.get(key)
        fused = self._fusable_window(plan)
        if shared is None:
            agg = plan.aggregate
            rkey = f"aggregate:{next(self._ids)}"
            if fused:
                shared = SharedAggregate(agg, None, rkey)
                agg.direct = shared.fan_out
                agg.fan = shared
                agg.after_transition = lambda s=shared: self._fan_out_failed(s)
                self._owners[agg] = shared.users
            else:
                fanout = Multiplex(agg.outputs[0], [], name="window rows fan-out")
                shared = SharedAggregate(agg, fanout, rkey)
                self.scheduler.add(fanout)
                self._owners[agg] = self._owners[fanout] = shared.users  # the live set
            self._shared[key] = shared
            self.scheduler.add(agg)
            self._route_owners[shared.router_key] = shared.users
            gated = plan.group_gate is not None
            stream.router.add(
                shared.router_key,
                plan.atoms,
                shared.admits(plan.residual) if gated else plan.residual,
                plan.target.put,
                progress=plan.target.put,
                batch_target=_guarded(agg.add_rows, agg.name) if fused else plan.target.put_many,
            )
        if shared.fanout is None:
            shared.direct[qid] = (plan.operators[0], plan.sink)  # type: ignore[assignment]
            if plan.group_pick is not None:
                shared.picks[qid] = plan.group_pick
        else:
            shared.fanout.outputs.append(finish_in)
        shared.users.add(qid)
        plan.shared_with = shared.users
        shared.gate(plan, joins=True)
        self._gate_limits(shared)

    def _gate_limits(self, shared: SharedAggregate) -> None:
        """An aggregate shared by users of different groups may hold what they would apart:
        the group and state limits times its users (it holds at most the union of theirs)."""
        if shared.gates:
            n = max(1, len(shared.users))
            lim = self.limits
            shared.aggregate.limits = replace(  # type: ignore[attr-defined]
                lim,
                max_groups_per_window=lim.max_groups_per_window * n,
                max_state_bytes_per_query=lim.max_state_bytes_per_query * n,
            )

    def _fan_out_failed(self, shared: SharedAggregate) -> None:
        """After a fused aggregate's transition: fail the users whose Finish or sink raised."""
        if not shared.errors:
            return
        errors, shared.errors = shared.errors, []
        for qid, where, exc in errors:
            self.fail_query(qid, _reason(where, exc), exc)

    # -- running ---------------------------------------------------------------------------
    def build_indexes(self) -> None:
        """Build now the routers' indexes that a change of the query set left to rebuild at
        the next reading: a daemon then sets them aside with the rest of its long-lived state
        (`gateway.long_lived`), instead of the collector walking them on every full pass."""
        for stream in self.streams.values():
            stream.router.index.build()

    def run_until_idle(self, max_steps: int | None = None) -> int:
        """Drain every queue synchronously (tests, file replay)."""
        return self.scheduler.run_until_idle(max_steps)

    async def run(self) -> None:
        await self.scheduler.run()

    def stop(self) -> None:
        self.scheduler.stop()

    def stats(self) -> dict[str, Any]:
        """Counters for /metrics: tuples in and out, drops per queue, late samples, per-query rows."""
        out: dict[str, Any] = {"streams": {}, "queries": {}}
        for name, s in self.streams.items():
            out["streams"][name] = {
                "tuples_in": s.router.tuples_in,
                "deliveries": s.router.deliveries,
                "late": s.router.late,
                "clock_rejects": s.router.progress.clock_rejects,
                "queue_drops": s.queue.drops,
                "queue_len": len(s.queue),
                "queries": len(s.router.index),
                "watermark": s.router.progress.watermark,
            }
        for qid, q in self.queries.items():
            drops = sum(getattr(i, "drops", 0) for op in q.operators for i in op.inputs)
            out["queries"][qid] = {
                "rows": q.sink.rows,
                "queue_drops": drops,
                "dropped_results": q.sink.dropped,
            }
            if isinstance(q.plan, UnionPlan):  # rows the merge could not keep in time order
                out["queries"][qid]["merge_drops"] = q.plan.merge.dropped
            for op in q.operators:  # a stream-stream join's state and losses
                if op.kind == "symmetric_hash_join":
                    out["queries"][qid]["join"] = {
                        "held": sum(op.sizes),  # type: ignore[attr-defined]
                        "fill_threshold": op.fill_threshold,  # type: ignore[attr-defined]
                        "evicted": op.evicted,  # type: ignore[attr-defined]
                        "dropped": op.dropped,  # type: ignore[attr-defined]
                        "late": op.late,  # type: ignore[attr-defined]
                    }
        out["query_failures"] = self.query_failures
        out["operator_errors"] = self.operator_errors  # batches dropped by a shared operator
        out["failed_queries"] = {qid: q.error for qid, q in self.failed.items()}
        out["scheduler"] = {
            "transitions": self.scheduler.transitions,
            "busy_seconds": self.scheduler.busy_seconds,
        }
        return out


def _extra_route_keys(qid: str, plan: Plan) -> list[tuple[str, Route]]:
    """Router keys of a plan's extra inputs (a stream-stream join's second side)."""
    return [(f"{qid}#{i}", r) for i, r in enumerate(plan.extra_routes, 2)]


def _input_streams(plan: Plan) -> tuple[str, ...]:
    """Every stream a query reads, its own first (a union's branches', a join's two)."""
    streams = getattr(plan, "streams", None)
    if streams is not None:
        return tuple(dict.fromkeys(streams))
    right = getattr(plan.bound, "right", None)
    if right is not None and right.stream != plan.stream:
        return (plan.stream, right.stream)
    return (plan.stream,)


def _uncount(counts: Counter[int], value: int) -> None:
    counts[value] -= 1
    if counts[value] <= 0:
        del counts[value]


def _reason(where: str, exc: Exception) -> str:
    """A failure's reason for clients: where it happened and what (no traceback)."""
    text = str(exc)
    if len(text) > 300:
        text = text[:300] + "..."
    return f"{where}: {type(exc).__name__}: {text}" if text else f"{where}: {type(exc).__name__}"


def _release(rq: RunningQuery) -> None:
    """A failed query stays listed, not its data: drop what its queues and windows hold."""
    for op in rq.plan.operators:  # (a shared aggregate is released with its last user)
        for q in op.inputs:
            if isinstance(q, PushQueue):
                q.get_batch(len(q))
        release = getattr(op, "release_state", None)
        if release is not None:
            release()
