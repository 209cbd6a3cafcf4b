"""GET /metrics: the Fjord's and the proxies' counters in Prometheus text format.

Read fresh from the running objects on each scrape (a custom collector), so nothing on the hot
path updates a metrics library.
"""

from __future__ import annotations

import resource
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from fjords.runtime.fjord import Fjord
from fjords.runtime.history import History
from gateway.http_guard import HttpStats


class FjordCollector(Collector):
    def __init__(
        self,
        fjord: Fjord,
        sensors: Callable[[], list[dict[str, Any]]],
        hub_stats: Callable[[], dict],
    ) -> None:
        self.fjord = fjord
        self.sensors = sensors
        self.hub_stats = hub_stats

    def collect(self) -> Iterator[Any]:
        stats = self.fjord.stats()
        t_in = CounterMetricFamily(
            "fjords_stream_tuples_in", "Tuples read by a stream's router", labels=["stream"]
        )
        deliv = CounterMetricFamily(
            "fjords_stream_deliveries", "Tuples delivered to queries", labels=["stream"]
        )
        late = CounterMetricFamily(
            "fjords_stream_late_samples", "Samples dropped as late", labels=["stream"]
        )
        drops = CounterMetricFamily(
            "fjords_queue_drops", "Items dropped by full queues (oldest first)", labels=["queue"]
        )
        wm = GaugeMetricFamily(
            "fjords_stream_watermark_seconds", "Event-time progress", labels=["stream"]
        )
        clock = CounterMetricFamily(
            "fjords_stream_clock_rejects",
            "Samples dropped as dated implausibly far ahead (fjords.runtime.progress)",
            labels=["stream"],
        )
        for name, s in stats["streams"].items():
            clock.add_metric([name], s.get("clock_rejects", 0))
            t_in.add_metric([name], s["tuples_in"])
            deliv.add_metric([name], s["deliveries"])
            late.add_metric([name], s["late"])
            drops.add_metric([f"stream:{name}"], s["queue_drops"])
            if s["watermark"] not in (float("inf"), float("-inf")):
                wm.add_metric([name], s["watermark"])
        rows = CounterMetricFamily("fjords_query_rows", "Result rows produced", labels=["query"])
        sampled = CounterMetricFamily(
            "fjords_query_sampled_out",
            "Readings SAMPLE EVERY n ROWS left out of a query by design (not a loss)",
            labels=["query"],
        )
        held = GaugeMetricFamily(
            "fjords_join_held_tuples",
            "Tuples a stream-stream join holds (both sides; each bounded by fill_threshold)",
            labels=["query"],
        )
        fill = GaugeMetricFamily(
            "fjords_join_fill_threshold", "Tuples one side of a join may hold", labels=["query"]
        )
        evicted = CounterMetricFamily(
            "fjords_join_evicted_tuples",
            "Tuples a stream-stream join evicted (closed windows, and dropped ones)",
            labels=["query"],
        )
        for qid, q in stats["queries"].items():
            rows.add_metric([qid], q["rows"])
            if "sampled_out" in q:
                sampled.add_metric([qid], q["sampled_out"])
            drops.add_metric([f"query:{qid}"], q["queue_drops"])
            join = q.get("join")
            if join is not None:
                held.add_metric([qid], join["held"])
                fill.add_metric([qid], join["fill_threshold"])
                evicted.add_metric([qid], join["evicted"])
        yield from (t_in, deliv, late, clock, drops, wm, rows, sampled, held, fill, evicted)
        yield GaugeMetricFamily(
            "fjords_queries", "Registered queries", value=len(self.fjord.queries)
        )
        yield CounterMetricFamily(
            "fjords_query_failures",
            "Queries stopped by an error in their operators (the others went on)",
            value=stats.get("query_failures", 0),
        )
        sched = stats["scheduler"]
        yield CounterMetricFamily(
            "fjords_scheduler_transitions", "Operator transitions run", value=sched["transitions"]
        )
        yield CounterMetricFamily(
            "fjords_scheduler_busy_seconds",
            "Time spent in transitions",
            value=sched["busy_seconds"],
        )
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        yield GaugeMetricFamily("fjords_max_rss_bytes", "Peak resident memory", value=rss)
        missed = CounterMetricFamily(
            "fjords_client_missed_rows", "Rows slow clients missed", labels=["query"]
        )
        for qid, n in self.hub_stats().get("missed", {}).items():
            missed.add_metric([qid], n)
        yield missed
        rate = GaugeMetricFamily(
            "fjords_sensor_sample_rate_hz", "Sensor sample rate", labels=["sensor", "program"]
        )
        energy = CounterMetricFamily(
            "fjords_sensor_energy_joules", "Energy a sensor has spent", labels=["sensor"]
        )
        sensor_clock = CounterMetricFamily(
            "fjords_sensor_clock_rejects",
            "A sensor's readings dropped as dated implausibly far ahead",
            labels=["sensor"],
        )
        suspect = GaugeMetricFamily(
            "fjords_sensor_clock_suspect", "1 when a sensor's clock looks wrong", labels=["sensor"]
        )
        for s in self.sensors():
            sid = str(s.get("id"))
            if "clock_rejects" in s:
                sensor_clock.add_metric([sid], s["clock_rejects"])
                suspect.add_metric([sid], 1.0 if s.get("clock_suspect") else 0.0)
            if s.get("sample_rate_hz") is not None:
                rate.add_metric([sid, str(s.get("program", ""))], s["sample_rate_hz"])
            if s.get("energy_j_estimate") is not None:
                energy.add_metric([sid], s["energy_j_estimate"])
        yield rate
        yield energy
        yield sensor_clock
        yield suspect
        stats = self.hub_stats()
        yield from _supervision(stats)
        yield from _catalog(stats.get("sensors", {}))


def _supervision(stats: dict[str, Any]) -> Iterator[Any]:
    """Supervised tasks and transports: restarts, link state, what each transport dropped."""
    restarts = CounterMetricFamily(
        "fjords_task_restarts",
        "Unexpected failures of a background task or transport (each restarted with backoff)",
        labels=["task"],
    )
    for name, n in stats.get("task_restarts", {}).items():
        restarts.add_metric([name], n)
    yield restarts
    links = stats.get("links", [])
    up = GaugeMetricFamily(
        "fjords_transport_up", "1 while a transport is connected", labels=["transport"]
    )
    received = CounterMetricFamily(
        "fjords_transport_received", "Valid messages a transport received", labels=["transport"]
    )
    dropped = CounterMetricFamily(
        "fjords_transport_dropped",
        "Messages a transport dropped, by reason (bad packets by kind, full queues)",
        labels=["transport", "reason"],
    )
    gaps = CounterMetricFamily(
        "fjords_transport_seq_gaps",
        "Messages missing from sensors' sequence numbers (lost before reaching the gateway)",
        labels=["transport"],
    )
    reconnects = CounterMetricFamily(
        "fjords_transport_reconnects", "Times a transport connected again", labels=["transport"]
    )
    for name, st in links:
        up.add_metric([name], 1.0 if st.connected else 0.0)
        received.add_metric([name], st.received)
        dropped.add_metric([name, "queue_full"], st.dropped_queue_full)
        dropped.add_metric([name, "client_queue_full"], st.dropped_client_queue)
        for reason, n in st.bad.items():
            dropped.add_metric([name, f"bad_{reason}"], n)
        gaps.add_metric([name], st.seq_gaps)
        reconnects.add_metric([name], st.reconnects)
    yield from (up, received, dropped, gaps, reconnects)
    yield from _auth(stats.get("auth"))


def _auth(auth: Any) -> Iterator[Any]:
    """Mote messages refused by authentication ([sensors] keys_file), by reason."""
    if auth is None:
        return
    rejected = CounterMetricFamily(
        "fjords_auth_rejected",
        "Mote messages refused: unsigned, bad_mac (forged or damaged), replay, unknown_key",
        labels=["reason"],
    )
    for reason, n in auth.rejected.items():
        rejected.add_metric([reason], n)
    yield rejected
    yield CounterMetricFamily(
        "fjords_auth_unsigned_accepted",
        "Unsealed mote messages accepted because [sensors] require_mac = false",
        value=auth.unsigned_accepted,
    )


def _catalog(counts: dict[str, Any]) -> Iterator[Any]:
    """Stalled sensors (proxies.stall) and the new sensor ids the catalog refused."""
    if not counts:
        return
    yield GaugeMetricFamily(
        "fjords_sensors_stalled",
        "Sensors whose data stopped while their programs should send",
        value=counts.get("stalled", 0),
    )
    yield CounterMetricFamily(
        "fjords_sensor_stalls",
        "Times a sensor's data stopped while its program should send",
        value=counts.get("stalls", 0),
    )
    refused = CounterMetricFamily(
        "fjords_sensors_refused",
        "Messages of sensor ids the catalog refused, by why (new_id_rate: past their "
        "source's [sensors] max_new_per_minute)",
        labels=["reason"],
    )
    for reason, n in counts.get("refused", {}).items():
        refused.add_metric([reason], n)
    yield refused
    yield GaugeMetricFamily(
        "fjords_sensors_unknown",
        "Sensor ids heard without a hello, held until they say one",
        value=counts.get("unknown", 0),
    )
    yield CounterMetricFamily(
        "fjords_sensors_unknown_forgotten",
        "Sensor ids without a hello forgotten ([sensors] forget_unknown_after_s, max_unknown)",
        value=counts.get("forgotten_unknown", 0),
    )


class DropCollector(Collector):
    """`fjords_dropped_total{stage, reason}`: every place data can be lost (gateway.drops)."""

    def __init__(self, counts: Callable[[], dict[tuple[str, str], int]]) -> None:
        self.counts = counts

    def collect(self) -> Iterator[Any]:
        fam = CounterMetricFamily(
            "fjords_dropped",
            "Data the gateway gave up, by where (stage) and why (reason)",
            labels=["stage", "reason"],
        )
        for (stage, reason), n in sorted(self.counts().items()):
            fam.add_metric([stage, reason], n)
        yield fam


class HistoryCollector(Collector):
    """The streams' transient segments (fjords.runtime.history): size, span, evictions."""

    def __init__(self, histories: Mapping[str, History]) -> None:
        self.histories = histories

    def collect(self) -> Iterator[Any]:
        rows = GaugeMetricFamily("fjords_history_rows", "Readings held", labels=["stream"])
        size = GaugeMetricFamily(
            "fjords_history_bytes", "Memory of the readings and aggregates held", labels=["stream"]
        )
        oldest = GaugeMetricFamily(
            "fjords_history_oldest_seconds",
            "Event time of the oldest reading held",
            labels=["stream"],
        )
        early = CounterMetricFamily(
            "fjords_history_evicted_early",
            "Readings evicted before keep_s because of max_rows",
            labels=["stream"],
        )
        too_old = CounterMetricFamily(
            "fjords_history_too_old",
            "Readings older than keep_s behind the newest when they arrived (not kept)",
            labels=["stream"],
        )
        for name, h in self.histories.items():
            st = h.stats()
            rows.add_metric([name], st["rows"] or 0)
            size.add_metric([name], st["bytes"] or 0)
            if st["oldest"] is not None:
                oldest.add_metric([name], st["oldest"])
            early.add_metric([name], st["evicted_early"] or 0)
            too_old.add_metric([name], st["too_old"] or 0)
        yield from (rows, size, oldest, early, too_old)


class ArchiveReadCollector(Collector):
    """What snapshots found unreadable in the archive (gateway/archive_reader.py)."""

    def __init__(self, unreadable: Mapping[str, int]) -> None:
        self.unreadable = unreadable

    def collect(self) -> Iterator[Any]:
        fam = CounterMetricFamily(
            "fjords_archive_segments_unreadable",
            "Archive segments a snapshot found unreadable and skipped (each file once)",
            labels=["stream"],
        )
        for name, n in self.unreadable.items():
            fam.add_metric([name], n)
        yield fam


class WebhookPolicyCollector(Collector):
    """Webhooks the address policy refused (gateway/sinks/address_policy.py)."""

    def __init__(self, refused: Mapping[str, int]) -> None:
        self.refused = refused

    def collect(self) -> Iterator[Any]:
        fam = CounterMetricFamily(
            "fjords_webhook_refused",
            "Webhook URLs (at registration) and connections (at connect time) refused by the "
            "address policy",
            labels=["at"],
        )
        for when, n in self.refused.items():
            fam.add_metric([when], n)
        yield fam


class ArchiveWriteCollector(Collector):
    """How the archive's writers fare (gateway/archive.py): failed writes by reason, temporary
    files of unfinished writes removed, and whether each can write now."""

    def __init__(self, archives: Mapping[str, Mapping[str, Any]]) -> None:
        self.archives = archives  # stream -> ArchiveWriter.status()

    def collect(self) -> Iterator[Any]:
        errors = CounterMetricFamily(
            "fjords_archive_errors",
            "Archive segment writes that failed, by reason (no_space, read_only, permission, "
            "too_many_files, io; an object store's also unreachable, storage); each is retried "
            "with backoff",
            labels=["stream", "reason"],
        )
        removed = CounterMetricFamily(
            "fjords_archive_temp_files_removed",
            "Temporary files of unfinished archive writes removed (at start, after a failed write)",
            labels=["stream"],
        )
        failing = GaugeMetricFamily(
            "fjords_archive_cannot_write",
            "1 while an archive's disk refuses writes (the gateway is then degraded)",
            labels=["stream"],
        )
        for name, st in self.archives.items():
            for reason, n in st["errors"].items():
                errors.add_metric([name, reason], n)
            removed.add_metric([name], st["temp_files_removed"])
            failing.add_metric([name], 0.0 if st["cannot_write"] is None else 1.0)
        yield from (errors, removed, failing)


class HttpCollector(Collector):
    """The HTTP server's connections and what its guard refused (gateway/http_guard.py)."""

    def __init__(self, stats: HttpStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Any]:
        st = self.stats
        yield GaugeMetricFamily(
            "fjords_http_connections", "HTTP connections open now", value=st.connections
        )
        refused = CounterMetricFamily(
            "fjords_http_connections_refused",
            "HTTP connections refused (503) at a cap, by the cap's [http] key",
            labels=["reason"],
        )
        for reason in ("max_connections", "max_connections_per_client"):
            refused.add_metric([reason], st.refused.get(reason, 0))
        closed = CounterMetricFamily(
            "fjords_http_connections_closed",
            "HTTP connections the gateway closed: headers or body too slow, or idle at the "
            "connection cap (to make room)",
            labels=["reason"],
        )
        for reason in ("header_timeout", "body_timeout", "evicted"):
            closed.add_metric([reason], st.closed.get(reason, 0))
        requests = CounterMetricFamily(
            "fjords_http_requests_refused",
            "HTTP requests refused before they ran (429: over the client's write rate)",
            labels=["reason"],
        )
        requests.add_metric(["rate_limited"], st.requests_refused.get("rate_limited", 0))
        yield from (refused, closed, requests)


class CompactionCollector(Collector):
    """The daemon's scheduled archive compactions (gateway/compaction.py)."""

    def __init__(self, stats: Any) -> None:
        self.stats = stats  # gateway.compaction.CompactionStats

    def collect(self) -> Iterator[Any]:
        st = self.stats
        for name, doc, value in (
            ("fjords_archive_compactions", "Scheduled archive compaction runs", st.runs),
            (
                "fjords_archive_compaction_failures",
                "Scheduled archive compaction runs that failed (logged)",
                st.failures,
            ),
            (
                "fjords_archive_compacted_files",
                "Archive segments replaced by compaction (and deleted)",
                st.files_in,
            ),
            ("fjords_archive_compacted_rows", "Rows rewritten by compaction", st.rows),
            (
                "fjords_archive_compaction_output_files",
                "Compacted files written",
                st.files_out,
            ),
            (
                "fjords_archive_compaction_unreadable",
                "Unreadable segments compaction found and kept (named in the log)",
                st.unreadable,
            ),
        ):
            yield CounterMetricFamily(name, doc, value=value)


class SparkFleetCollector(Collector):
    """What the Spark queries' fleet sources dropped (gateway/spark/progress.py): readings
    later than the watermark, per query and gateway, and segments the declared schema refused;
    and how often each query's job was restarted (gateway/spark/supervisor.py)."""

    def __init__(self, statuses: Mapping[str, Mapping[str, Any]]) -> None:
        self.statuses = statuses  # query id -> StreamingJob.status() (via the supervisor)

    def collect(self) -> Iterator[Any]:
        late = CounterMetricFamily(
            "fjords_spark_late_readings_dropped",
            "Readings a Spark query dropped as later than its watermark, per gateway, across "
            "all batches",
            labels=["query", "gateway"],
        )
        refused = CounterMetricFamily(
            "fjords_spark_segments_refused",
            "Archive segments a Spark query refused (their schema differs from the declared one)",
            labels=["query"],
        )
        restarts = CounterMetricFamily(
            "fjords_spark_restarts",
            "Times a Spark query's job was restarted from its checkpoint after a failure (its "
            "driver, JVM or Connect server gone); the reason is its last_error",
            labels=["query"],
        )
        for qid, st in self.statuses.items():
            restarts.add_metric([qid], st.get("restarts") or 0)
            for gateway, n in (st.get("late_readings_dropped") or {}).items():
                late.add_metric([qid, gateway], n)
            if "segments_refused" in st:
                refused.add_metric([qid], st["segments_refused"])
        yield from (late, refused, restarts)


def render(
    fjord: Fjord,
    sensors: Callable[[], list[dict[str, Any]]],
    hub_stats: Callable[[], dict],
    drops: Callable[[], dict[tuple[str, str], int]] | None = None,
    histories: Mapping[str, History] | None = None,
    *,
    unreadable: Mapping[str, int] | None = None,
    webhook_refused: Mapping[str, int] | None = None,
    archives: Mapping[str, Mapping[str, Any]] | None = None,
    http: HttpStats | None = None,
    compaction: Any = None,
    spark: Mapping[str, Mapping[str, Any]] | None = None,
) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FjordCollector(fjord, sensors, hub_stats))
    if drops is not None:
        registry.register(DropCollector(drops))
    if histories:
        registry.register(HistoryCollector(histories))
    if unreadable is not None:
        registry.register(ArchiveReadCollector(unreadable))
    if webhook_refused is not None:
        registry.register(WebhookPolicyCollector(webhook_refused))
    if archives:
        registry.register(ArchiveWriteCollector(archives))
    if http is not None:
        registry.register(HttpCollector(http))
    if compaction is not None:
        registry.register(CompactionCollector(compaction))
    if spark:
        registry.register(SparkFleetCollector(spark))
    return generate_latest(registry)
