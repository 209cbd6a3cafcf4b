"""The Fjord: one running plan holding every stream, table and query, driven by one scheduler.

Proxies push each sample once into its stream (`push`); the compiler's plans are installed
while tuples flow (`install` / `remove_query`, through `fjords.engine.Engine`) and each query
gets its results through its sink.

A query is a unit of failure: an exception in one of its operators (or in its filter, while the
shared router routes) removes that query alone and marks it failed with the reason
(`RunningQuery.state`, `.error`, `Fjord.failed`, `on_query_failed`); a shared aggregate that
raises fails the queries using it. Other queries and the stream go on.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from fjords.catalog import Catalog, StreamInfo
from fjords.errors import QueryError
from fjords.limits import DEFAULT_LIMITS, Limits
from fjords.runtime.delivery import DeliveryError, Guarded
from fjords.runtime.history import Historical, HistoricalSource, History
from fjords.runtime.operators.base import DEFAULT_TICKETS, Operator
from fjords.runtime.operators.router import StreamRouter
from fjords.runtime.operators.simple import Multiplex
from fjords.runtime.plan import QueryPlan
from fjords.runtime.predicate_index import Atom, BatchTarget, Projection, Residual
from fjords.runtime.progress import (
    IDLE_CHECK,
    INF,
    Heartbeat,
    Pace,
    ProgressPolicy,
    Release,
    Watermark,
)
from fjords.runtime.query import RunningQuery
from fjords.runtime.queues import DEFAULT_BOUND, PushQueue
from fjords.runtime.scheduler import NO_SHARING, LoopSharing, RoundRobinScheduler, Scheduler
from fjords.runtime.shared import SharedAggregate, WindowFanOut
from fjords.schema import Schema
from fjords.tables import Table

log = logging.getLogger(__name__)

QueryFailed = Callable[[str, str], None]  # (query id, reason)


@dataclass
class Stream:
    info: StreamInfo
    queue: PushQueue
    router: StreamRouter


class Fjord:
    def __init__(
        self,
        scheduler: Scheduler | None = None,
        *,
        queue_bound: int = DEFAULT_BOUND,
        max_lag: float = INF,
        progress: ProgressPolicy | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self.catalog = Catalog()
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
        #: streams' transient segments (`keep_history`), what new queries can start from
        self.histories: dict[str, History] = {}
        self.older: dict[str, HistoricalSource] = {}  # what the histories no longer hold
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
            on_route_error=self._route_failed,
            name=f"router:{name}",
        )
        self.scheduler.add(router)
        stream = self.streams[name] = Stream(info, q, router)
        return stream

    def keep_history(
        self, stream: str, history: History, older: HistoricalSource | None = None
    ) -> None:
        """Keep `stream`'s recent readings (late ones too) in `history`: snapshots answer from
        it, and queries installed with `backfill_from` start from it; `older` holds what the
        history no longer does (the archive)."""
        self._stream(stream).router.add("__history__", [], None, history.add_many, late=history.add)
        self.histories[stream] = history
        if older is not None:
            self.older[stream] = older

    def held_since(self, stream: str, since: float) -> Historical | None:
        """What `older` holds of `stream` from `since` up to where its history is complete
        (None: the history has it all, or nothing older is known)."""
        history, older = self.histories.get(stream), self.older.get(stream)
        if history is None or older is None or since >= history.complete_from:
            return None
        names = frozenset(self.catalog.streams[stream].schema.names)
        return older.readings(stream, since, INF, history.complete_from, names)

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

    def pace(self, stream: str, sensor: object, gap_s: float, every: int = 1) -> None:
        """A sensor sends about every `gap_s` seconds: its silence bound until arrivals show.
        `every`: each of its readings from now on stands for that many (`Pace.every`)."""
        self._stream(stream).queue.put(Pace(sensor, gap_s, every))

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
    def stream_time(self, stream: str) -> float:
        """The latest event time `stream` has seen (-inf before any): windows that began
        before it would be incomplete for a query starting now."""
        s = self.streams.get(stream)
        return s.router.progress.max_time if s is not None else -INF

    def stream_idle(self, stream: str) -> Callable[[], bool]:
        """Whether no sensor holds `stream`'s progress back (none yet, or all quiet), asked
        when needed: a merge of several streams does not wait for an idle one."""
        tracker = self._stream(stream).router.progress
        return lambda: not tracker.holding()

    def check_new_id(self, qid: str) -> None:
        """A query id must be new, and the queries (running and failed) within the limit."""
        if qid in self.queries or qid in self.failed:
            raise QueryError(f"query id {qid!r} is already in use")
        # Failed queries count until deleted: failing ones cannot pile up without bound.
        n = len(self.queries) + len(self.failed) + 1
        self.limits.check("max_queries", n, "number of queries (running and failed)")

    def install(
        self,
        qid: str,
        plan: QueryPlan,
        *,
        sql: str | None = None,
        tickets: int = DEFAULT_TICKETS,
        start_time: float = -INF,
        backfill_from: float | None = None,
    ) -> RunningQuery:
        """Fold a compiled query in: its routes on its streams' routers, its operators in the
        scheduler (unless fused), its shared aggregate joined or started. `backfill_from`: the
        query is first handed its stream's history from then on (`keep_history`)."""
        if qid in self.queries or qid in self.failed:
            raise QueryError(f"query id {qid!r} is already in use")
        rq = RunningQuery(qid, sql, plan, tickets, start_time, self.catalog)
        for op in plan.operators:  # PRIORITY n (a fused query's share is its router's)
            op.tickets = tickets
        if not plan.fused:  # fused operators are never scheduled
            for op in plan.operators:
                self.scheduler.add(op)
                self._owners[op] = {qid}
        if plan.window is not None:
            rq.shared = self._join_shared(qid, plan, tickets, backfill_from)
        every = plan.demand.sample_every_rows if plan.window is None else None
        for route in plan.routes:
            key = qid + route.suffix
            if route.suffix:  # (a query routed under its own id needs no owner set)
                self._route_owners[key] = {qid}
            counted = None
            if backfill_from is not None and plan.window is None:
                counted = self._backfill(
                    route.stream,
                    route.atoms,
                    route.residual,
                    route.rows,
                    route.progress,
                    backfill_from,
                    projection=route.projection,
                    sample_every=every,
                )
            self.streams[route.stream].router.add(
                key,
                route.atoms,
                route.residual,
                route.rows,
                progress=route.progress,
                priority=tickets,  # fused: its rows first within a batch
                projection=route.projection,
                sample_every=every,
                counted=counted,
            )
        self.queries[qid] = rq
        for stream in plan.streams:
            self._stream_priorities.setdefault(stream, Counter())[tickets] += 1
        for stream in plan.streams:
            self._share_tickets(stream, rq.shared if stream == plan.stream else None)
        return rq

    def _join_shared(
        self, qid: str, plan: QueryPlan, tickets: int, backfill_from: float | None
    ) -> SharedAggregate:
        """Fold a windowed aggregate in: join the running one with the same key (this query
        only adds its Finish), or start it.

        Fused: the router hands the aggregate its tuples a batch at a time (`add_rows`) and
        its progress (`advance`), and each window goes straight to every user's Finish and
        sink (WindowFanOut). Unfused: both through the aggregate's input queue, its windows
        through a Multiplex to each user's Finish input.

        `backfill_from`: the query's windows from then on must be whole. A running aggregate
        that joined the stream later cannot be shared; a new one is filled from the stream's
        history first."""
        window = plan.window
        assert window is not None
        key = window.key
        shared = self._shared.get(key)
        if shared is not None and backfill_from is not None:
            if shared.complete_from > backfill_from:
                key, shared = (*key, ("from", backfill_from, qid)), None
        if shared is not None:
            shared.join(qid, window, plan.sink, tickets)
            return shared
        rkey = f"aggregate:{next(self._ids)}"
        rows: BatchTarget
        progress: Callable[[object], None]
        start = window.spec.start_time if backfill_from is None else backfill_from
        if window.fused:
            fan = WindowFanOut(self._user_failed)
            agg = window.spec.build(fan=fan)
            shared = SharedAggregate(agg, fan, rkey, self.limits, key=key, complete_from=start)
            self._owners[agg] = shared.users  # the live set
            rows, progress = Guarded(agg.add_rows, agg.name), agg.advance
        else:
            out = PushQueue(self.queue_bound, name="window rows")
            agg = window.spec.build(output=out)
            fanout = Multiplex(out, [], name="window rows fan-out")
            shared = SharedAggregate(agg, fanout, rkey, self.limits, key=key, complete_from=start)
            self.scheduler.add(fanout)
            self._owners[agg] = self._owners[fanout] = shared.users
            q = agg.inputs[0]
            assert isinstance(q, PushQueue)
            rows, progress = q.put_many, q.put
        self._shared[key] = shared
        self.scheduler.add(agg)
        self._route_owners[rkey] = shared.users
        shared.join(qid, window, plan.sink, tickets)
        residual = shared.admits(window.residual) if window.gate is not None else window.residual
        every = plan.demand.sample_every_rows
        counted = None
        if backfill_from is not None:
            counted = self._backfill(
                window.stream,
                window.atoms,
                residual,
                rows,
                progress,
                backfill_from,
                sample_every=every,
            )
        self.streams[window.stream].router.add(
            rkey,
            window.atoms,
            residual,
            rows,
            progress=progress,
            sample_every=every,
            counted=counted,
        )
        return shared

    def _backfill(
        self,
        stream: str,
        atoms: Iterable[Atom],
        residual: Residual,
        rows: BatchTarget,
        progress: Callable[[object], None] | None,
        since: float,
        *,
        projection: Projection | None = None,
        sample_every: int | None = None,
    ) -> dict | None:
        """Hand a consumer the stream's history from `since` on, through a router of its own
        (the same filter), before it joins the live router: every reading routed so far,
        once. Its watermarks never pass the live one. With `sample_every` (SAMPLE EVERY n
        ROWS) returns each sensor's count so far, for the live router to go on from."""
        s = self.streams[stream]
        history = self.histories.get(stream)
        if history is None:
            return None
        live = s.router.progress.watermark
        held = history.tuples(max(since, history.complete_from), INF)
        older = self.held_since(stream, since)
        if older is not None:  # in time order before the history's part
            ti = s.router.time_index
            held = sorted(older.tuples(), key=lambda t: t[ti]) + held
        if progress is not None:
            forward = progress

            def capped(item: object) -> None:
                if item.__class__ is Watermark and item.time > live:
                    item = Watermark(live)
                forward(item)

            progress = capped
        queue = PushQueue(self.queue_bound, name=f"backfill:{stream}")
        router = StreamRouter(
            queue,
            time_index=s.router.time_index,
            sensor_index=s.router.sensor_index,
            policy=ProgressPolicy(idle_timeout_s=INF),
            on_route_error=self._route_failed,
            name=f"backfill:{stream}",
        )
        router.add(
            "backfill",
            atoms,
            residual,
            rows,
            progress=progress,
            projection=projection,
            sample_every=sample_every,
        )
        chunk = max(self.queue_bound // 2, 1)
        for i in range(0, len(held), chunk):
            queue.put_many(held[i : i + chunk])
            while router.transition():
                pass
            self.run_until_idle()  # scheduled consumers take it before the next chunk
        return router.sample_counts("backfill")

    def remove_query(self, qid: str) -> None:
        if self.failed.pop(qid, None) is not None:  # already out of the plan
            return
        try:
            rq = self.queries.pop(qid)
        except KeyError:
            raise QueryError(f"unknown query id {qid!r}") from None
        plan, tickets = rq.plan, rq.tickets
        for stream in plan.streams:
            _uncount(self._stream_priorities[stream], tickets)
        for op in plan.operators:
            self.scheduler.remove(op)
            self._owners.pop(op, None)
        for route in plan.routes:
            key = qid + route.suffix
            self.streams[route.stream].router.remove(key)
            self._route_owners.pop(key, None)
        shared = rq.shared
        if shared is not None and plan.window is not None:
            if shared.leave(qid, plan.window, tickets):  # the last user: the aggregate goes too
                self._stop_shared(plan.window.stream, shared.key, shared)
                shared = None
        for stream in plan.streams:
            self._share_tickets(stream, shared if stream == plan.stream else None)

    def _stop_shared(self, stream: str, key: tuple, shared: SharedAggregate) -> None:
        self.streams[stream].router.remove(shared.router_key)
        self._route_owners.pop(shared.router_key, None)
        self.scheduler.remove(shared.aggregate)
        self._owners.pop(shared.aggregate, None)
        if isinstance(shared.fanout, Multiplex):
            self.scheduler.remove(shared.fanout)
            self._owners.pop(shared.fanout, None)
        del self._shared[key]
        shared.aggregate.release_state()

    def shared_aggregate(self, key: tuple) -> SharedAggregate | None:
        """The running aggregate a plan with this key would share (None: it would start one)."""
        return self._shared.get(key)

    def _share_tickets(self, stream: str, shared: SharedAggregate | None = None) -> None:
        """Operators serving several queries (stream routers, shared aggregates) run with the
        highest PRIORITY among them, so a shared stage never holds a high-priority query back.

        Only the stages of the query just added or removed (its stream's router, its shared
        aggregate) can change; their users' priorities are kept counted, so installing n
        queries costs O(n), not O(n^2)."""
        router = self.streams[stream].router
        counts = self._stream_priorities.get(stream)
        router.tickets = max(counts) if counts else DEFAULT_TICKETS
        if shared is None:
            return
        top = shared.top_priority or DEFAULT_TICKETS
        shared.aggregate.tickets = top
        router.set_priority(shared.router_key, top)  # its rows' turn within a router batch
        if isinstance(shared.fanout, Multiplex):
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

    def _user_failed(self, qid: str, where: str, exc: Exception) -> None:
        """A user's part of a fused shared aggregate's output (its Finish or sink) raised."""
        self.fail_query(qid, _reason(where, exc), exc)

    def _route_failed(self, key: Hashable, exc: Exception) -> None:
        if isinstance(exc, DeliveryError):  # an operator of a fused delivery
            reason = _reason(exc.where, exc.error)
            exc = exc.error
        else:
            reason = _reason("filter", exc)
        owners = self._route_owners.get(key)
        if owners is None:  # a query routed under its own id
            owners = {key} if key in self.queries else set()
        for qid in sorted(owners):
            self.fail_query(qid, reason, exc)

    # -- running ---------------------------------------------------------------------------
    def build_indexes(self) -> None:
        """Build now the routers' indexes that a change of the query set left to rebuild at
        the next reading: a daemon then sets them aside with the rest of its long-lived state
        (`gateway.gc_freeze`), instead of the collector walking them on every full pass."""
        for stream in self.streams.values():
            stream.router.index.build()

    def run_until_idle(self, max_steps: int | None = None) -> int:
        """Drain every queue synchronously (tests, file replay)."""
        return self.scheduler.run_until_idle(max_steps)

    async def run(self, sharing: LoopSharing = NO_SHARING) -> None:
        """Run every query's operators until `stop()`, sharing the event loop as `sharing` says."""
        await self.scheduler.run(sharing)

    def stop(self) -> None:
        self.scheduler.stop()

    def _sampled_out(self, qid: str, q: RunningQuery) -> int | None:
        """The readings SAMPLE EVERY n ROWS left out of the query's (None: it does not sample)."""
        router = self.streams[q.plan.stream].router
        if q.shared is not None:
            return router.sampled_out(q.shared.router_key)
        counts = [router.sampled_out(qid + r.suffix) for r in q.plan.routes]
        return None if all(c is None for c in counts) else sum(c or 0 for c in counts)

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
                "queries": s.router.queries,
                "watermark": s.router.progress.watermark,
            }
        for qid, q in self.queries.items():
            drops = sum(getattr(i, "drops", 0) for op in q.operators for i in op.inputs)
            out["queries"][qid] = {
                "rows": q.sink.rows,
                "queue_drops": drops,
                "dropped_results": q.sink.dropped,
            }
            skipped = self._sampled_out(qid, q)
            if skipped is not None:  # SAMPLE EVERY n ROWS: left out by design, not lost
                out["queries"][qid]["sampled_out"] = skipped
            for op in q.operators:
                if op.kind == "zipper_merge":  # a union's rows it could not keep in time order
                    out["queries"][qid]["merge_drops"] = op.dropped  # type: ignore[attr-defined]
                elif op.kind == "changes_aggregate":  # EMIT CHANGES: readings behind its rows
                    out["queries"][qid]["changes_late"] = op.late  # type: ignore[attr-defined]
                elif op.kind == "symmetric_hash_join":  # a stream-stream join's state, losses
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
