"""The gateway daemon: one asyncio process hosting the Fjord, its sources, and the HTTP API.

`Gateway` is an async context manager that owns everything it starts: the scheduler task, the
sources feeding the streams, the HTTP site and the query store. Leaving it stops intake, drains
the Fjord, and closes everything. The sources and the MQTT bridge are supervised (as the
transports are, fjords/supervision.py): one that fails is logged, counted
(`fjords_task_restarts_total`) and restarted with backoff, and `health()` reports the gateway
degraded meanwhile; only the scheduler task's death ends the daemon (never silently).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from fjords.compile.sql import ast
from fjords.errors import QueryError
from fjords.limits import Limits
from fjords.runtime.fjord import Fjord, RunningQuery
from fjords.runtime.progress import INF, ProgressPolicy
from fjords.runtime.scheduler import DEFAULT_SCHEDULER, make_scheduler
from fjords.schema import Field, Schema
from fjords.supervision import Supervised, SupervisedTask, log_task_failure
from gateway.archive import ArchiveWriter
from gateway.config import Config
from gateway.drops import DropWatch, drop_counts, watch_drops
from gateway.http_api import make_app
from gateway.long_lived import LongLived
from gateway.mqtt_bridge import MqttBridge
from gateway.results import ResultHub
from gateway.sinks.manager import SinkManager
from gateway.sinks.spec import SinkSettings, to_builtins
from gateway.store import QueryStore
from sensors.transports.supervisor import SupervisedTransport

log = logging.getLogger("gateway")

# The stream the loop-detector fleets feed: METR-LA's columns (trace plus station attributes).
TRAFFIC_SCHEMA = Schema(
    [
        Field("time", "float"),
        Field("station", "str"),
        Field("speed", "float", unit="mph"),  # METR-LA loop detectors report mph
        Field("latitude", "float"),
        Field("longitude", "float"),
        Field("segment", "str"),
    ],
    time="time",
)


@dataclass(frozen=True)
class RunLoop:
    """How the Fjord shares the event loop with the transports and the HTTP clients
    (`[runtime]` keys of the same names).

    - `router_slice_rows`: samples a stream router takes per transition, so a burst's first
      rows are published (and, with `yield_for_results`, written) before its last samples are
      routed; larger amortises more per-batch work per sample. Behind by more, a router takes
      a quarter of what waits (at most 4,096), so the Fjord catches up in a few event-loop
      turns however many other tasks share them.
    - `gather_rows`, `gather_ms`: woken by new samples, the scheduler first gives the event loop
      turns while more keep arriving (up to this many rows, this long): a transport that hands
      over one message per turn (MQTT) then still fills router batches when the gateway is
      busy. Off by default (`gather_ms = 0`): over MQTT it did not change batch sizes in
      benchmarks/gateway_load.py, and with an in-process fleet each gathered turn runs every
      mote, halving the Fjord's share of the loop.
    - `yield_for_results`: end a scheduler slice as soon as rows wait for live clients, while
      fewer than `yield_backlog_rows` samples wait in the streams (a burst); behind by more,
      the Fjord keeps its whole slice (yielding after every slice would let it fall further
      behind when many tasks share the loop, e.g. an in-process fleet: latency is then the
      backlog, and only throughput reduces it).
    - `gc_freeze`, `gc_quiet_s`: the objects alive once the daemon has started, and again
      `gc_quiet_s` after the query set or the sensor catalog last changed (and every 500
      changes during a burst of them), are frozen out of the garbage collector's full passes
      (`gateway.long_lived`): with 1,000 queries each pass paused the loop for 130-200 ms.
    """

    router_slice_rows: int = 256
    gather_rows: int = 256
    gather_ms: float = 0.0
    yield_for_results: bool = True
    yield_backlog_rows: int = 2048
    gc_freeze: bool = True
    gc_quiet_s: float = 5.0

    @classmethod
    def from_config(cls, config: Config) -> RunLoop:
        rt = config.runtime
        return cls(
            router_slice_rows=rt.router_slice_rows,
            gather_rows=rt.gather_rows,
            gather_ms=rt.gather_ms,
            yield_for_results=rt.yield_for_results,
            yield_backlog_rows=rt.yield_backlog_rows,
            gc_freeze=rt.gc_freeze,
            gc_quiet_s=rt.gc_quiet_s,
        )


MAX_ROUTER_SLICE = 4096  # the router's own default batch

Source = Callable[["Gateway"], Awaitable[None]]
#: Something that can tell why the gateway is degraded: reasons, empty when all is well.
HealthProvider = Callable[[], list[str]]


def progress_policy(config: Config) -> ProgressPolicy:
    """[runtime] progress settings (fjords.runtime.progress): quiet sensors are released by wall-clock
    idleness (`idle_timeout_s`), never because another sensor ran ahead in event time;
    `max_lag_seconds`, when set, is an extra cap in event time (off by default: it made
    slow-period sensors late whenever others ran ahead)."""
    rt = config.runtime
    return ProgressPolicy(
        idle_timeout_s=rt.idle_timeout_s,
        max_future_s=rt.max_future_seconds,
        max_lag=INF if rt.max_lag_seconds is None else rt.max_lag_seconds,
    )


# Query texts longer than this are parsed in a worker thread, so the event loop keeps serving.
PARSE_IN_THREAD_CHARS = 2048


def _require_pyspark() -> None:
    """`"engine": "spark"` needs the optional [spark] extra; without pyspark the request is the
    client's to fix (install it), so this is a QueryError (HTTP 400) that names the extra."""
    from fjords.errors import EngineUnavailable

    try:
        import pyspark  # noqa: F401
    except ImportError as e:
        raise EngineUnavailable('"engine": "spark"', "spark", "pyspark") from e


def scheduler_name(config: Config) -> str:
    """[runtime] scheduler: "ticket" (the default: PRIORITY n sets a query's share when the
    gateway is saturated) or "round-robin" (every ready operator takes turns; PRIORITY is kept
    but has no effect)."""
    return config.runtime.scheduler or DEFAULT_SCHEDULER


class Gateway:
    def __init__(
        self,
        config: Config | None = None,
        limits: Limits | None = None,
        scheduler: str | None = None,
        sinks: SinkSettings | None = None,
        run_loop: RunLoop | None = None,
    ) -> None:
        """`sinks`: the result sinks' limits and directory (default: `[sinks]` when the
        configuration has it, the files under `<state dir>/sinks`); `run_loop`: how the Fjord
        shares the event loop (`RunLoop`)."""
        self.config = config or Config()
        self.run_loop = run_loop or RunLoop.from_config(self.config)
        self.long_lived = LongLived(self.run_loop.gc_quiet_s, enabled=self.run_loop.gc_freeze)
        if limits is None:
            limits = Limits.from_mapping(msgspec.structs.asdict(self.config.limits))
        self.scheduler_name = scheduler or scheduler_name(self.config)
        self.fjord = Fjord(
            make_scheduler(self.scheduler_name),
            queue_bound=self.config.queue_bound,
            progress=progress_policy(self.config),
            limits=limits,
            share_group_filters=self.config.runtime.share_group_filters,
        )
        # Failed queries (an error at run time, or a saved query that no longer plans): listed
        # with their error until deleted. id -> {"sql", "error", "options"}.
        self.failed_queries: dict[str, dict[str, Any]] = {}
        self.fjord.on_query_failed.append(self._query_failed)
        self.long_lived.prepare.append(self.fjord.build_indexes)
        self.hub = ResultHub(
            self.config.http.client_buffer_rows,
            ring_rows=self.config.http.replay_rows,
        )
        self.token = self.config.http.token
        self.store = QueryStore(self.config.state_dir) if self.config.state_dir else None
        self.options: dict[str, dict[str, Any]] = {}
        self.spark_jobs: dict[str, str] = {}  # query id -> SQL, for queries running on Spark
        self._spark: Any = None  # gateway.spark.supervisor.SparkQueries, started on first use
        self.proxies: Any = None  # proxies.manager.ProxyManager, attached by the sensor source
        self.sources: list[tuple[str, Source]] = []
        self._tasks: set[asyncio.Task] = set()
        #: supervised background work by name (sources, the MQTT bridge), restarted on failure
        self.supervised: dict[str, Supervised] = {}
        #: supervised links whose health and counters are reported (the sensor transports)
        self.links: list[SupervisedTransport] = []
        self.drop_watch = DropWatch(lambda: drop_counts(self))
        self.health_providers: list[HealthProvider] = [self.drop_watch.health]
        self._stack = contextlib.AsyncExitStack()
        self._runner: web.AppRunner | None = None
        self.failed = asyncio.Event()
        self.address: tuple[str, int] | None = None
        self.fjord.add_stream("traffic", TRAFFIC_SCHEMA, sensor_field="station")
        #: plain MQTT devices' streams ([[mqtt.streams]]), fed by sensors.transports.plain_mqtt
        self.plain_streams = self.config.plain_streams()
        for spec in self.plain_streams:
            fields = [Field(n, t, unit=u) for n, t, u in spec.field_types()]
            self.fjord.add_stream(spec.name, Schema(fields, time="time"), sensor_field="sensor")
        for name, path in self.config.tables.items():
            self.fjord.add_table(name, path)
        arch = self.config.archive
        self.mqtt = MqttBridge(self, self.config.mqtt) if self.config.mqtt is not None else None
        self.sinks = SinkManager(
            self.hub,
            SinkSettings.from_config(self.config) if sinks is None else sinks.resolved(self.config),
            self.config.mqtt,
        )
        self.health_providers.append(self.sinks.health)
        #: every stream's archive (traffic and the plain MQTT streams), the Spark jobs' input
        self.archives: dict[str, ArchiveWriter] = {
            name: ArchiveWriter(
                self.fjord,
                name,
                arch.dir,
                segment_rows=arch.segment_rows,
                segment_seconds=arch.segment_seconds,
            )
            for name in self.fjord.streams
            if arch.dir
        }
        self.archive = self.archives.get("traffic")

    # -- queries ---------------------------------------------------------------------------
    def add_query(
        self,
        sql: str,
        options: dict[str, Any] | None = None,
        query_id: str | None = None,
        persist: bool = True,
        tree: ast.Query | None = None,
    ) -> RunningQuery:
        """Plan (no side effects), save, then install: a query is saved and running, or neither.
        `tree` is `sql` already parsed (register parses long texts off the event loop)."""
        qid = query_id or uuid.uuid4().hex[:12]
        if qid in self.failed_queries or qid in self.spark_jobs:
            raise QueryError(f"query id {qid!r} is already in use")
        options = self._checked_sinks(options)
        prepared = self.fjord.prepare(sql if tree is None else tree, query_id=qid)
        prepared.sql = sql
        if persist and self.store is not None:
            try:
                self.store.save(qid, sql, dict(options or {}))
            except Exception as e:  # e.g. text SQLite cannot store: nothing is installed
                log.error("could not save query %s: %r", qid, e)
                raise QueryError(
                    f"the query could not be saved, so it was not installed: {e}"
                ) from e
        try:
            rq = self.fjord.add_query(prepared)
        except Exception:
            if persist and self.store is not None:
                self.store.delete(qid)
            raise
        cols = list(rq.columns)
        self._open_ring(qid, cols)
        rq.sink.add_batch_callback(self.hub.publisher(qid, cols))
        self.options[qid] = dict(options or {})
        self._attach_sinks(qid, lambda: _group_columns(rq.ast, cols))
        if self.mqtt is not None:
            self.mqtt.sync_queries()
        if self.proxies is not None:
            self.proxies.queries_changed()
        self.long_lived.changed()
        log.info("query %s added: %s", qid, sql)
        return rq

    def _checked_sinks(self, options: dict[str, Any] | None) -> dict[str, Any]:
        """`options` with its sinks checked and complete (defaults filled in, as saved)."""
        options = dict(options or {})
        if options.get("sinks"):
            options["sinks"] = to_builtins(self.sinks.validate(options["sinks"]))
        else:
            options.pop("sinks", None)
        return options

    def _open_ring(self, qid: str, columns: list[str] | None = None) -> None:
        """The query's replay ring; with a store its row ids go on after the last run's."""
        store = self.store
        if store is None:
            self.hub.open_ring(qid, columns=columns)
            return

        def lease(below: int) -> None:
            try:
                store.lease_row_ids(qid, below)
            except Exception as e:  # noqa: BLE001 - ids may repeat after a restart, no more
                log.error("could not save the row ids of query %s: %r", qid, e)

        self.hub.open_ring(qid, store.first_row_id(qid), columns, lease)

    def _attach_sinks(self, qid: str, group_columns: Callable[[], tuple[str, ...]]) -> None:
        specs = self.options.get(qid, {}).get("sinks")
        if not specs:
            return
        try:
            self.sinks.attach(qid, specs, group_columns)
        except QueryError as e:  # checked before saving: only a directory that cannot be made
            log.error("query %s: its sinks could not start: %s", qid, e)

    # -- either engine (what the HTTP API calls) -------------------------------------------------
    def query_ids(self) -> list[str]:
        return [*self.fjord.queries, *self.spark_jobs, *self.failed_queries]

    def has_query(self, qid: str) -> bool:
        return qid in self.fjord.queries or qid in self.spark_jobs or qid in self.failed_queries

    async def register(
        self,
        sql: str,
        options: dict[str, Any] | None = None,
        query_id: str | None = None,
        persist: bool = True,
    ) -> str:
        """Install a query on the engine its options name ("fjords" by default); returns its id."""
        options = dict(options or {})
        if options.get("engine") == "spark":
            return await self.add_spark_query(sql, options, query_id=query_id, persist=persist)
        parsed = await self._parse_off_loop(sql)
        tree = None if isinstance(parsed, str) else parsed
        return self.add_query(sql, options, query_id=query_id, persist=persist, tree=tree).id

    async def end_query(self, qid: str) -> None:
        if qid in self.spark_jobs:
            self.sinks.detach(qid)
            await self._spark.stop(qid)
            del self.spark_jobs[qid]
            self.hub.close_query(qid)
            self.options.pop(qid, None)
            if self.store is not None:
                self.store.delete(qid)
            log.info("spark query %s removed", qid)
        else:
            self.remove_query(qid)

    async def add_spark_query(
        self, sql: str, options: dict[str, Any], query_id: str | None = None, persist: bool = True
    ) -> str:
        """Run the query on Spark over the archive (Structured Streaming, supervised). Returns
        at once: the job starts in the background (`describe_query` says `starting`, then
        `running`, or `failed` with the reason); a query that does not plan is refused now."""
        from fjords.errors import QueryError

        _require_pyspark()  # a plain install: a 400 naming the extra, not a 500 from the JVM side
        if self.config.archive.dir is None:
            raise QueryError(
                '"engine": "spark" reads the gateway\'s archive: configure [archive] dir'
            )
        from fjords.compile.sql.parser import parse

        tree = parse(sql)  # a bad text (a lone surrogate...) is refused before anything is saved
        plan = self.fjord.plan(tree)  # one dialect: what the Fjord refuses, Spark would too
        columns = list(plan.columns)
        options = self._checked_sinks(options)
        spark = await self._spark_queries()
        qid = query_id or uuid.uuid4().hex[:12]
        if self.has_query(qid):
            raise QueryError(f"query id {qid!r} is already in use")
        hub = self.hub
        # Saved first, then started: a job is saved and starting, or neither.
        if persist and self.store is not None:
            try:
                self.store.save(qid, sql, options)
            except Exception as e:
                raise QueryError(f"the query could not be saved, so it was not started: {e}") from e
        self.spark_jobs[qid] = sql
        self.options[qid] = options
        self._open_ring(qid, columns)
        spark.launch(
            qid,
            sql,
            stream=plan.stream,  # its own stream's archive (and a join's second stream's)
            right_stream=getattr(getattr(plan.bound, "right", None), "stream", None),
            on_rows=lambda rows: hub.publish(qid, rows),
            on_failed=lambda reason, ran: self._spark_failed(qid, reason, ran),
        )
        self._attach_sinks(qid, lambda: _group_columns(tree, columns))
        log.info("spark query %s starting: %s", qid, sql)
        return qid

    def _spark_failed(self, qid: str, reason: str, ran: bool) -> None:
        """A Spark job could not start, or failed for good: its clients are told. One that ran
        and failed is remembered as failed across restarts (as a failed Fjord query is); one
        that could not start (an archive without segments yet, the JVM...) is tried again at
        the next start, as a saved query that does not restore is."""
        if qid not in self.spark_jobs:
            return
        self.hub.fail_query(qid, reason)
        if ran and self.store is not None:
            try:
                self.store.mark_failed(qid, reason)
            except Exception as e:  # noqa: BLE001 - the failure is still reported live
                log.error("could not record the failure of query %s: %r", qid, e)

    async def _spark_queries(self) -> Any:
        if self._spark is None:
            _require_pyspark()
            from gateway.spark.session import SparkConfig
            from gateway.spark.supervisor import SparkQueries

            state = self.config.state_dir or str(
                Path(self.config.archive.dir or ".") / ".spark-state"
            )
            self._spark = await SparkQueries(
                SparkConfig.from_mapping(self.config.spark),
                archive_root=self.config.archive.dir,
                state_dir=state,
                tables=self.config.tables,
            ).__aenter__()
        return self._spark

    def remove_query(self, qid: str) -> None:
        self.long_lived.changed(removed=True)
        self.sinks.detach(qid)
        if self.failed_queries.pop(qid, None) is not None:
            self.fjord.failed.pop(qid, None)
            self.hub.close_query(qid)
            if self.store is not None:
                self.store.delete(qid)
            log.info("failed query %s removed", qid)
            return
        self.fjord.remove_query(qid)
        self.hub.close_query(qid)
        self.options.pop(qid, None)
        if self.store is not None:
            self.store.delete(qid)
        if self.mqtt is not None:
            self.mqtt.sync_queries()
        if self.proxies is not None:
            self.proxies.queries_changed()
        log.info("query %s removed", qid)

    def _query_failed(self, qid: str, reason: str) -> None:
        """The Fjord stopped a query (an error in its operators): keep it listed as failed,
        remembered across restarts, and tell its clients and its MQTT topic why."""
        options = self.options.pop(qid, {})
        sql = self.fjord.failed[qid].sql if qid in self.fjord.failed else None
        self.failed_queries[qid] = {"sql": sql, "error": reason, "options": options}
        self.hub.fail_query(qid, reason)
        if self.store is not None:
            try:
                self.store.mark_failed(qid, reason)
            except Exception as e:  # noqa: BLE001 - the failure is still reported live
                log.error("could not record the failure of query %s: %r", qid, e)
        if self.mqtt is not None:
            if options.get("publish") == "mqtt" and hasattr(self.mqtt, "query_failed"):
                self.mqtt.query_failed(qid, reason)
            self.mqtt.sync_queries()
        if self.proxies is not None:
            self.proxies.queries_changed()

    def _failed_record(
        self, qid: str, sql: str, error: str, options: dict[str, Any] | None = None
    ) -> None:
        """A query listed as failed without running (its saved failure, or it does not plan)."""
        self.failed_queries[qid] = {"sql": sql, "error": error, "options": dict(options or {})}
        self.hub.fail_query(qid, error)

    def describe_query(self, qid: str) -> dict[str, Any]:
        failed = self.failed_queries.get(qid)
        if failed is not None:
            rq = self.fjord.failed.get(qid)
            d = (
                rq.describe()
                if rq is not None
                else {
                    "id": qid,
                    "sql": failed["sql"],
                    "stream": "",
                    "shape": "failed",
                    "columns": [],
                    "shared": [],
                    "operators": [],
                    "rows": 0,
                }
            )
            d.update(
                state="failed",
                error=failed["error"],
                options=failed["options"],
                subscribers=0,
                demand={},
                sinks=self.sinks.describe(qid),
            )
            return d
        if qid in self.spark_jobs:
            st = self._spark.status(qid)
            state = st.get("state")
            error = (st.get("error") or st.get("last_error")) if state == "failed" else None
            return {
                "id": qid,
                "sql": self.spark_jobs[qid],
                "stream": "traffic",
                "shape": "spark streaming job",
                "columns": list(st.get("columns", [])),
                "operators": [],
                "rows": st.get("results_total", 0),
                "options": self.options.get(qid, {}),
                "subscribers": self.hub.subscribers(qid),
                "demand": {},
                "spark": {k: v for k, v in st.items() if k != "columns"},
                # starting (the job is being compiled and started), running, or failed
                "state": state if state in ("starting", "failed") else "running",
                "error": error,
                "sinks": self.sinks.describe(qid),
            }
        rq = self.fjord.queries[qid]
        d = rq.describe()
        d["options"] = self.options.get(qid, {})
        d["subscribers"] = self.hub.subscribers(qid)
        d["demand"] = {
            "sample_period_s": rq.demand.sample_period_s,
            "lifetime_s": rq.demand.lifetime_s,
            "fields": list(rq.demand.fields),
        }
        d["sinks"] = self.sinks.describe(qid)
        return d

    async def explain_async(self, sql: str) -> dict[str, Any]:
        """`explain`, with a long text parsed in a worker thread (the event loop keeps serving)."""
        return self.explain(await self._parse_off_loop(sql))

    async def _parse_off_loop(self, sql: str) -> str | ast.Query:
        if len(sql) <= PARSE_IN_THREAD_CHARS:
            return sql
        from fjords.compile.sql.parser import parse

        self.fjord.limits.check("max_sql_chars", len(sql), "query text length (characters)")
        return await asyncio.to_thread(parse, sql)

    def explain(self, sql: str | ast.Query) -> dict[str, Any]:
        """The plan, what it would share, and which sensors would change program or rate (with
        the cost model's power and battery life before and after): nothing is installed."""
        tree = self.fjord._parse(sql)[1]
        plan = self.fjord.plan(tree)
        out = self.fjord.explain(plan)
        out["priority"] = tree.tickets
        out["sensor_changes"] = [] if self.proxies is None else self.proxies.what_if(plan.demand)
        return out

    # -- sensors ---------------------------------------------------------------------------
    def attach_proxies(self, manager: Any) -> None:
        """The sensor proxies: they follow the queries' demand from now on."""
        self.proxies = manager
        # A sensor joining or leaving changes the long-lived set as a query does.
        manager.on_catalog_change = lambda removed: self.long_lived.changed(removed=removed)
        manager.queries_changed()

    def sensors(self) -> list[dict[str, Any]]:
        if self.proxies is None:
            return []
        from gateway.sensors_view import sensors_catalog

        return sensors_catalog(self.proxies)

    def sensor(self, sid: str) -> dict[str, Any] | None:
        return next((s for s in self.sensors() if str(s.get("id")) == sid), None)

    def hub_stats(self) -> dict[str, Any]:
        return {
            "missed": self.hub.missed(),
            "task_restarts": self.task_restarts(),
            "links": [(link.name, link.stats) for link in self.links],
        }

    # -- health ------------------------------------------------------------------------------
    def add_health_provider(self, provider: HealthProvider) -> None:
        """Another reason the gateway can be degraded (called on every /healthz)."""
        self.health_providers.append(provider)

    def add_link(self, link: SupervisedTransport) -> None:
        """A transport whose health and counters the gateway reports."""
        self.links.append(link)

    def health(self) -> dict[str, Any]:
        """`{"status": "ok" | "degraded", "reasons": [...]}`: degraded while a supervised task or
        link is down (or any health provider names a reason). Liveness stays HTTP 200."""
        reasons: list[str] = []
        for sup in (*self.supervised.values(), *self.links):
            reasons += sup.health()
        for provider in self.health_providers:
            try:
                reasons += provider()
            except Exception as exc:  # a broken provider must not break /healthz
                reasons.append(f"health provider {provider!r} failed: {exc!r}")
        return {"status": "degraded" if reasons else "ok", "reasons": reasons}

    def task_restarts(self) -> dict[str, int]:
        """Unexpected failures per supervised task and link (each one restarted)."""
        return {name: sup.stats.restarts for name, sup in self.supervised.items()} | {
            link.name: link.stats.restarts for link in self.links
        }

    # -- lifecycle -------------------------------------------------------------------------
    def add_source(self, name: str, source: Source) -> None:
        """A coroutine that feeds the Fjord (a transport with its proxies, a replay...)."""
        self.sources.append((name, source))

    def _spawn(self, name: str, coro: Awaitable[None]) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        log_task_failure(task, logger=log)
        if not task.cancelled() and task.exception() is not None:
            self.failed.set()

    async def _supervise(self, name: str, sup: Supervised) -> None:
        self.supervised[name] = sup
        await self._stack.enter_async_context(sup)

    async def __aenter__(self) -> Gateway:
        await self.sinks.__aenter__()
        await self._restore_queries()
        for archive in self.archives.values():
            await archive.__aenter__()
        self._share_the_loop()
        self.long_lived.freeze()  # the restored queries, the proxies' and transports' state
        self._spawn("fjord", self.fjord.run())
        self._spawn("long-lived", self.long_lived.run())
        if self.mqtt is not None:
            await self._supervise("mqtt-bridge", self.mqtt)
        for name, source in self.sources:
            await self._supervise(
                name, SupervisedTask(f"source {name}", lambda source=source: source(self))
            )
        await self._supervise("drop-watch", SupervisedTask("drop watch", self._watch_drops))
        return self

    def _share_the_loop(self) -> None:
        """The scheduler's side of `RunLoop`: router slices (sized at each scheduler slice,
        for every stream, also those added later), gathering input, yielding for results."""
        rl, sched, streams = self.run_loop, self.fjord.scheduler, self.fjord.streams
        least = max(1, rl.router_slice_rows)
        for stream in streams.values():
            stream.router.batch = least

        def waiting() -> int:
            return sum(len(s.queue) for s in streams.values())

        def size_slices() -> None:
            for stream in streams.values():
                stream.router.batch = max(least, min(MAX_ROUTER_SLICE, len(stream.queue) // 4))

        sched.before_slice = size_slices
        if rl.gather_ms > 0:
            sched.gather = waiting
            sched.gather_rows = rl.gather_rows
            sched.gather_seconds = rl.gather_ms / 1000.0
        if rl.yield_for_results:
            flush_due, most = self.hub.flush_due, rl.yield_backlog_rows

            def results_waiting() -> bool:  # (the flag stays up while the Fjord is behind)
                return waiting() < most and flush_due()

            sched.yield_when = results_waiting

    def intake_full(self) -> bool:
        """Whether the transports should stop reading for now (they then leave the data in
        the broker): a stream's queue or an archive's input is half full, or an archive's
        writer is behind. Reading on would only move the backlog into these bounded queues,
        where it is dropped (counted)."""
        for s in self.fjord.streams.values():
            if len(s.queue) * 2 >= s.queue.bound:
                return True
        for a in self.archives.values():
            if a.op.blocked or len(a.input) * 2 >= a.input.bound:
                return True
        return False

    async def _watch_drops(self) -> None:
        await watch_drops(self.drop_watch)

    async def start_http(self, host: str | None = None, port: int | None = None) -> tuple[str, int]:
        app = make_app(self, max_body=self.config.http.max_body_bytes)
        # Streaming clients end when their subscriptions close; one stuck writing to a client that
        # never reads is given 2 s before the server closes it.
        self._runner = web.AppRunner(
            app, handle_signals=False, access_log=None, shutdown_timeout=2.0
        )
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            host or self.config.http.host,
            self.config.http.port if port is None else port,
        )
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.address = sock.getsockname()[:2]
        log.info("HTTP API on http://%s:%d", *self.address)
        return self.address

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()  # sources and the bridge stop first: intake ends
        for t in list(self._tasks):
            if t.get_name() != "fjord":
                t.cancel()
        await asyncio.gather(
            *[t for t in self._tasks if t.get_name() != "fjord"], return_exceptions=True
        )
        # Drain what was already pushed, flush the archive, then stop the scheduler.
        self.fjord.run_until_idle()
        for archive in self.archives.values():
            await archive.__aexit__(None, None, None)
        await self.sinks.__aexit__(None, None, None)  # after the drain: they get its rows
        self.fjord.stop()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._runner is not None:
            self.hub.close_all()
            await self._runner.cleanup()
        if self._spark is not None:
            await self._spark.__aexit__(None, None, None)
        if self.store is not None:
            self.store.close()
        self.long_lived.release()

    async def _restore_queries(self) -> None:
        """Saved queries come back; one that failed before, or no longer plans, comes back
        listed as failed with its error (never a crash loop)."""
        restored = set()
        if self.store is not None:
            for qid, sql, options, error in self.store.load_all():
                restored.add(sql)
                if error is not None:
                    self._failed_record(qid, sql, error, options)
                    continue
                try:
                    await self.register(sql, options, query_id=qid, persist=False)
                except Exception as e:  # a stored query may no longer plan (e.g. a table is gone)
                    log.error("could not restore query %s (%s): %s", qid, sql, e)
                    self._failed_record(qid, sql, f"could not restore: {e}", options)
        for q in self.config.queries:
            if q["sql"] not in restored and not self.has_query(q.get("id") or ""):
                options = {k: v for k, v in q.items() if k not in ("sql", "id")}
                try:
                    self.add_query(q["sql"], options, query_id=q.get("id"))
                except QueryError as e:
                    qid = q.get("id") or uuid.uuid4().hex[:12]
                    log.error("configured query %s does not plan: %s", qid, e)
                    self._failed_record(qid, q["sql"], str(e), options)


def _group_columns(tree: ast.Query, columns: list[str]) -> tuple[str, ...]:
    """The result columns that name a group (its GROUP BY columns), for the MQTT sink."""
    from gateway.home_assistant import entity_shape

    return entity_shape(tree, columns, None).group_columns if columns else ()
