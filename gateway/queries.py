"""The gateway's queries on either engine, and those listed as failed: plan, save, install,
describe, remove, and restore at start-up.

A query is saved and running, or neither: it is planned first (no side effects), saved, then
installed, and unsaved again if installing fails. A query that fails while running (or a saved
one that no longer plans) stays listed as failed, with its error, until it is deleted, and comes
back failed after a restart (never a crash loop). `"engine": "spark"` runs a query as a
supervised Structured Streaming job over the archive (gateway/spark/supervisor.py), started on
first use; its SQL's demand is a standing demand under its id (`demands`) while it is
registered, so the sensors it reads through the archive keep sampling for it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from fjords.compile.analysis import BoundQuery
from fjords.compile.sql import ast
from fjords.demand import Demand
from fjords.engine import Engine
from fjords.errors import QueryError
from fjords.runtime.query import RunningQuery
from gateway.config import Config, query_id_problem
from gateway.gc_freeze import HeapFreezer
from gateway.results import ResultHub
from gateway.sinks.manager import SinkManager
from gateway.sinks.spec import redacted, to_builtins
from gateway.store import QueryStore
from proxies.standing import StandingDemands

if TYPE_CHECKING:  # pyspark is optional: the Spark jobs are imported on first use
    from gateway.spark.supervisor import SparkQueries

log = logging.getLogger("gateway")

# Query texts longer than this are parsed in a worker thread, so the event loop keeps serving.
PARSE_IN_THREAD_CHARS = 2048

#: A running query failed: its id, the reason and its options (already listed as failed).
QueryFailed = Callable[[str, str, dict[str, Any]], None]


class QueryRegistry:
    """Every query of one gateway: the Fjord's (`fjord.queries`), the Spark jobs
    (`spark_jobs`) and the failed ones (`failed_queries`), with their options and sinks.

    `on_change` is called when the set of running queries changes and `on_failed` when a
    running query fails, so the gateway's MQTT bridge and sensor proxies follow them. The
    Spark queries' demands go in `demands` (the proxies read the Fjord's queries' from the
    Fjord); a query id may not be another consumer's name there (the archive's)."""

    def __init__(
        self,
        engine: Engine,
        hub: ResultHub,
        sinks: SinkManager,
        store: QueryStore | None,
        config: Config,
        freezer: HeapFreezer,
        *,
        demands: StandingDemands,
        on_change: Callable[[], None],
        on_failed: QueryFailed,
    ) -> None:
        self.engine = engine
        self.fjord = engine.fjord
        self.hub = hub
        self.sinks = sinks
        self.store = store
        self.config = config
        self.freezer = freezer
        self.demands = demands
        self._on_change = on_change
        self._on_failed = on_failed
        #: failed queries (an error at run time, or a saved query that no longer plans),
        #: listed with their error until deleted: id -> {"sql", "error", "options"}
        self.failed_queries: dict[str, dict[str, Any]] = {}
        self.options: dict[str, dict[str, Any]] = {}
        self.spark_jobs: dict[str, str] = {}  # query id -> SQL, for queries running on Spark
        self._spark: SparkQueries | None = None  # started on first use
        #: one registration or removal at a time, each followed by a turn of the event loop:
        #: installing costs milliseconds on the loop (planning, the store's fsync, the proxies'
        #: demand), and a flood of concurrent POSTs would otherwise run dozens of them between
        #: two of the Fjord's slices and stall every result stream
        self._changing = asyncio.Lock()
        self.fjord.on_query_failed.append(self._query_failed)

    # -- either engine (what the HTTP API calls) -------------------------------------------
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
        since: float | None = None,
    ) -> str:
        """Install a query on the engine its options name ("fjords" by default); returns its id.
        `since` (epoch seconds): emit its windows from then on first, from the stream's history;
        not saved (a restart goes on from its history, as any query does)."""
        options = dict(options or {})
        if options.get("engine") == "spark":
            if since is not None:
                raise QueryError("since is for the Fjord engine (the history is in its memory)")
            return await self.add_spark_query(sql, options, query_id=query_id, persist=persist)
        parsed = await parse_off_loop(self.engine, sql)
        tree = None if isinstance(parsed, str) else parsed
        async with self._changing:
            try:
                return self.add_query(
                    sql, options, query_id=query_id, persist=persist, tree=tree, since=since
                ).id
            finally:
                await asyncio.sleep(0)

    async def end_query(self, qid: str) -> None:
        async with self._changing:
            if not self.has_query(qid):  # a concurrent removal went first
                return
            try:
                await self._end_query(qid)
            finally:
                await asyncio.sleep(0)

    async def _end_query(self, qid: str) -> None:
        if qid in self.spark_jobs:
            self.sinks.detach(qid)
            assert self._spark is not None  # a Spark job was launched by it
            await self._spark.stop(qid)
            del self.spark_jobs[qid]
            self.demands.discard(qid)
            self.hub.close_query(qid)
            self.options.pop(qid, None)
            if self.store is not None:
                self.store.delete(qid)
            self._on_change()
            log.info("spark query %s removed", qid)
        else:
            self.remove_query(qid)

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
                options=redacted(failed["options"]),
                subscribers=0,
                demand={},
                sinks=self.sinks.describe(qid),
            )
            return d
        if qid in self.spark_jobs:
            assert self._spark is not None  # a Spark job was launched by it
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
                "options": redacted(self.options.get(qid, {})),
                "subscribers": self.hub.subscribers(qid),
                "demand": _described(self.demands.get(qid, ())),
                "spark": {k: v for k, v in st.items() if k != "columns"},
                # starting (the job is being compiled and started), running, restarting (down,
                # being restarted by its supervisor) or failed
                "state": state if state in ("starting", "restarting", "failed") else "running",
                "error": error,
                "sinks": self.sinks.describe(qid),
            }
        rq = self.fjord.queries[qid]
        d = rq.describe()
        d["options"] = redacted(self.options.get(qid, {}))
        d["subscribers"] = self.hub.subscribers(qid)
        d["demand"] = _described((rq.demand,))
        d["sinks"] = self.sinks.describe(qid)
        return d

    def spark_statuses(self) -> dict[str, dict[str, Any]]:
        """Each running Spark query's job status as its supervisor last polled it (/metrics)."""
        if self._spark is None:
            return {}
        out = {}
        for qid in list(self.spark_jobs):
            try:
                out[qid] = self._spark.polled_status(qid)
            except KeyError:  # stopped meanwhile
                continue
        return out

    # -- the Fjord's queries -----------------------------------------------------------------
    def add_query(
        self,
        sql: str,
        options: dict[str, Any] | None = None,
        query_id: str | None = None,
        persist: bool = True,
        tree: ast.Statement | None = None,
        since: float | None = None,
    ) -> RunningQuery:
        """Plan (no side effects), save, then install: a query is saved and running, or neither.
        `tree` is `sql` already parsed (register parses long texts off the event loop)."""
        qid = query_id or uuid.uuid4().hex[:12]
        if (problem := query_id_problem(qid)) is not None:
            raise QueryError(problem)
        if qid in self.failed_queries or qid in self.spark_jobs or qid in self.demands:
            raise QueryError(f"query id {qid!r} is already in use")
        options = self._checked_sinks(options)
        prepared = self.engine.prepare(sql if tree is None else tree, query_id=qid, since=since)
        prepared.sql = sql
        if persist and self.store is not None:
            try:
                self.store.save(qid, sql, dict(options or {}))
            except Exception as e:  # e.g. text SQLite cannot store: nothing is installed
                log.error("could not save query %s: %r", qid, e)
                raise QueryError(
                    f"the query could not be saved, so it was not installed: {e}"
                ) from e
        # Its results have somewhere to go before it is installed: installing may already
        # deliver rows (windows filled from the stream's history, `since`).
        cols = list(prepared.plan.columns)
        self._open_ring(qid, cols)
        prepared.plan.sink.add_batch_callback(self.hub.publisher(qid, cols))
        self.options[qid] = dict(options or {})
        self._attach_sinks(qid, lambda: _group_columns(prepared.tree, cols))
        try:
            rq = self.engine.add_query(prepared)
        except Exception:
            self.sinks.detach(qid)
            self.hub.close_query(qid)
            self.options.pop(qid, None)
            if persist and self.store is not None:
                self.store.delete(qid)
            raise
        self._on_change()
        self.freezer.changed()
        log.info("query %s added: %s", qid, sql)
        return rq

    def remove_query(self, qid: str) -> None:
        self.freezer.changed(removed=True)
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
        self._on_change()
        log.info("query %s removed", qid)

    def _query_failed(self, qid: str, reason: str) -> None:
        """The Fjord stopped a query (an error in its operators): keep it listed as failed,
        remembered across restarts, and tell its clients (and `on_failed`) why."""
        options = self.options.pop(qid, {})
        sql = self.fjord.failed[qid].sql if qid in self.fjord.failed else None
        self.failed_queries[qid] = {"sql": sql, "error": reason, "options": options}
        self.hub.fail_query(qid, reason)
        if self.store is not None:
            try:
                self.store.mark_failed(qid, reason)
            except Exception as e:  # noqa: BLE001 - the failure is still reported live
                log.error("could not record the failure of query %s: %r", qid, e)
        self._on_failed(qid, reason, options)

    def _failed_record(
        self, qid: str, sql: str, error: str, options: dict[str, Any] | None = None
    ) -> None:
        """A query listed as failed without running (its saved failure, or it does not plan)."""
        self.failed_queries[qid] = {"sql": sql, "error": error, "options": dict(options or {})}
        self.hub.fail_query(qid, error)

    async def restore(self) -> None:
        """Saved queries come back, then the configured ones not saved; one that failed before,
        or no longer plans, comes back listed as failed with its error (never a crash loop)."""
        restored = set()
        if self.store is not None:
            saved = self.store.load_all()
            taken = {qid for qid, *_ in saved}
            for qid, sql, options, error in saved:
                restored.add(sql)
                if query_id_problem(qid) is not None:
                    qid = self._renamed(qid, taken)
                if error is not None:
                    self._failed_record(qid, sql, error, options)
                    continue
                try:
                    await self.register(sql, options, query_id=qid, persist=False)
                except Exception as e:  # noqa: BLE001 - a stored query may no longer plan (e.g. a table is gone)
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

    def _renamed(self, qid: str, taken: set[str]) -> str:
        """A saved query whose id no URL, topic or file name can carry (saved before ids were
        checked: `a/b`, `../x`) gets one that can, in the store too, and the log says which:
        it stays listed and can be fetched and deleted."""
        assert self.store is not None
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", qid).replace("..", "_").lstrip("_.-")[:48]
        digest = hashlib.sha256(qid.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        new = f"{stem}-{digest}" if stem else f"q-{digest}"
        while new in taken:
            new = f"{new[:55]}-{uuid.uuid4().hex[:6]}"
        taken.add(new)
        self.store.rename(qid, new)
        log.warning(
            "saved query %r has an id that cannot be used in a URL, an MQTT topic or a file name; "
            "it is now %r (GET /queries/%s)",
            qid,
            new,
            new,
        )
        return new

    # -- results: the replay ring and the sinks ----------------------------------------------
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

    # -- Spark jobs --------------------------------------------------------------------------
    async def add_spark_query(
        self, sql: str, options: dict[str, Any], query_id: str | None = None, persist: bool = True
    ) -> str:
        """Run the query on Spark over the archive (Structured Streaming, supervised). Returns
        at once: the job starts in the background (`describe_query` says `starting`, then
        `running`, or `failed` with the reason); a query that does not plan is refused now."""
        require_pyspark()  # a plain install: a 400 naming the extra, not a 500 from the JVM side
        archive = self.config.archive.dir
        if archive is None:
            raise QueryError(
                '"engine": "spark" reads the gateway\'s archive: configure [archive] dir'
            )
        if self.config.state_dir is None and _local_root(archive) is None:
            raise QueryError(
                f'"engine": "spark" over the archive {archive} needs [state] dir: its checkpoints '
                "are kept there when the archive is not on a local disk"
            )
        from fjords.compile.sql.parser import parse

        tree = parse(sql)  # a bad text (a lone surrogate...) is refused before anything is saved
        # One dialect: what the Fjord refuses, Spark would too; over the fleet's archive, whose
        # streams have a `gateway` column.
        fleet = self._fleet_engine()
        plan = fleet.plan(tree)
        bound = fleet.analyze(tree)  # (what Spark compiles)
        columns = list(plan.columns)
        options = self._checked_sinks(options)
        spark = await self._spark_queries(archive)
        qid = query_id or uuid.uuid4().hex[:12]
        if (problem := query_id_problem(qid)) is not None:
            raise QueryError(problem)
        if self.has_query(qid) or qid in self.demands:
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
        # Spark sees what the archive holds of the sensors
        self.demands.set(qid, [_sensor_demand(d, fleet) for d in plan.demands])
        self._open_ring(qid, columns)
        spark.launch(
            qid,
            sql,
            stream=plan.stream,  # its own stream's archive (and a join's second stream's)
            right_stream=bound.right.stream
            if isinstance(bound, BoundQuery) and bound.right is not None
            else None,
            on_rows=lambda rows: hub.publish(qid, rows),
            on_failed=lambda reason, ran: self._spark_failed(qid, reason, ran),
            on_event=lambda event, data: hub.notify(qid, event, data),
        )
        self._attach_sinks(qid, lambda: _group_columns(tree, columns))
        self._on_change()
        log.info("spark query %s starting: %s", qid, sql)
        return qid

    def _fleet_engine(self) -> Engine:
        """An engine that plans only, over this gateway's catalog as the fleet's archive has
        it: each stream with the `gateway` column (so `GROUP BY gateway` plans)."""
        from dataclasses import replace

        from fjords.runtime.fjord import Fjord
        from gateway.archive_layout import with_gateway

        mine = self.engine.fjord
        fjord = Fjord(queue_bound=mine.queue_bound, limits=mine.limits)
        for info in mine.catalog.streams.values():
            fjord.catalog.add_stream(
                replace(info, schema=with_gateway(info.schema), hierarchies=list(info.hierarchies))
            )
        for table in mine.catalog.tables.values():
            fjord.catalog.add_table(table)
        return Engine(fjord, share_group_filters=self.engine.share_group_filters)

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

    async def _spark_queries(self, archive: str) -> SparkQueries:
        if self._spark is None:
            require_pyspark()
            from gateway.spark.session import SparkConfig
            from gateway.spark.supervisor import SparkQueries

            local = _local_root(archive)
            state = self.config.state_dir or str(Path(local or ".") / ".spark-state")
            self._spark = await SparkQueries(
                SparkConfig.from_mapping(self.config.spark),
                archive_root=archive,
                state_dir=state,
                tables=self.config.tables,
            ).__aenter__()
        return self._spark

    def spark_health(self) -> list[str]:
        """The Spark queries that are down (being restarted), for /healthz."""
        return self._spark.health() if self._spark is not None else []

    async def aclose(self) -> None:
        """Stop the Spark jobs, if any ran (the Fjord's queries stop with the Fjord)."""
        if self._spark is not None:
            await self._spark.__aexit__(None, None, None)


async def parse_off_loop(engine: Engine, sql: str) -> str | ast.Statement:
    """`sql` as it is when short, else parsed in a worker thread (the event loop keeps
    serving); the length limit is checked first, as the Fjord would."""
    if len(sql) <= PARSE_IN_THREAD_CHARS:
        return sql
    from fjords.compile.sql.parser import parse

    engine.fjord.limits.check("max_sql_chars", len(sql), "query text length (characters)")
    return await asyncio.to_thread(parse, sql)


def require_pyspark() -> None:
    """`"engine": "spark"` needs the optional [spark] extra; without pyspark the request is the
    client's to fix (install it), so this is a QueryError (HTTP 400) that names the extra."""
    from fjords.errors import EngineUnavailable

    try:
        import pyspark  # noqa: F401
    except ImportError as e:
        raise EngineUnavailable('"engine": "spark"', "spark", "pyspark") from e


def _described(demands: tuple[Demand, ...]) -> dict[str, Any]:
    """A query's demand on its own stream's sensors, as GET /queries/{id} shows it."""
    if not demands:
        return {}
    d = demands[0]
    return {
        "sample_period_s": d.sample_period_s,
        "lifetime_s": d.lifetime_s,
        "fields": list(d.fields),
        **({"sample_every_rows": d.sample_every_rows} if d.sample_every_rows else {}),
    }


def _sensor_demand(d: Demand, fleet: Engine) -> Demand:
    """A Spark query's demand as the sensors can serve it: one that names the fleet's `gateway`
    column (no sensor has it) asks for the readings themselves, every field, unfiltered."""
    from gateway.archive_layout import GATEWAY_COLUMN

    named = {*d.fields, *d.group_by, *(a[0] for a in d.atoms), *(f for _, f in d.aggregates)}
    if GATEWAY_COLUMN not in named:
        return d
    fields = fleet.fjord.catalog.streams[d.stream].schema.names
    return Demand(
        stream=d.stream,
        sample_period_s=d.sample_period_s,
        lifetime_s=d.lifetime_s,
        fields=tuple(f for f in fields if f != GATEWAY_COLUMN),
        atoms=(),
        filtered_only_by_atoms=True,
        aggregates=(),
        window=None,
        group_by=(),
    )


def _group_columns(tree: ast.Statement, columns: list[str]) -> tuple[str, ...]:
    """The result columns that name a group (its GROUP BY columns), for the MQTT sink."""
    from gateway.home_assistant import entity_shape

    return entity_shape(tree, columns, None).group_columns if columns else ()


def _local_root(archive: str) -> str | None:
    """The local path of an archive root (a path or a file:// URL; None: a remote one)."""
    if "://" not in archive:
        return archive
    split = urlsplit(archive)
    return split.path if split.scheme == "file" else None
