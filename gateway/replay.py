"""`fjords-gateway replay`: a recorded trace through the real path, printing every result row.

One simulated mote per station replays its readings over the in-process transport; the sensor
proxies turn them into tuples (choosing each mote's program from the queries, as they would for
live motes) and push them into one shared Fjord. Rows are printed as they are produced, one JSON
object per line with the query's index under "query". At the end of the trace every window that
has data is closed and emitted. `--engine spark` runs the same queries on Spark instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TextIO

from fjords.engine import Engine
from fjords.output import ndjson_printer
from fjords.runtime.fjord import Fjord
from fjords.runtime.progress import ProgressPolicy
from fjords.trace import Trace
from proxies.manager import ProxyManager
from sensors.motes.replay import TraceReplayFleet, load_stations, load_trace
from sensors.transports.inprocess import InProcessHub


@dataclass
class TraceReplay:
    """A finished replay of a trace: its Fjord, proxies and fleet, for tests and reports."""

    fjord: Fjord
    proxies: ProxyManager
    fleet: TraceReplayFleet


async def replay_trace(
    readings: str,
    queries: list[str],
    *,
    stations: str | None = None,
    stream: str = "traffic",
    tables: list[tuple[str, str]] = (),  # type: ignore[assignment]
    speedup: float | None = None,
    out: TextIO | None = None,
    pushdown: bool = True,
) -> TraceReplay:
    """Replay `readings` (one mote per station; `stations` adds their attributes) and print the
    queries' rows."""
    out = out if out is not None else sys.stdout  # looked up now: callers may have redirected it
    known = Trace(readings, stations)
    schema = known.schema  # the trace's columns plus the station attributes
    # A replay is complete: no sensor is ever given up on, however far the others run ahead.
    fjord = Fjord(max_lag=math.inf, progress=ProgressPolicy(idle_timeout_s=math.inf))
    fjord.add_stream(stream, schema, sensor_field="station")
    fjord.catalog.streams[stream].sensors = known.attributes  # type: ignore[assignment]
    for name, path in tables:
        fjord.add_table(name, path)
    engine = Engine(fjord)
    for i, sql in enumerate(queries):
        q = engine.add_query(sql, query_id=str(i))
        q.sink.add_batch_callback(ndjson_printer(i, q.columns, out))
    hub = InProcessHub()
    trace = load_trace(readings)
    attrs = load_stations(stations) if stations else {sid: {} for sid in trace}
    fleet = TraceReplayFleet(trace, attrs, hub.link)
    async with (
        hub,
        ProxyManager(fjord, [hub], stream_for=lambda hello: stream, pushdown=pushdown) as proxies,
    ):
        proxies.queries_changed()
        runner = asyncio.create_task(fjord.run(), name="fjord")
        try:
            with _progress(
                fleet.samples, lambda: sum(m.stats.samples for m in fleet.motes.values())
            ):
                await fleet.run(speedup=speedup)
            await proxies.settle()
            proxies.flush_pairs()
        finally:
            fjord.stop()
            await runner
    fjord.end_of_stream()
    fjord.run_until_idle()
    return TraceReplay(fjord, proxies, fleet)


@contextlib.contextmanager
def _progress(total: int, done: Callable[[], int]) -> Iterator[None]:
    """A progress bar on stderr when it is a terminal (stdout carries the rows)."""
    if not sys.stderr.isatty():
        yield
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("replaying samples", total=total)

        async def follow() -> None:
            while True:
                bar.update(task, completed=done())
                await asyncio.sleep(0.2)

        follower = asyncio.ensure_future(follow())
        try:
            yield
        finally:
            follower.cancel()
            bar.update(task, completed=done())
