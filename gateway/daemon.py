"""The gateway daemon: one asyncio process hosting the Fjord, its sources, and the HTTP API.

`Gateway` is an async context manager that owns everything it starts: the scheduler task, the
sources feeding the streams, the HTTP site and the query store. Leaving it stops intake, drains
the Fjord, and closes everything. The sources and the MQTT bridge are supervised (as the
transports are, fjords/supervision.py): one that fails is logged, counted
(`fjords_task_restarts_total`) and restarted with backoff, and `health()` reports the gateway
degraded meanwhile; only the scheduler task's death ends the daemon (never silently).

The parts it wires together live by job: the queries on either engine (gateway/queries.py), how
the Fjord is built and shares the event loop (gateway/run_loop.py), results to clients and sinks
(gateway/results.py, gateway/sinks/), the archive (gateway/archive.py).

The sensors sample for every consumer: the Fjord's queries, and the standing demands
(`demands`) of the archive (`[archive] sample_period_s`) and of the Spark queries, which the
proxies fold in with the queries'.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from fjords.compile.sql import ast
from fjords.errors import EngineFailed, FjordsError, QueryError
from fjords.limits import Limits
from fjords.runtime.fjord import RunningQuery
from fjords.schema import Field, Schema
from fjords.snapshot import AggregateSource, Snapshots
from fjords.supervision import Supervised, SupervisedTask, log_task_failure
from gateway.archive import CONSUMER as ARCHIVE_CONSUMER
from gateway.archive import ArchiveWriter
from gateway.archive_layout import Storage
from gateway.archive_reader import ArchiveHistory
from gateway.compaction import CompactionError, CompactionStats, run_scheduled
from gateway.config import Config, ConfigError
from gateway.drops import DropWatch, drop_counts, watch_drops
from gateway.gc_freeze import HeapFreezer
from gateway.history import make_histories
from gateway.http_api import GUARD_KEY, make_app
from gateway.http_guard import GuardedSite, check_fd_limit
from gateway.mqtt_bridge import MqttBridge
from gateway.queries import QueryRegistry, parse_off_loop, require_pyspark
from gateway.results import ResultHub
from gateway.run_loop import RunLoop, loop_sharing, make_engine, scheduler_name
from gateway.sinks.manager import SinkManager
from gateway.sinks.spec import SinkSettings
from gateway.store import QueryStore
from proxies.standing import StandingDemands
from sensors.sealing import GatewayAuth
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
# Vehicles reconstructed from a loop pair's events (paper section 5.1): speed mph, length ft.
VEHICLES_SCHEMA = Schema(
    [
        Field("time", "float"),
        Field("pair", "str"),
        Field("speed", "float"),
        Field("length", "float"),
    ],
    time="time",
)
#: The streams every gateway has, whatever its devices.
BUILTIN_STREAMS = {"traffic": TRAFFIC_SCHEMA, "vehicles": VEHICLES_SCHEMA}
#: What the built-in streams' columns are known to nest as (coarse to fine): METR-LA's stations
#: each lie on one freeway segment, and a mote's hello says which.
BUILTIN_HIERARCHIES = {"traffic": ("segment", "station")}


Source = Callable[["Gateway"], Awaitable[None]]
#: Something that can tell why the gateway is degraded: reasons, empty when all is well.
HealthProvider = Callable[[], list[str]]


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
        self.heap_freezer = HeapFreezer(self.run_loop.gc_quiet_s, enabled=self.run_loop.gc_freeze)
        self.scheduler_name = scheduler or scheduler_name(self.config)
        self.engine = make_engine(self.config, self.scheduler_name, limits)
        self.fjord = self.engine.fjord
        self.heap_freezer.prepare.append(self.fjord.build_indexes)
        self.hub = ResultHub(
            self.config.http.client_buffer_rows,
            ring_rows=self.config.http.replay_rows,
        )
        self.token = self.config.http.token
        self.store = QueryStore(self.config.state_dir) if self.config.state_dir else None
        self.proxies: Any = None  # proxies.manager.ProxyManager, attached by the sensor source
        #: what consumers other than the Fjord's queries ask of the sensors (the archive's, the
        #: Spark queries'), by name: the proxies are made with it
        self.demands = StandingDemands()
        self.sources: list[tuple[str, Source]] = []
        self._tasks: set[asyncio.Task] = set()
        #: supervised background work by name (sources, the MQTT bridge), restarted on failure
        self.supervised: dict[str, Supervised] = {}
        #: supervised links whose health and counters are reported (the sensor transports)
        self.links: list[SupervisedTransport] = []
        #: verifies the motes' messages ([sensors] keys_file); set by the sensor source
        self.auth: GatewayAuth | None = None
        self.drop_watch = DropWatch(lambda: drop_counts(self))
        self.health_providers: list[HealthProvider] = [self.drop_watch.health, self.sensor_health]
        self._stack = contextlib.AsyncExitStack()
        self._runner: web.AppRunner | None = None
        self.failed = asyncio.Event()
        self.address: tuple[str, int] | None = None
        self.fjord.add_stream("traffic", TRAFFIC_SCHEMA, sensor_field="station")
        self.fjord.add_stream("vehicles", VEHICLES_SCHEMA, sensor_field="pair")
        #: plain MQTT devices' streams ([[mqtt.streams]]), fed by sensors.transports.plain_mqtt
        self.plain_streams = self.config.plain_streams()
        for spec in self.plain_streams:
            fields = [Field(n, t, unit=u) for n, t, u in spec.field_types()]
            self.fjord.add_stream(spec.name, Schema(fields, time="time"), sensor_field="sensor")
        for name, path in self.config.tables.items():
            try:
                self.fjord.add_table(name, path)
            except (FjordsError, OSError, ValueError) as e:
                raise ConfigError(f"[tables] {name}: {e}") from None
        self._declare_hierarchies()
        arch = self.config.archive
        #: who this gateway is ([gateway] id): in every archived row, its directories, /status
        self.gateway_id: str = self.config.gateway.id
        storage: Storage | None = None
        if arch.dir:
            try:
                storage = Storage(arch.dir)
            except ValueError as e:
                raise ConfigError(f"[archive] dir: {e}") from None
        self.mqtt = MqttBridge(self, self.config.mqtt) if self.config.mqtt is not None else None
        self.sinks = SinkManager(
            self.hub,
            SinkSettings.from_config(self.config) if sinks is None else sinks.resolved(self.config),
            self.config.mqtt,
        )
        self.health_providers.append(self.sinks.health)
        if self.config.http.port:  # no webhook to the gateway's own API (and start_http's port)
            self.sinks.policy.own_ports.add(self.config.http.port)
        self.registry = QueryRegistry(
            self.engine,
            self.hub,
            self.sinks,
            self.store,
            self.config,
            self.heap_freezer,
            demands=self.demands,
            on_change=self._queries_changed,
            on_failed=self._query_failed,
        )
        self.health_providers.append(self.registry.spark_health)
        #: every stream's archive (traffic and the plain MQTT streams), the Spark jobs' input
        self.archives: dict[str, ArchiveWriter] = {
            name: ArchiveWriter(
                self.fjord,
                name,
                storage,
                gateway=self.gateway_id,
                segment_rows=arch.segment_rows,
                segment_seconds=arch.segment_seconds,
                max_pending_rows=arch.max_pending_rows,
                shutdown_timeout_s=arch.shutdown_timeout_s,
            )
            for name in self.fjord.streams
            if storage is not None
        }
        self.health_providers += [a.health for a in self.archives.values()]
        #: the scheduled compaction's counters (`[archive] compact_every_s`; None: not scheduled)
        self.compaction_stats: CompactionStats | None = (
            CompactionStats() if arch.dir and arch.compact_every_s else None
        )
        #: ends a compaction run between two rewrites when the daemon stops
        self._compaction_stop = threading.Event()
        self.archive = self.archives.get("traffic")
        #: the archives answer the part of a snapshot older than the history holds completely
        self.archive_history = ArchiveHistory(self.archives) if self.archives else None
        #: every stream's transient segment, what snapshots answer from ([history])
        self.histories = make_histories(self.fjord, self.config.history, self.archive_history)
        self.snapshots = Snapshots(self.engine, self.histories, historical=self.archive_history)
        if arch.sample_period_s != 0:  # 0: the archive holds what the queries take
            self.demands.set(
                ARCHIVE_CONSUMER, [a.demand(arch.sample_period_s) for a in self.archives.values()]
            )

    def _declare_hierarchies(self) -> None:
        """The built-in streams' hierarchies and `[[hierarchies]]` (checked at load), so that
        DRILLDOWN is checked against them on either engine."""
        catalog = self.fjord.catalog
        for stream, levels in BUILTIN_HIERARCHIES.items():
            catalog.add_hierarchy(stream, levels, f"the built-in {stream} stream")
        for i, h in enumerate(self.config.hierarchies):
            try:
                catalog.add_hierarchy(h.stream, h.levels, f"[[hierarchies]] #{i + 1}")
            except QueryError as e:
                raise ConfigError(str(e)) from None

    # -- queries (gateway/queries.py) --------------------------------------------------------
    @property
    def options(self) -> dict[str, dict[str, Any]]:
        """Each running query's options, by id (the MQTT bridge publishes `"publish": "mqtt"`)."""
        return self.registry.options

    def query_ids(self) -> list[str]:
        return self.registry.query_ids()

    def has_query(self, qid: str) -> bool:
        return self.registry.has_query(qid)

    def add_query(
        self,
        sql: str,
        options: dict[str, Any] | None = None,
        query_id: str | None = None,
        persist: bool = True,
        tree: ast.Statement | None = None,
    ) -> RunningQuery:
        """Install a query on the Fjord: planned, saved, then installed (`QueryRegistry`)."""
        return self.registry.add_query(sql, options, query_id, persist, tree)

    async def register(
        self,
        sql: str,
        options: dict[str, Any] | None = None,
        query_id: str | None = None,
        persist: bool = True,
        since: float | None = None,
    ) -> str:
        """Install a query on the engine its options name ("fjords" by default); returns its id;
        `since`: see QueryRegistry.register."""
        return await self.registry.register(sql, options, query_id, persist, since)

    async def add_spark_query(
        self, sql: str, options: dict[str, Any], query_id: str | None = None, persist: bool = True
    ) -> str:
        """Start the query as a Spark job over the archive; returns its id at once."""
        return await self.registry.add_spark_query(sql, options, query_id, persist)

    async def end_query(self, qid: str) -> None:
        await self.registry.end_query(qid)

    def remove_query(self, qid: str) -> None:
        self.registry.remove_query(qid)

    def describe_query(self, qid: str) -> dict[str, Any]:
        return self.registry.describe_query(qid)

    async def explain_async(self, sql: str) -> dict[str, Any]:
        """`explain`, with a long text parsed in a worker thread (the event loop keeps serving)."""
        return self.explain(await parse_off_loop(self.engine, sql))

    def explain(self, sql: str | ast.Statement) -> dict[str, Any]:
        """The plan, what it would share, and which sensors would change program or rate (with
        the cost model's power and battery life before and after): nothing is installed."""
        tree = self.engine.parse(sql)[1]
        plan = self.engine.plan(tree)
        out = self.engine.explain(plan)
        out["priority"] = tree.tickets
        out["sensor_changes"] = [] if self.proxies is None else self.proxies.what_if(plan.demand)
        return out

    def snapshot(self, sql: str, *, partial: bool = False) -> dict[str, Any]:
        """A snapshot query's answer now (fjords.snapshot), as the HTTP API returns it."""
        self.fjord.run_until_idle()  # what arrived before the question is part of the answer
        return self.snapshots.answer(sql, partial=partial).to_dict()

    async def snapshot_async(
        self, sql: str, *, partial: bool = False, engine: str | None = None
    ) -> dict[str, Any]:
        """`snapshot`; with `engine: "spark"`, the archive's part aggregated per sensor key by a
        Spark batch job (gateway/spark/snapshot.py) in a worker thread, the event loop serving
        meanwhile; the history's part is taken before the job starts."""
        if engine != "spark":
            return self.snapshot(sql, partial=partial)
        if self.archive_history is None:
            raise QueryError(
                '"engine": "spark" answers the archive\'s part of a snapshot: configure '
                "[archive] dir"
            )
        require_pyspark()
        self.fjord.run_until_idle()
        job = self.snapshots.begin(sql, partial=partial, aggregates=self._spark_aggregates())
        try:
            await asyncio.to_thread(job.run)
        except QueryError:
            raise
        except Exception as e:  # Spark raises many kinds; each is answered (502) and named
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            log.warning("a snapshot's Spark job failed: %s", first)
            raise EngineFailed(f"the Spark job for the archive's part failed: {first}") from e
        return job.finish().to_dict()

    def _spark_aggregates(self) -> AggregateSource:
        from gateway.spark.session import SparkConfig, get_session
        from gateway.spark.snapshot import SparkArchiveAggregates

        assert self.archive_history is not None
        config = SparkConfig.from_mapping(self.config.spark)
        return SparkArchiveAggregates(self.archive_history, lambda: get_session(config))

    def _queries_changed(self) -> None:
        """The MQTT bridge follows the published queries, the proxies the queries' demand."""
        if self.mqtt is not None:
            self.mqtt.sync_queries()
        if self.proxies is not None:
            self.proxies.queries_changed()

    def _query_failed(self, qid: str, reason: str, options: dict[str, Any]) -> None:
        """A published query's MQTT topic is told why it failed; then the set has changed."""
        if self.mqtt is not None:
            if options.get("publish") == "mqtt" and hasattr(self.mqtt, "query_failed"):
                self.mqtt.query_failed(qid, reason)
        self._queries_changed()

    # -- sensors ---------------------------------------------------------------------------
    def attach_proxies(self, manager: Any) -> None:
        """The sensor proxies: they follow the queries' demand from now on."""
        self.proxies = manager
        manager.queries_changed()

    def sensors(self) -> list[dict[str, Any]]:
        if self.proxies is None:
            return []
        from gateway.sensors_view import sensors_catalog

        return sensors_catalog(self.proxies, is_query=self.has_query)

    def sensors_page(
        self, *, limit: int, offset: int = 0, status: str | None = None
    ) -> tuple[list[dict[str, Any]], int]:
        """One page of the catalog (by id) and the number of sensors in all (with `status`)."""
        if self.proxies is None:
            return [], 0
        from gateway.sensors_view import sensors_page

        return sensors_page(
            self.proxies, limit=limit, offset=offset, status=status, is_query=self.has_query
        )

    def sensor(self, sid: str) -> dict[str, Any] | None:
        if self.proxies is None or sid not in self.proxies.proxies:
            return None
        from gateway.sensors_view import catalog_entry

        return catalog_entry(self.proxies, sid, is_query=self.has_query)

    def hub_stats(self) -> dict[str, Any]:
        return {
            "missed": self.hub.missed(),
            "task_restarts": self.task_restarts(),
            "links": [(link.name, link.stats) for link in self.links],
            "auth": self.auth,
            "sensors": self.sensor_counts(),
        }

    def sensor_counts(self) -> dict[str, Any]:
        """The catalog's counts for /metrics: stalled now, stall events, ids refused by why."""
        pm = self.proxies
        if pm is None:
            return {}
        st = pm.stats
        return {
            "stalled": len(pm.stalled()),
            "stalls": st.stalls,
            "refused": {
                "new_id_rate": st.new_id_rate,
                "catalog_full": st.catalog_full,
                "oversize_hello": st.oversize_hellos,
                "evicted_unconfirmed": st.evicted_unconfirmed,
            },
            "unknown": len(pm.discovery),
            "forgotten_unknown": st.forgotten_unknown,
        }

    def sensor_health(self) -> list[str]:
        """Degraded while sensors are stalled: their data stopped while the programs the
        gateway gave them should send (proxies.stall)."""
        stalled = [] if self.proxies is None else self.proxies.stalled()
        if not stalled:
            return []
        names = ", ".join(repr(s) for s in stalled[:5]) + (", ..." if len(stalled) > 5 else "")
        return [
            f"{len(stalled)} sensor{'s' if len(stalled) > 1 else ''} stalled: data stopped "
            f"while {'their programs' if len(stalled) > 1 else 'its program'} should send "
            f"({names}; GET /sensors?status=stalled)"
        ]

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
            except Exception as exc:  # noqa: BLE001 - a broken provider must not break /healthz
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
        await self.registry.restore()
        for archive in self.archives.values():
            await archive.__aenter__()
        sharing = loop_sharing(self.fjord, self.run_loop, self.hub.flush_due)
        self.heap_freezer.freeze()  # the restored queries, the proxies' and transports' state
        self._spawn("fjord", self.fjord.run(sharing))
        self._spawn("heap-freezer", self.heap_freezer.run())
        if self.mqtt is not None:
            await self._supervise("mqtt-bridge", self.mqtt)
        for name, source in self.sources:
            await self._supervise(
                name, SupervisedTask(f"source {name}", functools.partial(source, self))
            )
        await self._supervise("drop-watch", SupervisedTask("drop watch", self._watch_drops))
        if self.compaction_stats is not None:
            await self._supervise(
                "archive-compaction", SupervisedTask("archive compaction", self._compact_archive)
            )
        return self

    async def _compact_archive(self) -> None:
        """Every `[archive] compact_every_s` (first at start: it finishes a run stopped midway),
        this gateway's closed days compacted in a worker thread; a failed run is counted and
        logged, and the next one tries again."""
        arch = self.config.archive
        assert arch.dir and arch.compact_every_s and self.compaction_stats is not None
        while True:
            try:
                await asyncio.to_thread(
                    run_scheduled,
                    arch.dir,
                    self.gateway_id,
                    self.compaction_stats,
                    self._compaction_stop,
                )
            except (CompactionError, OSError, ValueError) as e:
                self.compaction_stats.failures += 1
                log.warning("archive compaction failed: %s", e)
            await asyncio.sleep(arch.compact_every_s)

    def intake_full(self) -> bool:
        """Whether the transports should stop reading for now (they then leave the data in
        the broker): a stream's queue or an archive's input is half full, or an archive's
        writer is behind. Reading on would only move the backlog into these bounded queues,
        where it is dropped (counted). An archive whose disk refuses writes holds nothing back:
        that can last for hours, and the live queries would starve meanwhile."""
        for s in self.fjord.streams.values():
            if len(s.queue) * 2 >= s.queue.bound:
                return True
        for a in self.archives.values():
            if a.failing is not None:
                continue
            if a.op.behind or len(a.input) * 2 >= a.input.bound:
                return True
        return False

    async def _watch_drops(self) -> None:
        await watch_drops(self.drop_watch)

    async def start_http(self, host: str | None = None, port: int | None = None) -> tuple[str, int]:
        app = make_app(self, max_body=self.config.http.max_body_bytes)
        guard = app[GUARD_KEY]
        check_fd_limit(self.config)
        # Streaming clients end when their subscriptions close; one stuck writing to a client that
        # never reads is given 2 s before the server closes it.
        self._runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            shutdown_timeout=2.0,
            **guard.settings.server_args(),
        )
        await self._runner.setup()
        site = GuardedSite(
            guard,
            self._runner,
            host or self.config.http.host,
            self.config.http.port if port is None else port,
        )
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.address = sock.getsockname()[:2]
        self.sinks.policy.own_ports.add(self.address[1])
        log.info("HTTP API on http://%s:%d", *self.address)
        return self.address

    async def __aexit__(self, *exc: object) -> None:
        # The archives' final flush ends by this deadline whatever the disk does.
        deadline = asyncio.get_running_loop().time() + self.config.archive.shutdown_timeout_s
        self._compaction_stop.set()
        await self._stack.aclose()  # sources and the bridge stop first: intake ends
        for t in list(self._tasks):
            if t.get_name() != "fjord":
                t.cancel()
        await asyncio.gather(
            *[t for t in self._tasks if t.get_name() != "fjord"], return_exceptions=True
        )
        # Drain what was already pushed, flush the archive, then stop the scheduler.
        self.fjord.run_until_idle()
        await asyncio.gather(*(a.close(deadline) for a in self.archives.values()))
        await self.sinks.__aexit__(None, None, None)  # after the drain: they get its rows
        self.fjord.stop()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._runner is not None:
            self.hub.close_all()
            await self._runner.cleanup()
        await self.registry.aclose()
        if self.store is not None:
            self.store.close()
        self.heap_freezer.release()
