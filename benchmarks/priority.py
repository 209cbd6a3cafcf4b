"""PRIORITY under saturation: a high-priority query's result latency, round-robin vs ticket.

One Fjord is saturated by many low-priority expensive queries (PRIORITY 10); one cheap
high-priority query (one station's samples, PRIORITY 1000) runs beside them. Samples are pushed
from an asyncio task at a fixed rate above what the low-priority queries can process (calibrated
on this machine first), while the scheduler runs as in the daemon (`Scheduler.run`). The latency
of each high-priority result is the time from the push of its sample to its row reaching the
query's sink callback. Both schedulers run in the same process, one after the other, with the
same load, so the ratio is what counts.

The low-priority load (`--load`) must run in scheduled operators for the scheduler to separate
anything: `rows` (the default), a count window per query (`[ROWS n]`, each a different n so none
is shared) averaging a long arithmetic expression per sample, is scheduled. `projection`, the
same expression as a projection of every sample, is fused: it runs inside the
stream router's transition (which holds the highest priority of its queries), so the overload
backs up in the stream's queue in front of the high-priority query too; inside a router batch
the high-priority query's rows are handed over first, which is all PRIORITY can do there.

  python -m benchmarks.priority [--quick] [--no-record] [--load rows|projection] [--queries N]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time

from benchmarks.common import console, markdown, record, table
from fjords.engine import Engine
from fjords.runtime.fjord import Fjord
from fjords.runtime.scheduler import make_scheduler
from fjords.schema import Schema

SCHEMA = Schema(
    [("time", "int"), ("station", "str"), ("speed", "float"), ("segment", "str")], time="time"
)
HP_STATION = "hp"
HP_EVERY = 20  # one sample in 20 is the high-priority query's station
HIGH, LOW = 1000, 10


def heavy_expr(depth: int) -> str:
    """`((speed * 1.01 + 1) * 1.01 + 1) ...`: a projection that costs per sample."""
    e = "speed"
    for _ in range(depth):
        e = f"({e} * 1.01 + 1)"
    return e


def low_query(depth: int, k: int = 0, load: str = "rows") -> str:
    """The k-th low-priority query: a count window of its own size (not shared), or (the
    `projection` load) a projection, which runs fused inside the router."""
    if load == "projection":
        return f"SELECT station, {heavy_expr(depth)} AS x FROM traffic PRIORITY {LOW}"
    return (
        f"SELECT station, AVG({heavy_expr(depth)}) AS x FROM traffic [ROWS {200 + k}] "
        f"GROUP BY station PRIORITY {LOW}"
    )


HIGH_QUERY = (
    f"SELECT time, station, speed FROM traffic WHERE station = '{HP_STATION}' PRIORITY {HIGH}"
)


def sample(i: int) -> tuple:
    station = HP_STATION if i % HP_EVERY == 0 else f"st{i % 97}"
    return (i, station, float(i % 80), "S1")


def build(
    scheduler: str, n_low: int, depth: int, load: str = "rows"
) -> tuple[Fjord, list[float], list[int]]:
    """The saturated Fjord: latencies (s) of the high-priority rows, and the samples the
    low-priority queries took in (their operators' input: a count window emits rarely)."""
    f = Engine(Fjord(make_scheduler(scheduler)))
    f.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    low_rows = [0]
    for k in range(n_low):
        rq = f.add_query(low_query(depth, k, load), query_id=f"low{k}")
        if load == "projection":

            def count(rows: list[tuple]) -> None:
                low_rows[0] += len(rows)

            rq.sink.add_batch_callback(count)
        else:
            assert not rq.fused, "the low-priority load must be scheduled"
    f.add_query(HIGH_QUERY, query_id="high")
    return f, [], low_rows


def _low_done(f: Engine, low_rows: list[int], load: str) -> int:
    """Samples the low-priority queries have processed so far (summed over the queries)."""
    if load == "projection":
        return low_rows[0]
    return sum(
        rq.shared.aggregate.tuples_in
        for qid, rq in f.fjord.queries.items()
        if qid != "high" and rq.shared is not None
    )


def calibrate(n_low: int, depth: int, load: str = "rows", n: int = 20_000) -> float:
    """Samples/s this machine gets through all queries (synchronously, no waiting)."""
    f, _, _ = build("round-robin", n_low, depth, load)
    start = time.perf_counter()
    f.fjord.push_many("traffic", (sample(i) for i in range(n)))
    f.fjord.run_until_idle()
    return n / (time.perf_counter() - start)


async def measure(
    scheduler: str,
    n_low: int,
    depth: int,
    rate: float,
    seconds: float,
    warmup: float,
    load: str = "rows",
) -> dict[str, float]:
    f, _, low_rows = build(scheduler, n_low, depth, load)
    pushed_at: dict[int, float] = {}
    latencies: list[float] = []
    measuring = [False]
    clock = time.perf_counter

    def on_high(rows: list[tuple]) -> None:
        now = clock()
        for r in rows:
            t0 = pushed_at.pop(r[0], None)
            if t0 is not None:
                latencies.append(now - t0)

    f.fjord.queries["high"].sink.add_batch_callback(on_high)
    runner = asyncio.create_task(f.fjord.run())
    sent = high_pushed = 0
    start = clock()
    low_at_start = 0
    try:
        while True:
            await asyncio.sleep(0.001)
            now = clock()
            if not measuring[0] and now - start >= warmup:
                measuring[0], low_at_start = True, _low_done(f, low_rows, load)
            if now - start >= warmup + seconds:
                break
            due = int((now - start) * rate)
            batch = []
            for i in range(sent, due):
                if i % HP_EVERY == 0 and measuring[0]:
                    pushed_at[i] = now
                    high_pushed += 1
                batch.append(sample(i))
            sent = due
            f.fjord.push_many("traffic", batch)
    finally:
        f.fjord.stop()
        await runner
    stats = f.fjord.stats()
    drops = stats["streams"]["traffic"]["queue_drops"] + sum(
        q["queue_drops"] for q in stats["queries"].values()
    )
    latencies.sort()
    n = len(latencies)
    return {
        "p50_ms": 1000 * statistics.median(latencies) if n else float("nan"),
        "p99_ms": 1000 * latencies[min(n - 1, int(0.99 * n))] if n else float("nan"),
        "high_rows": n,
        "high_pushed": high_pushed,
        "low_rows_s": (_low_done(f, low_rows, load) - low_at_start) / seconds,
        "drops": drops,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.priority", description=__doc__)
    p.add_argument("--quick", action="store_true", help="a short run (no record)")
    p.add_argument("--no-record", action="store_true", help="do not write RESULTS.md")
    p.add_argument("--queries", type=int, default=20, help="low-priority queries")
    p.add_argument(
        "--load",
        choices=["rows", "projection"],
        default="rows",
        help="low-priority work: count windows (scheduled) or projections (fused)",
    )
    p.add_argument("--depth", type=int, default=10, help="operations per low-priority row")
    p.add_argument("--seconds", type=float, default=6.0, help="measured seconds per scheduler")
    p.add_argument("--overload", type=float, default=2.0, help="offered load / capacity")
    args = p.parse_args(argv)
    seconds = 2.0 if args.quick else args.seconds
    load = args.load
    capacity = calibrate(args.queries, args.depth, load)
    rate = args.overload * capacity
    console.print(
        f"capacity with {args.queries} low-priority queries ({load}): {capacity:,.0f} samples/s; "
        f"offering {rate:,.0f} samples/s ({args.overload:g}x) for {seconds:g} s per scheduler"
    )
    results = {}
    for name in ("round-robin", "ticket"):
        gc.collect()
        results[name] = asyncio.run(
            measure(name, args.queries, args.depth, rate, seconds, warmup=1.0, load=load)
        )
    columns = [
        "scheduler",
        "high p50 ms",
        "high p99 ms",
        "high rows",
        "high pushed",
        "low rows/s",
        "drops",
    ]
    rows = [
        [
            name,
            r["p50_ms"],
            r["p99_ms"],
            int(r["high_rows"]),
            int(r["high_pushed"]),
            r["low_rows_s"],
            int(r["drops"]),
        ]
        for name, r in results.items()
    ]
    rr, tk = results["round-robin"], results["ticket"]
    console.print(table("high-priority result latency under saturation", columns, rows))
    summary = (
        f"- p50 round-robin / ticket: {rr['p50_ms'] / tk['p50_ms']:.1f}x; "
        f"p99: {rr['p99_ms'] / tk['p99_ms']:.1f}x"
    )
    console.print(summary)
    if args.quick or args.no_record:
        return
    if load == "rows":
        what = (
            f"a count window each (`[ROWS n]`, n = 200..{199 + args.queries}, so none is "
            f"shared) of AVG of a {args.depth}-operation expression per sample, GROUP BY "
            "station: scheduled operators"
        )
        after = (
            "\n\nUnder round-robin the high-priority rows wait behind the backlog of every query "
            "(it grows for as long as the overload lasts, until the queues' bound sheds it, so "
            "its latency depends on the run's length); under ticket the high-priority query "
            "(fused: it runs inside the stream router, which inherits the highest priority of "
            "its queries, and gets its rows first in each router batch) runs as soon as samples "
            "arrive, so it waits at most about one low-priority transition, and the low-priority "
            "queries absorb the overload (their backlog grows, until their queues' bound sheds "
            "it: drops). Low rows/s: samples the low-priority windows took in, summed over the "
            "queries.\n"
        )
    else:
        what = (
            f"a {args.depth}-operation projection of every sample, fused: it runs "
            "inside the stream router's transition"
        )
        after = (
            "\n\nThe projections run inside the stream router (fused), which holds the highest "
            "priority of its queries: there is no low-priority operator left to schedule, and "
            "the overload backs up in the stream's queue, in front of the high-priority query "
            "as much as of the others, under either scheduler. Inside each router batch the "
            "high-priority query's rows are handed over first; what remains is the wait in the "
            "stream's queue. This is why the benchmark's default load is count windows "
            "(`--load rows`), which stay scheduled.\n"
        )
    body = (
        f"`python -m benchmarks.priority --load {load}`. One Fjord, "
        f"{args.queries} low-priority queries (PRIORITY {LOW}, {what}) and one high-priority "
        f"query (PRIORITY {HIGH}, one sample "
        f"in {HP_EVERY}); samples pushed from an asyncio task at {args.overload:g}x the measured "
        f"capacity ({capacity:,.0f} samples/s, so {rate:,.0f} samples/s) for {seconds:g} s per "
        "scheduler after 1 s of warm-up, the scheduler running as in the daemon. Latency: push "
        "of a sample to its result row at the sink, for the samples pushed while measuring (high "
        "rows < high pushed: the rest were still queued at the end). Drops: samples the full "
        "queues shed (oldest first, counted), i.e. the overload.\n\n"
        + markdown(columns, rows)
        + "\n\n"
        + summary
        + after
    )
    record("priority" if load == "rows" else f"priority ({load} load)", body)


if __name__ == "__main__":
    main()
