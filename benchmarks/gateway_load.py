"""Load on the whole gateway: 1,000 registered queries, 207 replayed motes, 50 SSE clients.

Every sample takes the real path (default `--topology processes`): 207 motes, each its own MQTT
connection, publish to a real Mosquitto; the gateway process runs the daemon's code path (the
MQTT transport, the proxies, the Fjord, the result hub, aiohttp SSE); 50 clients in a third
process read Server-Sent Events. With `--motes replayed` (default) the simulated motes' packets
are made before the clock starts and published at their times through each mote's MqttMoteLink,
so the motes' firmware simulation does not take the gateway's cores (`--motes simulated`: the
fleet simulated live in the motes' process). Latency is from the moment a mote publishes a
sample to the moment a client has parsed the row it produced, split in stages: mote send ->
gateway socket read (the motes' process, the broker, the kernel) -> Fjord push (transport,
proxy) -> result published (the Fjord, to the result hub) -> client parse (SSE writing, the
client). The latency histograms are plotted into
benchmarks/out/gateway_load_latency_LABEL.png (matplotlib).

Keeping pace is read on the samples' own clocks (one monotonic clock for all the processes):
samples sent per second from the first send to the last, against samples pushed into the Fjord
per second from the first send to the last push, and the p50/p99 over the last second of
sending (a backlog that grew shows there). `samples_per_s` (from the harness's "go" to the last
sample in) also counts the signals between the processes, ~0.1-0.2 s a run.

  python -m benchmarks.gateway_load [--stations N] [--hours H] [--rates 10000,20000,max]
      [--motes replayed|simulated] [--label NAME] [--no-record]

`--label` names the run in its RESULTS.md section, its plot and the JSON of its figures
(benchmarks/out/gateway_load_LABEL.json). A run of other code (its own checkout, this file
copied in) with `--label before --no-record` is shown beside the next run, rate by rate.

Uses METR-LA from ../shared/data when present (207 stations); otherwise a generated fleet.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import random
import re
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any

import aiohttp
from firmware_sim.programs import RAW_BATCH

from benchmarks.common import console, drawn, markdown, record, table
from gateway.config import Config
from gateway.daemon import Gateway
from gateway.fleet import generated_stations, generated_trace
from proxies.manager import ProxyManager
from sensors.motes.mote import Pacer
from sensors.motes.replay import TraceReplayFleet, load_stations, load_trace
from sensors.transports.inprocess import InProcessHub

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "metr-la"
OUT = Path(__file__).resolve().parent / "out"  # this file's, also when run on older code


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def queries(stations: dict[str, dict[str, Any]], n: int, rng: random.Random) -> list[str]:
    ids = sorted(stations)
    segs = sorted({str(a["segment"]) for a in stations.values()})
    out = []
    for i in range(n):
        kind = i % 10
        if kind < 5:  # speed thresholds: the predicate index's range case
            lo = rng.uniform(0, 70)
            out.append(
                f"SELECT time, station, speed FROM traffic WHERE speed >= {lo:.2f} AND speed < {lo + 3:.2f}"
            )
        elif kind < 7:  # one station's slow readings
            out.append(
                f"SELECT time, station, speed FROM traffic WHERE station = '{rng.choice(ids)}' AND speed < 50"
            )
        elif kind < 9:  # Query 1 shapes
            picked = ", ".join(f"'{s}'" for s in rng.sample(segs, min(2, len(segs))))
            r = rng.choice([15, 30, 60])
            out.append(
                f"SELECT segment, AVG(speed) AS avg_speed FROM traffic [RANGE {r} MINUTES] "
                f"WHERE segment IN ({picked}) GROUP BY segment"
            )
        else:  # one station's hourly top speed, when it is high
            out.append(
                f"SELECT station, MAX(speed) AS top FROM traffic [RANGE 1 HOUR SLIDE 15 MINUTES] "
                f"WHERE station = '{rng.choice(ids)}' GROUP BY station HAVING MAX(speed) > {rng.uniform(60, 70):.1f}"
            )
    return out


class Stamps:
    """When each sample (station, time) reached a point, kept in arrays. A dict or a list of
    tuples growing by the sample is walked by every garbage collection of the process that
    holds it: in the gateway's process, by the end of a run, 12-23 ms per full pass (and the
    young passes after it) spent on the benchmark's own bookkeeping, not on the gateway. A
    dict of strings to ints is not tracked, and the collector does not visit an array's
    numbers."""

    __slots__ = ("_at", "_ids", "_names", "_sid", "_t")

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._names: list[str] = []
        self._sid, self._t, self._at = array("l"), array("d"), array("d")

    def add(self, station: str, t: float, at: float) -> None:
        i = self._ids.get(station)
        if i is None:
            i = self._ids[station] = len(self._names)
            self._names.append(station)
        self._sid.append(i)
        self._t.append(t)
        self._at.append(at)

    def __len__(self) -> int:
        return len(self._at)

    def items(self) -> list[tuple[tuple[str, float], float]]:
        """Every stamp, in order: ((station, time), when)."""
        names = self._names
        return [((names[i], t), at) for i, t, at in zip(self._sid, self._t, self._at, strict=True)]

    def first(self) -> dict[tuple[str, float], float]:
        """The first stamp of each sample."""
        out: dict[tuple[str, float], float] = {}
        for key, at in self.items():
            out.setdefault(key, at)
        return out


class SendClock:
    """Wraps a mote's link: when each sample (station, time) left the mote (CLOCK_MONOTONIC,
    which every process on the machine shares)."""

    def __init__(self, link: Any, sent: Stamps) -> None:
        self._link, self._sent = link, sent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._link, name)

    async def send(self, msg: Any, **kw: Any) -> None:
        times = getattr(msg, "times", None)
        if msg.__class__.__name__ == "Samples" and times:
            now, add = time.monotonic(), self._sent.add
            for t in times:
                add(msg.sensor_id, t, now)
        await self._link.send(msg, **kw)


class StageClock:
    """When each sample (station, time) was pushed into the Fjord and when the row it produced
    was published to the result hub (first time each), in the gateway's process."""

    def __init__(self) -> None:
        self.pushed = Stamps()
        self.published = Stamps()
        self._received: list[tuple[float, bytes]] = []  # (time, payload), decoded after the run

    def wrap_receive(self) -> None:
        """Times MQTT data packets as the gateway reads them from the broker's socket (paho
        hands each to aiomqtt's queue): what happens before is outside the gateway (the
        motes' process, the broker, the kernel), after is the gateway's queue and proxies."""
        from sensors.transports.mqtt_reads import ClientQueue

        # Each run (rate) replaces the previous run's wrapper: the original put is kept aside.
        cls = ClientQueue
        put = cls.__dict__.get("_untimed_put_nowait") or cls.put_nowait
        cls._untimed_put_nowait = put  # type: ignore[attr-defined]
        received = self._received

        def timed_put(queue: Any, m: Any) -> None:
            received.append((time.monotonic(), m.payload))
            put(queue, m)

        cls.put_nowait = timed_put  # type: ignore[method-assign]

    def received(self) -> dict[tuple[str, float], float]:
        from sensors.protocol import decode_message

        out: dict[tuple[str, float], float] = {}
        for at, payload in self._received:
            try:
                msg = decode_message(payload)
            except Exception:  # noqa: BLE001 - hellos and statuses are not timed
                continue
            for t in getattr(msg, "times", None) or ():
                out.setdefault((msg.sensor_id, float(t)), at)
        return out

    def wrap_push(self, fjord: Any) -> None:
        push, stamp = fjord.push, self.pushed.add
        si, ti = 1, 0  # gateway.daemon.TRAFFIC_SCHEMA: time, station, ...

        def timed_push(stream: str, row: tuple) -> None:
            stamp(row[si], row[ti], time.monotonic())
            push(stream, row)

        fjord.push = timed_push

    def wrap_publish(self, hub: Any) -> None:
        """Times rows as the Fjord hands them to the hub (call before adding queries)."""
        stamp, subs = self.published.add, hub._subs  # only subscribed queries reach a client

        def timed(qid: str, cols: Any, publish: Any) -> Any:
            if "station" not in cols or "time" not in cols:
                return publish
            si, ti = list(cols).index("station"), list(cols).index("time")

            def timed_publish(rows: list[tuple]) -> None:
                if qid in subs:
                    now = time.monotonic()
                    for r in rows:
                        stamp(r[si], r[ti], now)
                publish(rows)

            return timed_publish

        make = getattr(hub, "publisher", None)
        if make is not None:  # the daemon's path: one publisher per query
            hub.publisher = lambda qid, cols: timed(qid, cols, make(qid, cols))
            return
        publish_tuples = hub.publish_tuples  # older code: the hub's method per batch
        hub.publish_tuples = lambda qid, cols, rows: timed(
            qid, cols, lambda rows: publish_tuples(qid, cols, rows)
        )(rows)


# -- the fleet --------------------------------------------------------------------------------


def load_fleet(
    hours: float | None, limit: int | None
) -> tuple[str, dict[str, dict[str, Any]], dict[str, list[tuple[float, float]]]]:
    """(source, stations, trace): METR-LA when present, else a generated fleet."""
    if (SHARED / "readings.csv").is_file():
        stations = load_stations(SHARED / "stations.csv")
        trace = load_trace(SHARED / "readings.csv", stations=set(stations))
        source = "METR-LA"
    else:
        stations = generated_stations(207, 40)
        trace = generated_trace(stations, 1_330_588_800, 7 * 86_400, 300.0)
        stations = {k: {"station": k, **v} for k, v in stations.items()}
        source = "generated"
    if limit:
        stations = dict(list(stations.items())[:limit])
        trace = {k: v for k, v in trace.items() if k in stations}
    if hours:
        t0 = min(s[0][0] for s in trace.values())
        trace = {k: [r for r in v if r[0] < t0 + hours * 3600] for k, v in trace.items()}
    return source, stations, trace


def pacers(fleet: TraceReplayFleet, rate: float | None, arrivals: str) -> dict[str, Pacer]:
    """One pacer per mote, all sharing one wall-clock start. `rate` samples/s over the fleet
    (None: as fast as possible). `staggered`: each mote's packets are offset by its share of
    one packet interval (RAW_BATCH readings), as motes that booted at different moments send;
    `aligned`: every mote sends at the same instants (METR-LA's stations share timestamps, so
    each packet interval is then one burst of every mote's packet)."""
    trace = fleet.trace
    period = min(v[1][0] - v[0][0] for v in trace.values() if len(v) > 1)
    n = len(fleet.motes)
    speedup = None if rate is None else rate * period / n
    span = RAW_BATCH * period  # event seconds between one mote's packets
    out = {}
    for i, sid in enumerate(fleet.motes):
        phase = span * i / n if arrivals == "staggered" else 0.0
        out[sid] = Pacer(speedup, origin=fleet.start + phase)
    return out


async def run_motes(fleet: TraceReplayFleet, paced: dict[str, Pacer]) -> None:
    """Every mote replays its readings with its own pacer (hellos already sent)."""
    await asyncio.gather(
        *(
            mote.run(fleet.trace[sid], paced[sid], send_hello=False)
            for sid, mote in fleet.motes.items()
        )
    )


async def client(
    session: aiohttp.ClientSession,
    url: str,
    lat: Stamps,
    stats: dict,
    connected: asyncio.Event | None = None,
    waiting: list[int] | None = None,
) -> None:
    """One SSE client: (station, time) of each row and when it was parsed (CLOCK_MONOTONIC)."""
    async with session.get(url) as resp:
        async for raw in resp.content:
            line = raw.decode().strip()
            if line == ": connected" and waiting is not None and connected is not None:
                waiting[0] -= 1
                if not waiting[0]:
                    connected.set()
            if line.startswith("event: missed"):
                stats["missed_events"] += 1
            if not line.startswith("data: "):
                continue
            row = json.loads(line[6:])
            if "missed" in row and len(row) == 1:
                stats["missed"] += row["missed"]
                continue
            stats["rows"] += 1
            station, t = row.get("station"), row.get("time")
            if isinstance(station, str) and isinstance(t, int | float):
                lat.add(station, t, time.monotonic())


# -- one process (`--topology inprocess`: motes, gateway and clients share it) ----------------


async def run_inprocess(
    n_queries: int,
    n_clients: int,
    hours: float | None,
    limit: int | None,
    rate: float | None,
    arrivals: str,
) -> dict[str, Any]:
    """Motes, gateway and clients in this one process (they share its core)."""
    source, stations, trace = load_fleet(hours, limit)
    cfg = Config()
    cfg.http.port = 0
    cfg.http.client_buffer_rows = 100_000
    cfg.http.max_connections_per_client = 256  # the SSE clients are one address
    cfg.max_lag_seconds = 1e12  # a replay as fast as possible: no sensor is given up on
    sent, lat = Stamps(), Stamps()
    stages = StageClock()
    stats = {"rows": 0, "missed": 0, "missed_events": 0}
    rng = random.Random(7)
    async with make_gateway(cfg) as gw:
        host, port = await gw.start_http()
        stages.wrap_push(gw.fjord)
        stages.wrap_publish(gw.hub)
        ids = [gw.add_query(q).id for q in queries(stations, n_queries, rng)]
        hub = InProcessHub(queue_bound=100_000)
        fleet = TraceReplayFleet(
            trace,
            stations,
            lambda sid: SendClock(hub.link(sid), sent),
            backpressure=False,
            yield_every=1,  # the motes take turns sample by sample
        )
        streamed = streamed_queries(gw, ids, n_clients)
        async with (
            hub,
            ProxyManager(
                gw.fjord,
                [hub],
                queue_bound=100_000,
                on_catalog_change=lambda removed: gw.heap_freezer.changed(removed=removed),
            ) as proxies,
            aiohttp.ClientSession() as http,
        ):
            gw.attach_proxies(proxies)
            readers = [
                asyncio.create_task(
                    client(http, f"http://{host}:{port}/queries/{q}/results", lat, stats)
                )
                for q in streamed
            ]
            # Every mote says hello before any sends data, as a deployed fleet has: a sensor the
            # gateway has heard of holds its stream's windows until it reports.
            for mote in fleet.motes.values():
                await mote.link.send(mote.hello())
            await proxies.settle()
            await asyncio.sleep(0.5)
            rss0 = rss_mb()
            paced = pacers(fleet, rate, arrivals)
            router = gw.fjord.streams["traffic"].router
            warm_index(router)
            steps0 = router.transitions
            start, cpu0 = time.monotonic(), time.process_time()
            await run_motes(fleet, paced)
            await proxies.settle()
            while gw.fjord.scheduler.has_ready():
                await asyncio.sleep(0.01)
            elapsed, cpu = time.monotonic() - start, time.process_time() - cpu0
            await asyncio.sleep(1.0)  # let the clients catch up with what was produced
            for r in readers:
                r.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
        fs = gw.fjord.stats()["streams"]["traffic"]
    head = {
        "topology": "one process",
        "arrivals": arrivals,
        "source": source,
        "stations": len(stations),
        "queries": n_queries,
        "clients": len(streamed),
        "target samples/s": rate or "as fast as possible",
        "samples": fleet.samples,
        "seconds": elapsed,
        "samples_per_s": fleet.samples / elapsed,
        # On a shared machine the process may get a fraction of a core: its CPU seconds tell.
        "cpu_seconds": cpu,
        "samples_per_cpu_s": fleet.samples / cpu,
        "gateway_cpu_us_per_sample": None,
        "samples_per_router_batch": fleet.samples / max(1, router.transitions - steps0),
    }
    return summarize(head, fs, stats, sent.first(), stages, lat.items(), rss0)


FLEET_QUIET_S = 1.0  # [runtime] gc_quiet_s: the daemon's pause after the fleet last changed


async def fleet_settled(gw: Gateway) -> None:
    """Wait for what a daemon does once its fleet has joined and been quiet (a steady
    state, not the minutes after a start): set its state aside from the garbage collector
    (`gateway.gc_freeze`). Older code that does not do it is not waited for long."""
    ll = getattr(gw, "heap_freezer", None)
    if ll is None or not ll.enabled:
        return
    deadline = time.monotonic() + FLEET_QUIET_S + 2.0
    while getattr(ll, "pending", False) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


def warm_index(router: Any) -> None:
    """Build the range index now (it is rebuilt lazily at the first sample after queries
    change): a one-off, not a per-sample cost, kept out of the measured window."""
    for iv in getattr(router.index, "_iv", {}).values():
        with contextlib.suppress(Exception):
            iv._stab(0.0)


def streamed_queries(gw: Gateway, ids: list[str], n_clients: int) -> list[str]:
    """The queries the clients follow: the first `n_clients` whose rows name a sample."""
    return [qid for qid in ids if gw.fjord.queries[qid].columns[:2] == ("time", "station")][
        :n_clients
    ]


def summarize(
    head: dict[str, Any],
    fs: dict[str, Any],
    stats: dict[str, int],
    sent: dict,
    stages: StageClock,
    lat: list[tuple],
    rss0: float,
) -> dict[str, Any]:
    total, to_push, in_fjord, to_client = [], [], [], []
    to_gateway, in_gateway = [], []
    pushed, published = stages.pushed.first(), stages.published.first()
    received = stages.received()
    for key, parsed in lat:
        t0 = sent.get(key)
        if t0 is None:
            continue
        t1, t2 = pushed.get(key), published.get(key)
        total.append(parsed - t0)
        if t1 is not None and t2 is not None:
            to_push.append(t1 - t0)
            in_fjord.append(t2 - t1)
            to_client.append(parsed - t2)
            tr = received.get(key)
            if tr is not None:
                to_gateway.append(tr - t0)
                in_gateway.append(t1 - tr)
    pct = _percentile
    # The same after the first second of sending: proxies starting, first windows closing.
    first = min(sent.values(), default=0.0)
    kept = _kept_pace(sent, pushed)
    steady = [parsed - sent[k] for k, parsed in lat if k in sent and sent[k] >= first + 1.0]
    # ... and over the last second: a backlog that grew during the run shows here.
    end = max(sent.values(), default=0.0)
    last_s = [parsed - sent[k] for k, parsed in lat if k in sent and sent[k] >= end - 1.0]
    return {
        **head,
        "tuples_in": fs["tuples_in"],
        "late": fs["late"],
        "deliveries": fs["deliveries"],
        "client_rows": stats["rows"],
        "missed": stats["missed"],
        "p50_ms": pct(total, 0.50),
        "p99_ms": pct(total, 0.99),
        "after 1 s p50_ms": pct(steady, 0.50),
        "after 1 s p99_ms": pct(steady, 0.99),
        "last 1 s p50_ms": pct(last_s, 0.50),
        "last 1 s p99_ms": pct(last_s, 0.99),
        "mean_ms": statistics.fmean(total) * 1000 if total else float("nan"),
        "send->push p50_ms": pct(to_push, 0.50),
        "send->push p99_ms": pct(to_push, 0.99),
        **(
            {
                "  send->gateway read p50_ms": pct(to_gateway, 0.50),
                "  send->gateway read p99_ms": pct(to_gateway, 0.99),
                "  gateway read->push p50_ms": pct(in_gateway, 0.50),
                "  gateway read->push p99_ms": pct(in_gateway, 0.99),
            }
            if to_gateway
            else {}
        ),
        **kept,
        "push->published p50_ms": pct(in_fjord, 0.50),
        "push->published p99_ms": pct(in_fjord, 0.99),
        "published->client p50_ms": pct(to_client, 0.50),
        "published->client p99_ms": pct(to_client, 0.99),
        "rss_mb_start": rss0,
        "rss_mb_end": rss_mb(),
        "_latencies": total,
    }


def _kept_pace(sent: dict, pushed: dict) -> dict[str, float]:
    """Whether the gateway kept pace, on the samples' own clocks (CLOCK_MONOTONIC, one clock
    for every process): samples sent per second from the first send to the last, against
    samples pushed into the Fjord per second from the first send to the last push. The run's
    `samples_per_s` also counts the harness's signals (the "go" to the motes' process, and
    waiting until the last sample is in), which are not the gateway's."""
    if len(sent) < 2:
        return {}
    first, last = min(sent.values()), max(sent.values())
    pushes = [pushed[k] for k in sent if k in pushed]
    if not pushes or last <= first:
        return {}
    last_push = max(pushes)
    return {
        "sent_per_s (send clocks)": len(sent) / (last - first),
        "pushed_per_s (send clocks)": len(pushes) / (last_push - first),
        "behind at the last send_ms": (last_push - last) * 1000,
    }


# -- separate processes: motes | mosquitto | the gateway (this process) | SSE clients ----------


def _mote_process(conn: Any, *args: Any) -> None:
    """The fleet, in a process of its own, over MQTT as deployed motes reach the gateway
    (`_motes_over_mqtt`'s arguments)."""
    asyncio.run(_motes_over_mqtt(conn, *args))


class _RecordingPacer:
    """A pacer that does not wait: it remembers the reading a mote is at (when it sends)."""

    t = float("-inf")

    async def until(self, t: float) -> None:
        self.t = t


class _RecordingLink:
    """A mote link keeping what its mote sends, with the time of the reading it was at."""

    def __init__(self, sensor_id: str, pacer: _RecordingPacer, out: list) -> None:
        self.sensor_id, self._pacer, self._out = sensor_id, pacer, out

    async def send(self, msg: Any, *, corrupt: Any = None) -> None:
        self._out.append((self._pacer.t, self.sensor_id, msg))

    def set_online(self, online: bool) -> None:
        pass

    async def flow(self) -> None:
        pass

    def poll_controls(self) -> list:
        return []

    async def next_control(self) -> Any:
        await asyncio.Future()  # never: nothing to act on while recording


async def recorded_packets(
    trace: dict, stations: dict, rate: float | None, arrivals: str
) -> tuple[dict[str, Any], list[tuple[float, str, Any]]]:
    """Every mote's hello and its packets in sending order with their send offsets (seconds
    after the start, by `pacers`; 0 for all when `rate` is None): the simulated motes (their
    firmware, energy and packing) run before the clock starts, so the motes' process only
    publishes during the measurement. Returns (hellos, [(offset, sensor, message)])."""
    out: list[tuple[float, str, Any]] = []
    recorders: dict[str, _RecordingPacer] = {}

    def link_for(sid: str) -> Any:
        recorders[sid] = _RecordingPacer()
        return _RecordingLink(sid, recorders[sid], out)

    fleet = TraceReplayFleet(trace, stations, link_for, backpressure=False)
    hellos = {sid: mote.hello() for sid, mote in fleet.motes.items()}
    paced = pacers(fleet, rate, arrivals)
    await asyncio.gather(
        *(m.run(trace[sid], recorders[sid], send_hello=False) for sid, m in fleet.motes.items())
    )
    # A packet leaves when its mote reaches the reading that fills it (as Pacer.until times it).
    timed = [
        (0.0 if rate is None else (t - paced[sid].origin) / paced[sid].speedup, sid, msg)
        for t, sid, msg in out
    ]
    timed.sort(key=lambda x: x[0])  # stable: each mote's packets keep their order
    return hellos, timed


async def _motes_over_mqtt(
    conn: Any,
    port: int,
    hours: float | None,
    limit: int | None,
    rate: float | None,
    arrivals: str,
    motes: str = "replayed",
) -> None:
    """`motes`: "replayed" (default) publishes the packets the simulated motes made before the
    clock started, at their times, through each mote's own MqttMoteLink (the wire traffic of
    "simulated", where the motes' firmware simulation, energy accounting and per-reading pacing
    ran during the measurement, on the gateway's two cores)."""
    from sensors.transports.broker import BrokerSettings
    from sensors.transports.mqtt import MqttMoteLink

    _, stations, trace = load_fleet(hours, limit)
    sent = Stamps()
    links: dict[str, MqttMoteLink] = {}

    def published(msg: Any, epoch: int) -> None:
        """A sample is sent when its packet is published (handed to the mote's socket), not
        when the simulated mote queued it: the generator's own backlog is not the gateway's."""
        times = getattr(msg, "times", None)
        if msg.__class__.__name__ == "Samples" and times:
            now = time.monotonic()
            for t in times:
                sent.add(msg.sensor_id, t, now)

    def link_for(sid: str) -> MqttMoteLink:
        links[sid] = MqttMoteLink(
            sid, BrokerSettings(port=port), queue_bound=100_000, on_published=published
        )
        return links[sid]

    if motes == "replayed":
        hellos, packets = await recorded_packets(trace, stations, rate, arrivals)
        for sid in hellos:
            link_for(sid).hello = lambda h=hellos[sid]: h
        samples = sum(len(trace[s]) for s in hellos)
    else:
        fleet = TraceReplayFleet(trace, stations, link_for, backpressure=False, yield_every=1)
        for sid, link in links.items():
            link.hello = fleet.motes[sid].hello  # published (retained) on connect
        samples = fleet.samples
    async with contextlib.AsyncExitStack() as stack:
        for link in links.values():
            await stack.enter_async_context(link)
        await asyncio.gather(*(link.wait_connected(30) for link in links.values()))
        conn.send(("connected", samples))
        loop = asyncio.get_running_loop()
        assert await loop.run_in_executor(None, conn.recv) == "go"
        start, cpu0 = time.monotonic(), time.process_time()
        if motes == "replayed":
            for offset, sid, msg in packets:
                ahead = offset - (time.monotonic() - start)
                await asyncio.sleep(ahead if ahead > 0.001 else 0)  # the links publish meanwhile
                await links[sid].send(msg)
        else:
            await run_motes(fleet, pacers(fleet, rate, arrivals))
        await asyncio.gather(*(link.drain() for link in links.values()))
        # Controls the gateway sent (recorded packets do not act on them: reported).
        controls = sum(len(link.poll_controls()) for link in links.values())
        cpu = time.process_time() - cpu0
        conn.send(("done", time.monotonic() - start, sent.first(), (controls, cpu)))
        await loop.run_in_executor(None, conn.recv)  # "stop": the links may close


def _client_process(conn: Any, urls: list[str]) -> None:
    """The SSE clients, in a process of their own (a dashboard is not in the gateway)."""
    asyncio.run(_clients(conn, urls))


async def _clients(conn: Any, urls: list[str]) -> None:
    lat = Stamps()
    stats = {"rows": 0, "missed": 0, "missed_events": 0}
    connected, waiting = asyncio.Event(), [len(urls)]
    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        readers = [
            asyncio.create_task(client(http, u, lat, stats, connected, waiting)) for u in urls
        ]
        await connected.wait()
        conn.send("connected")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, conn.recv)  # "stop"
        for r in readers:
            r.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    conn.send((lat.items(), stats))


def _say(text: str) -> None:
    """A phase of a multi-process run, on stderr (where it waits, when it does)."""
    print(f"gateway_load {time.strftime('%H:%M:%S')}: {text}", file=sys.stderr, flush=True)


async def _recv(conn: Any, timeout: float = 300.0) -> Any:
    loop = asyncio.get_running_loop()
    if not await loop.run_in_executor(None, conn.poll, timeout):
        raise TimeoutError("a benchmark process did not answer")
    return conn.recv()


async def run_processes(
    n_queries: int,
    n_clients: int,
    hours: float | None,
    limit: int | None,
    rate: float | None,
    arrivals: str,
    mote_mode: str = "replayed",
) -> dict[str, Any]:
    """The gateway alone in this process, on the daemon's code path (`configure_sources` with
    [mqtt], the proxies, the Fjord, the result hub, aiohttp SSE); the motes in another process
    publishing over a real Mosquitto; the 50 SSE clients in a third."""
    from gateway.config import MqttConfig
    from gateway.sources import configure_sources

    source, stations, _ = load_fleet(hours, limit)
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp, Mosquitto(Path(tmp)) as broker:
        cfg = Config()
        cfg.http.port = 0
        cfg.http.client_buffer_rows = 100_000
        cfg.http.max_connections_per_client = 256  # the SSE clients are one address
        cfg.mqtt = MqttConfig(url=f"mqtt://127.0.0.1:{broker.port}", qos=0)
        cfg.simulation = None  # the embedded defaults' generated fleet: not here
        cfg.max_lag_seconds = 1e12
        cfg.runtime.gc_quiet_s = FLEET_QUIET_S
        gw = make_gateway(cfg)
        configure_sources(gw)
        stages = StageClock()
        stages.wrap_push(gw.fjord)
        stages.wrap_publish(gw.hub)
        stages.wrap_receive()
        # Installed before the links start, as a restarted daemon restores its saved queries
        # (1,000 installs hold the event loop longer than an MQTT keep-alive).
        ids = [gw.add_query(q).id for q in queries(stations, n_queries, random.Random(7))]
        mote_conn, mote_end = ctx.Pipe()
        client_conn, client_end = ctx.Pipe()
        async with gw:
            host, port = await gw.start_http()
            streamed = streamed_queries(gw, ids, n_clients)
            urls = [f"http://{host}:{port}/queries/{q}/results" for q in streamed]
            clients = ctx.Process(target=_client_process, args=(client_end, urls))
            motes = ctx.Process(
                target=_mote_process,
                args=(mote_end, broker.port, hours, limit, rate, arrivals, mote_mode),
            )
            clients.start()
            motes.start()
            try:
                assert await _recv(client_conn) == "connected"
                _say(f"{len(urls)} clients connected")
                kind, samples = await _recv(mote_conn)
                assert kind == "connected"
                # every mote's hello reached its proxy before any data is sent
                deadline = time.monotonic() + 60
                while gw.proxies is None or len(gw.proxies.proxies) < len(stations):
                    if time.monotonic() > deadline:
                        raise TimeoutError("the motes' hellos did not all arrive")
                    await asyncio.sleep(0.05)
                await gw.proxies.settle()
                _say(f"{len(stations)} motes known; go")
                await asyncio.sleep(0.5)
                await fleet_settled(gw)
                rss0 = rss_mb()
                stream = gw.fjord.streams["traffic"].router
                warm_index(stream)
                in0, steps0 = stream.tuples_in, stream.transitions
                mote_conn.send("go")
                start, cpu0 = time.monotonic(), time.process_time()
                kind, send_s, sent, (controls, motes_cpu) = await _recv(mote_conn)
                _say(f"motes done in {send_s:.1f} s; {stream.tuples_in - in0} of {samples} in")
                # what was sent is in: every sample routed (or 30 s of nothing more)
                last, idle_since = stream.tuples_in, time.monotonic()
                while stream.tuples_in - in0 < samples or gw.fjord.scheduler.has_ready():
                    await asyncio.sleep(0.002)
                    if stream.tuples_in != last:
                        last, idle_since = stream.tuples_in, time.monotonic()
                    elif time.monotonic() - idle_since > 30:
                        break
                elapsed, cpu = time.monotonic() - start, time.process_time() - cpu0
                _say(f"{stream.tuples_in - in0} samples in after {elapsed:.1f} s")
                from gateway.drops import drop_counts

                if drops := {k: v for k, v in drop_counts(gw).items() if v}:
                    _say(f"drops: {drops}")
                await asyncio.sleep(1.0)  # let the clients catch up with what was produced
                client_conn.send("stop")
                lat, stats = await _recv(client_conn)
                mote_conn.send("stop")
            finally:
                for p in (clients, motes):
                    p.join(timeout=30)
                    if p.is_alive():
                        p.kill()
            fs = gw.fjord.stats()["streams"]["traffic"]
    head = {
        "topology": "processes (motes, MQTT, gateway, clients)",
        "motes": mote_mode,
        "arrivals": arrivals,
        "source": source,
        "stations": len(stations),
        "queries": n_queries,
        "clients": len(streamed),
        "target samples/s": rate or "as fast as possible",
        "samples": samples,
        "seconds": elapsed,
        "samples_per_s": samples / elapsed,
        "motes_send_samples_per_s": samples / send_s,
        # The gateway process's own CPU: what a deployment pays per sample.
        "cpu_seconds": cpu,
        "samples_per_cpu_s": samples / cpu,
        "gateway_cpu_us_per_sample": cpu / samples * 1e6,
        "samples_per_router_batch": samples / max(1, stream.transitions - steps0),
        # The machine's other loads: the motes' process (the gateway's two cores are shared).
        "motes_process_cpu_share": motes_cpu / send_s,
        "controls_to_motes": controls,
    }
    return summarize(head, fs, stats, sent, stages, lat, rss0)


class Mosquitto:
    """A Mosquitto broker of our own on a free port (QoS 0 motes: nothing persisted)."""

    def __init__(self, workdir: Path) -> None:
        import getpass
        import shutil

        binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        conf = workdir / "mosquitto.conf"
        conf.write_text(
            f"listener {self.port} 127.0.0.1\nuser {getpass.getuser()}\nallow_anonymous true\n"
            "persistence false\nmax_queued_messages 1000000\n"
            f"log_dest file {workdir / 'mosquitto.log'}\n"
        )
        self.args = [binary, "-c", str(conf)]
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Mosquitto:
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited with {self.proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("mosquitto did not start")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def _percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(p * len(v)))] * 1000


def plot(results: list[dict[str, Any]], label: str) -> str | None:
    """Histograms of mote-send-to-client-parse latency, one per rate, log-scaled milliseconds."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    OUT.mkdir(exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 4))
    all_ms = [x * 1000 for r in results for x in r["_latencies"]]
    if not all_ms:
        return None
    lo, hi = max(min(all_ms), 0.01), max(all_ms)
    import numpy as np

    bins = np.logspace(np.log10(lo), np.log10(hi * 1.01), 60)
    for r in results:
        ms = [x * 1000 for x in r["_latencies"]]
        rate = r["target samples/s"]
        name = f"{rate:,.0f} samples/s" if isinstance(rate, float) else str(rate)
        ax.hist(ms, bins=bins, histtype="step", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("mote send -> client parse (ms)")
    ax.set_ylabel("rows")
    ax.set_title(f"Gateway latency ({label}): 1,000 queries, 207 motes, 50 SSE clients")
    ax.legend(fontsize=8)
    fig.tight_layout()
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_")  # a file name without spaces
    path = OUT / f"gateway_load_latency_{slug}.png"
    fig.savefig(path, dpi=110)
    return str(path)


DESCRIPTION = {
    "processes": (
        "four processes, as deployed: the 207 replayed motes (each its own MQTT connection, "
        "publishing its raw packets of 8 readings at QoS 0; `--motes replayed`: the packets "
        "the simulated motes made before the clock started, at their times), a Mosquitto "
        "broker (its default configuration), the gateway "
        "(this process, exactly the daemon's code path: `configure_sources` with `[mqtt]`, the "
        "MQTT transport, the proxies, the Fjord with 1,000 queries, the result hub, aiohttp "
        "SSE) and the 50 SSE clients (aiohttp, one process). `cpu_seconds` and "
        "`gateway_cpu_us_per_sample` are the gateway process's own CPU time."
    ),
    "inprocess": (
        "motes, the in-process transport, the gateway and the 50 SSE clients in ONE process "
        "sharing one core; `cpu_seconds` counts all of them."
    ),
    "staggered": (
        "each mote's packets are offset by its share of one packet interval (8 readings), "
        "as motes booted at different moments send; the fleet's rate is the target."
    ),
    "aligned": (
        "every mote sends at the same instants: METR-LA's stations share timestamps, so each "
        "packet interval is one burst of 207 packets (1,656 samples)."
    ),
}


RUN_LOOP: dict[str, Any] = {}  # gateway.run_loop.RunLoop settings from the command line


def make_gateway(cfg: Config) -> Gateway:
    """The gateway, with `RunLoop` settings given on the command line (older code: none)."""
    if not RUN_LOOP:
        return Gateway(cfg)
    from gateway.run_loop import RunLoop

    return Gateway(cfg, run_loop=RunLoop(**RUN_LOOP))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument(
        "--hours", type=float, default=24.0, help="replay the first H hours (default 24)"
    )
    p.add_argument("--stations", type=int, default=None, help="only the first N stations")
    p.add_argument(
        "--rates",
        default="10000,20000,max",
        help="paced rates in samples/s, 'max' for as fast as possible (default 10000,20000,max)",
    )
    p.add_argument(
        "--topology",
        choices=["processes", "inprocess"],
        default="processes",
        help="processes (default): motes | Mosquitto | gateway | SSE clients, each its own "
        "process; inprocess: all in one process, over the in-process transport",
    )
    p.add_argument(
        "--arrivals",
        choices=["staggered", "aligned"],
        default="staggered",
        help="staggered (default): each mote's packets offset by its share of a packet "
        "interval; aligned: every mote sends at the same instants (one burst per interval)",
    )
    p.add_argument(
        "--motes",
        choices=["replayed", "simulated"],
        default="replayed",
        help="replayed (default): the simulated motes' packets are made before the clock "
        "starts and published at their times through each mote's MQTT link; simulated: the "
        "motes' firmware, energy accounting and pacing run during the measurement (on the "
        "gateway's cores)",
    )
    p.add_argument("--router-slice", type=int, help="RunLoop.router_slice_rows (default: its)")
    p.add_argument("--gather-ms", type=float, help="RunLoop.gather_ms (default: its)")
    p.add_argument("--label", default="after", help="the run's name in RESULTS.md and the plot")
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args(argv)
    rates = [None if r == "max" else float(r) for r in args.rates.split(",")]
    if args.router_slice is not None:
        RUN_LOOP["router_slice_rows"] = args.router_slice
    if args.gather_ms is not None:
        RUN_LOOP["gather_ms"] = args.gather_ms
    results = []
    for rate in rates:
        label = f"paced at {rate:,.0f} samples/s" if rate else "as fast as possible"
        with console.status(
            f"replay {label}: motes, proxies, the Fjord and {args.clients} SSE clients..."
        ):
            run_args = (args.queries, args.clients, args.hours, args.stations, rate, args.arrivals)
            results.append(
                asyncio.run(
                    run_processes(*run_args, mote_mode=args.motes)
                    if args.topology == "processes"
                    else run_inprocess(*run_args)
                )
            )
    heads = [f"paced ({r:,.0f}/s)" if r else "as fast as possible" for r in rates]
    cols = ["measure", *heads]
    keys = [k for k in results[0] if not k.startswith("_")]
    rows = [[k, *[r[k] for r in results]] for k in keys]
    console.print(table(f"Gateway under load ({args.label})", cols, rows))
    png = plot(results, args.label)
    OUT.mkdir(exist_ok=True)
    saved = {h: {k: r[k] for k in keys} for h, r in zip(heads, results, strict=True)}
    (OUT / f"gateway_load_{args.label}.json").write_text(json.dumps(saved, indent=1))
    before = OUT / "gateway_load_before.json"
    side = ""
    if args.label != "before" and before.is_file():
        old = json.loads(before.read_text())
        both = [h for h in heads if h in old]
        if both:
            bcols = ["measure"] + [f"{h} {w}" for h in both for w in ("before", args.label)]
            brows = [
                [k, *[v for h in both for v in (old[h].get(k, ""), saved[h][k])]] for k in keys
            ]
            console.print(table("Before and after", bcols, brows))
            side = (
                "\n\n### Before (`gateway_load_before.json`) and after, same rates\n\n"
                + markdown(bcols, brows)
            )
    goals = []
    fastest = max(r["samples_per_s"] for r in results)
    goals.append(
        f"- throughput: {fastest:,.0f} samples/s at the most (as fast as the motes send, a "
        "backlog waiting: its latency is the backlog's)"
    )
    for r, rate in zip(results, rates, strict=True):
        if rate == 20_000:  # keeping pace: (almost) every sample sent is handled as it comes
            sent = r.get("sent_per_s (send clocks)", r.get("motes_send_samples_per_s", rate))
            took = r.get("pushed_per_s (send clocks)", r["samples_per_s"])
            keeps = took >= 0.99 * sent and took >= 19_800 and not (r["late"] or r["missed"])
            goals.append(
                f"- paced at 20,000 samples/s: the motes sent {sent:,.0f}/s, the gateway took "
                f"them in at {took:,.0f}/s ({took / sent:.1%}; first send to last push, "
                f"{r.get('behind at the last send_ms', float('nan')):.1f} ms behind the last "
                f"send), p50 {r['p50_ms']:.1f} ms (goal: sustains 20,000/s, i.e. keeps pace "
                f"with at least 99% of what is sent: {'met' if keeps else 'NOT met'}); "
                f"{r['samples_per_s']:,.0f}/s from the harness's go to the last sample in"
            )
    for r, rate in zip(results, rates, strict=True):
        if rate == 10_000:
            ok = r["p50_ms"] < 2 and r["p99_ms"] < 10
            goals.append(
                f"- at 10,000 samples/s: p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms "
                f"(goal p50 < 2 ms, p99 < 10 ms: {'met' if ok else 'NOT met'}); achieved "
                f"{r['samples_per_s']:,.0f} samples/s"
            )
    for g in goals:
        console.print(g)
    if png:
        console.print(f"plot: {png}")
    if not args.no_record:
        record(
            "gateway_load",
            f"`python -m benchmarks.gateway_load --topology {args.topology} --arrivals "
            f"{args.arrivals}{'' if args.label == 'after' else f' --label {args.label}'}`: "
            + DESCRIPTION[args.topology]
            + " Arrivals: "
            + DESCRIPTION[args.arrivals]
            + " Latency: mote send to client parse (CLOCK_MONOTONIC, shared by the processes), "
            "and its stages (send -> gateway socket read -> Fjord push -> published to the result "
            "hub -> client parse)."
            + (" " + drawn("Histogram", Path(png).name) if png else "")
            + "\n\n"
            + markdown(cols, rows)
            + "\n\n"
            + "\n".join(goals)
            + side,
        )


if __name__ == "__main__":
    main()
