"""Load on the whole gateway: 1,000 registered queries, 207 replayed motes, 50 SSE clients.

Every sample takes the real path: a simulated mote sends it over the in-process transport, its
proxy pushes it into the Fjord, the queries run, and result rows stream to 50 HTTP clients
reading Server-Sent Events, all in one process on one core (as the daemon runs). Latency is
from the moment a mote sends a sample to the moment a client has parsed the row it produced,
split in three stages: mote send -> Fjord push (transport, proxy), push -> result published
(the Fjord, to the result hub), published -> client parse (SSE writing, the client). The
latency histograms are plotted into benchmarks/out/gateway_load_latency.png (matplotlib).

  python -m benchmarks.gateway_load [--stations N] [--hours H] [--rates 10000,20000,max]
      [--label NAME] [--no-record]

`--label` names the run in RESULTS.md, so a run of older code (`PYTHONPATH=/work/main python
benchmarks/gateway_load.py --label before`) is kept beside the current one.

Uses METR-LA from ../shared/data when present (207 stations); otherwise a generated fleet.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.common import console, markdown, record, table
from gateway.config import Config
from gateway.daemon import Gateway
from gateway.fleet import generated_stations, generated_trace
from proxies.manager import ProxyManager
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


class SendClock:
    """Wraps a mote's link: when each sample (station, time) left the mote."""

    def __init__(self, link: Any, sent: dict[tuple[str, float], float]) -> None:
        self._link, self._sent = link, sent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._link, name)

    async def send(self, msg: Any, **kw: Any) -> None:
        times = getattr(msg, "times", None)
        if msg.__class__.__name__ == "Samples" and times:
            now = time.perf_counter()
            for t in times:
                self._sent[(msg.sensor_id, float(t))] = now
        await self._link.send(msg, **kw)


class StageClock:
    """When each sample (station, time) was pushed into the Fjord and when the row it produced
    was published to the result hub (first time each)."""

    def __init__(self) -> None:
        self.pushed: dict[tuple[str, float], float] = {}
        self.published: dict[tuple[str, float], float] = {}

    def wrap_push(self, fjord: Any) -> None:
        push, pushed = fjord.push, self.pushed
        si, ti = 1, 0  # gateway.daemon.TRAFFIC_SCHEMA: time, station, ...

        def timed_push(stream: str, row: tuple) -> None:
            pushed.setdefault((row[si], float(row[ti])), time.perf_counter())
            push(stream, row)

        fjord.push = timed_push

    def wrap_publish(self, hub: Any) -> None:
        publish, published = hub.publish, self.published

        def timed_publish(qid: str, rows: list[dict[str, Any]]) -> None:
            now = time.perf_counter()
            for r in rows:
                key = (r.get("station"), r.get("time"))
                if key[0] is not None and key not in published:
                    published[key] = now
            publish(qid, rows)

        hub.publish = timed_publish
        publish_tuples = getattr(hub, "publish_tuples", None)
        if publish_tuples is None:
            return

        def timed_publish_tuples(qid: str, cols: tuple[str, ...], rows: list[tuple]) -> None:
            if "station" in cols and "time" in cols and hub.subscribers(qid):
                si, ti, now = cols.index("station"), cols.index("time"), time.perf_counter()
                for r in rows:
                    published.setdefault((r[si], r[ti]), now)
            publish_tuples(qid, cols, rows)

        hub.publish_tuples = timed_publish_tuples  # the daemon's path since the result sinks


async def client(
    session: aiohttp.ClientSession, url: str, sent: dict, lat: list[tuple], stats: dict
) -> None:
    async with session.get(url) as resp:
        async for raw in resp.content:
            line = raw.decode().strip()
            if line.startswith("event: missed"):
                stats["missed_events"] += 1
            if not line.startswith("data: "):
                continue
            row = json.loads(line[6:])
            if "missed" in row and len(row) == 1:
                stats["missed"] += row["missed"]
                continue
            stats["rows"] += 1
            key = (row.get("station"), row.get("time"))
            if key in sent:
                lat.append((key, time.perf_counter()))


async def run(
    n_queries: int, n_clients: int, hours: float | None, limit: int | None, rate: float | None
) -> dict[str, Any]:
    """One replay; `rate` paces it at that many samples/s (None: as fast as possible)."""
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
    cfg = Config()
    cfg.http.port = 0
    cfg.http.client_buffer_rows = 100_000
    cfg.max_lag_seconds = 1e12  # a replay as fast as possible: no sensor is given up on
    sent: dict[tuple[str, float], float] = {}
    lat: list[tuple] = []
    stages = StageClock()
    stats = {"rows": 0, "missed": 0, "missed_events": 0}
    rng = random.Random(7)
    async with Gateway(cfg) as gw:
        host, port = await gw.start_http()
        stages.wrap_push(gw.fjord)
        stages.wrap_publish(gw.hub)
        ids = [gw.add_query(q).id for q in queries(stations, n_queries, rng)]
        hub = InProcessHub(queue_bound=100_000)
        # yield_every=1: the motes take turns sample by sample, so no sensor races hours ahead
        # of the others in event time (the proxies judge liveness by stream time).
        fleet = TraceReplayFleet(
            trace,
            stations,
            lambda sid: SendClock(hub.link(sid), sent),
            backpressure=False,
            yield_every=1,
        )
        samples = fleet.samples
        streamed = [qid for qid in ids if gw.fjord.queries[qid].columns[:2] == ("time", "station")][
            :n_clients
        ]
        async with (
            hub,
            ProxyManager(gw.fjord, [hub], queue_bound=100_000) as proxies,
            aiohttp.ClientSession() as http,
        ):
            gw.attach_proxies(proxies)
            readers = [
                asyncio.create_task(
                    client(http, f"http://{host}:{port}/queries/{q}/results", sent, lat, stats)
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
            period = min(v[1][0] - v[0][0] for v in trace.values() if len(v) > 1)
            speedup = None if rate is None else rate * period / len(fleet.motes)
            start, cpu0 = time.perf_counter(), time.process_time()
            await fleet.run(speedup=speedup)
            await proxies.settle()
            while gw.fjord.scheduler.has_ready():
                await asyncio.sleep(0.01)
            elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu0
            await asyncio.sleep(1.0)  # let the clients catch up with what was produced
            for r in readers:
                r.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
        fs = gw.fjord.stats()["streams"]["traffic"]
    total, to_push, in_fjord, to_client = [], [], [], []
    for key, parsed in lat:
        t0, t1, t2 = sent[key], stages.pushed.get(key), stages.published.get(key)
        total.append(parsed - t0)
        if t1 is not None and t2 is not None:
            to_push.append(t1 - t0)
            in_fjord.append(t2 - t1)
            to_client.append(parsed - t2)
    pct = _percentile
    return {
        "source": source,
        "stations": len(stations),
        "queries": n_queries,
        "clients": len(streamed),
        "target samples/s": rate or "as fast as possible",
        "samples": samples,
        "seconds": elapsed,
        "samples_per_s": samples / elapsed,
        # On a shared machine the process may get a fraction of a core: its CPU seconds tell.
        "cpu_seconds": cpu,
        "samples_per_cpu_s": samples / cpu,
        "tuples_in": fs["tuples_in"],
        "late": fs["late"],
        "deliveries": fs["deliveries"],
        "client_rows": stats["rows"],
        "missed": stats["missed"],
        "p50_ms": pct(total, 0.50),
        "p99_ms": pct(total, 0.99),
        "mean_ms": statistics.fmean(total) * 1000 if total else float("nan"),
        "send->push p50_ms": pct(to_push, 0.50),
        "send->push p99_ms": pct(to_push, 0.99),
        "push->published p50_ms": pct(in_fjord, 0.50),
        "push->published p99_ms": pct(in_fjord, 0.99),
        "published->client p50_ms": pct(to_client, 0.50),
        "published->client p99_ms": pct(to_client, 0.99),
        "rss_mb_start": rss0,
        "rss_mb_end": rss_mb(),
        "_latencies": total,
    }


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
    path = OUT / f"gateway_load_latency_{label}.png"
    fig.savefig(path, dpi=110)
    return str(path)


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
    p.add_argument("--label", default="after", help="the run's name in RESULTS.md and the plot")
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args(argv)
    rates = [None if r == "max" else float(r) for r in args.rates.split(",")]
    results = []
    for rate in rates:
        label = f"paced at {rate:,.0f} samples/s" if rate else "as fast as possible"
        with console.status(
            f"replay {label}: motes, proxies, the Fjord and {args.clients} SSE clients..."
        ):
            results.append(
                asyncio.run(run(args.queries, args.clients, args.hours, args.stations, rate))
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
        f"- sustained {fastest:,.0f} samples/s (goal 20,000: "
        f"{'met' if fastest >= 20_000 else 'NOT met'})"
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
            "gateway_load" if args.label == "after" else f"gateway_load ({args.label})",
            "`python -m benchmarks.gateway_load`: every sample through a simulated mote, the "
            "in-process transport, its proxy, the Fjord (1,000 queries) and 50 SSE clients, in one "
            "process. Latency: mote send to client parse, and its stages (send -> Fjord push -> "
            "published to the result hub -> client parse)."
            + (f" Histogram: `benchmarks/out/{Path(png).name}`." if png else "")
            + "\n\n"
            + markdown(cols, rows)
            + "\n\n"
            + "\n".join(goals)
            + side,
        )


if __name__ == "__main__":
    main()
