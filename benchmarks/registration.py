"""Registering queries over the daemon's HTTP API: the 10,000th POST costs what the 1st did.

    python -m benchmarks.registration [--queries 10000] [--stations 207] [--no-record]

Starts the real daemon (`python -m gateway.cli run --no-state`) with its simulated fleet
(207 motes in 40 segments, readings flowing) and `max_queries` raised, then POSTs the
gateway_load query mix one after another over one keep-alive connection. Per block of
1,000: mean and p99 POST latency, and, in the same run, the Fjord's own install of the same
queries in this process (`Fjord.add_query`: parsing, planning, folding into the running plan;
no HTTP, no proxies), the floor the POST stands on. Then each mote's hello to proxies that
hold all those queries (a restart: the fleet says hello to a gateway with saved queries).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import aiohttp
from rich.progress import Progress

from benchmarks.common import console, markdown, record, table
from benchmarks.gateway_load import queries
from fjords.engine import Engine
from fjords.limits import DEFAULT_LIMITS
from fjords.runtime.fjord import Fjord
from gateway.daemon import TRAFFIC_SCHEMA
from gateway.fleet import generated_stations
from proxies.manager import ProxyManager
from sensors.protocol import Hello

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def daemon(stations: int, segments: int, max_queries: int):
    """The gateway as `fjords-gateway run` starts it, in its own process; yields its URL."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "gateway.toml"
        cfg.write_text(  # (POSTs as fast as they go: the write rate per client is off)
            "[http]\nwrite_rate_per_s = 0\n\n"
            f"[limits]\nmax_queries = {max_queries}\n\n"
            f"[simulation]\nstations = {stations}\nsegments = {segments}\n"
        )
        cmd = [sys.executable, "-m", "gateway.cli", "run", "--no-state", "--config", str(cfg)]
        cmd += ["--http", f"127.0.0.1:{port}", "--log-level", "warning"]
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


async def post_all(url: str, sqls: list[str], sensors: int) -> list[float]:
    async with aiohttp.ClientSession(url) as http:
        for _ in range(600):  # until it answers and the fleet said hello
            with contextlib.suppress(aiohttp.ClientError):
                r = await http.get("/sensors")
                if r.status == 200 and len((await r.json())["sensors"]) >= sensors:
                    break
            await asyncio.sleep(0.1)
        else:
            raise SystemExit("the daemon did not come up with its fleet in 60 s")
        times = []
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("POST /queries", total=len(sqls))
            for sql in sqls:
                t = time.perf_counter()
                r = await http.post("/queries", json={"sql": sql})
                await r.read()
                times.append(time.perf_counter() - t)
                if r.status != 201:
                    raise SystemExit(f"POST failed ({r.status}): {await r.text()}")
                progress.advance(task)
        return times


def fjord_installs(sqls: list[str]) -> tuple[list[float], Fjord]:
    fjord = Engine(Fjord(limits=replace(DEFAULT_LIMITS, max_queries=len(sqls))))
    fjord.fjord.add_stream("traffic", TRAFFIC_SCHEMA, sensor_field="station")
    times = []
    for sql in sqls:
        t = time.perf_counter()
        fjord.add_query(sql)
        times.append(time.perf_counter() - t)
    return times, fjord


def hellos(fjord: Engine, fleet: dict[str, dict]) -> list[float]:
    """Each mote's hello to proxies that already hold every query (a gateway restarted with
    its saved queries, the fleet saying hello): the proxy made, its demand and program."""
    manager = ProxyManager(fjord, [], max_sensors=len(fleet) + 1)
    times = []
    for sid, attrs in fleet.items():
        hello = Hello(
            sensor_id=sid,
            schema=(("speed", "float"),),
            programs=("aggregate", "filter", "raw"),
            program="raw",
            sample_period_ms=300_000.0,
            attributes={"station": sid, **attrs},
        )
        t = time.perf_counter()
        manager.registry.create(hello, 0.0)  # what the manager does with a new sensor's hello
        times.append(time.perf_counter() - t)
    return times


def p99(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(0.99 * len(s)))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.registration", description=__doc__)
    p.add_argument("--queries", type=int, default=10_000)
    p.add_argument("--stations", type=int, default=207)
    p.add_argument("--segments", type=int, default=40)
    p.add_argument("--block", type=int, default=1000)
    p.add_argument("--no-record", action="store_true", help="print only")
    args = p.parse_args(argv)
    fleet = generated_stations(args.stations, args.segments)
    sqls = queries(
        {k: {"station": k, **v} for k, v in fleet.items()}, args.queries, random.Random(7)
    )
    with daemon(args.stations, args.segments, args.queries + 10) as url:
        # the fleet's motes, the loop pair's two: at least `stations` hellos
        posts = asyncio.run(post_all(url, sqls, args.stations))
    installs, fjord = fjord_installs(sqls)
    said = hellos(fjord, fleet)
    rows = []
    first = None
    for i in range(0, len(sqls), args.block):
        post, inst = posts[i : i + args.block], installs[i : i + args.block]
        mean = sum(post) / len(post) * 1000
        first = first or mean
        rows.append(
            [
                f"{i + 1:,}-{i + len(post):,}",
                mean,
                p99(post) * 1000,
                mean / first,
                sum(inst) / len(inst) * 1e6,
            ]
        )
    cols = ["queries", "POST mean ms", "POST p99 ms", "x first block", "Fjord install us"]
    console.print(table(f"Registering {args.queries:,} queries, {args.stations} motes", cols, rows))
    # The first hello of a kind of sensor analyses every query for it; the others reuse that.
    rest = said[1:] or said
    hcols = ["motes", "queries held", "first hello ms", "others mean ms", "others p99 ms"]
    hcols.append("all hellos s")
    hrows = [
        [
            len(said),
            args.queries,
            said[0] * 1000,
            sum(rest) / len(rest) * 1000,
            p99(rest) * 1000,
            sum(said),
        ]
    ]
    console.print(table("Hellos to proxies holding every query (a restart)", hcols, hrows))
    if not args.no_record:
        record(
            "registration",
            f"`python -m benchmarks.registration`: the daemon (`gateway.cli run --no-state`, "
            f"{args.stations} simulated motes in {args.segments} segments, readings flowing) "
            f"registers {args.queries:,} queries of the gateway_load mix, one POST after "
            "another on one keep-alive connection; beside it, the same queries' install in a "
            "bare Fjord in the benchmark's process (no HTTP, no proxies).\n\n"
            + markdown(cols, rows)
            + "\n\nThen, in the benchmark's process, each mote's hello to a proxy manager "
            "over that Fjord (every query already there, as after a restart): the proxy, its "
            "demand and its program. The first hello of a kind of sensor analyses every query "
            "for it; the others reuse that.\n\n" + markdown(hcols, hrows),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
