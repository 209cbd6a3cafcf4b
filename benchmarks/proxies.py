"""Power-aware proxies on the METR-LA replay (207 motes, one day) and the loop pair: what
pushing programs down saves, by the motes' own energy accounts, side by side in one run.

    python -m benchmarks.proxies
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

from firmware_sim.profiles import resolve_profile

from benchmarks.common import console, markdown, record, table
from fjords.engine import Engine
from fjords.runtime.fjord import Fjord
from fjords.schema import Field, Schema
from proxies.manager import ProxyManager
from sensors.motes import TraceReplayFleet, TrafficPair, load_stations, load_trace
from sensors.protocol import Control, encode_message
from sensors.transports.base import TransportUnavailable
from sensors.transports.inprocess import InProcessHub

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "metr-la"
TRAFFIC = Schema(
    [
        Field("time", "float"),
        Field("station", "str"),
        Field("speed", "float"),
        Field("latitude", "float"),
        Field("longitude", "float"),
        Field("segment", "str"),
    ]
)
VEHICLES = Schema(
    [
        Field("time", "float"),
        Field("pair", "str"),
        Field("speed", "float"),
        Field("length", "float"),
    ]
)


class ControlHub(InProcessHub):
    """In-process hub handing controls over as objects: sensors.protocol cannot yet decode the
    filter program's list-valued `ranges` parameter (Control.params is dict[str, Scalar])."""

    async def send(self, sensor_id: str, msg: Control) -> None:
        link = self._links.get(sensor_id)
        if link is None or not link.online:
            raise TransportUnavailable(sensor_id)
        encode_message(msg)
        link.inbox.put(msg)
        self.stats.sent += 1


SCENARIOS: dict[str, dict[str, str]] = {
    "filter": {
        **{f"slow{i}": f"SELECT * FROM traffic WHERE speed < {20 + 0.5 * i}" for i in range(50)},
        **{f"fast{i}": f"SELECT * FROM traffic WHERE speed > {68 + 0.05 * i}" for i in range(50)},
    },
    "aggregate": {
        "a5": "SELECT station, AVG(speed) FROM traffic [RANGE 5 MINUTES] GROUP BY station",
        "a15": "SELECT segment, AVG(speed), MAX(speed) FROM traffic [RANGE 15 MINUTES] GROUP BY segment",
    },
}


async def metr_la(queries: dict[str, str], pushdown: bool, trace: Any, stations: Any) -> dict:
    fjord = Engine(Fjord(max_lag=1000000000000.0))
    fjord.fjord.add_stream("traffic", TRAFFIC, sensor_field="station")
    rows = 0

    def count(_: tuple) -> None:
        nonlocal rows
        rows += 1

    for qid, sql in queries.items():
        fjord.add_query(sql, query_id=qid).sink.add_callback(count)
    hub = ControlHub(queue_bound=1_000_000)
    t0 = time.perf_counter()
    runtime = asyncio.create_task(fjord.fjord.run())  # the Fjord drains its queues as tuples arrive
    async with hub:
        fleet = TraceReplayFleet(trace, stations, hub.link, yield_every=1)
        async with ProxyManager(fjord, [hub], pushdown=pushdown) as manager:
            await fleet.run()
            await manager.settle()
    fjord.fjord.stop()
    await runtime
    fjord.fjord.end_of_stream()
    fjord.fjord.run_until_idle()
    drops = fjord.fjord.stats()["streams"]["traffic"]["queue_drops"]
    wall = time.perf_counter() - t0
    motes = fleet.motes.values()
    per_bit = resolve_profile("paper").tx_joules_per_bit
    return {
        "bits": sum(m.energy.joules["radio"] for m in motes) / per_bit,
        "joules": sum(m.energy.total_j for m in motes),
        "messages": sum(m.stats.messages for m in motes),
        "programs": sorted({m.program_name for m in motes}),
        "rows": rows,
        "drops": drops,
        "wall_s": wall,
    }


async def pair_energy(query: str | None, duration: float = 60.0) -> float:
    hub = InProcessHub()
    fjord = Engine(Fjord(max_lag=1000000000000.0))
    fjord.fjord.add_stream("vehicles", VEHICLES, sensor_field="pair")
    if query:
        fjord.add_query(query)
    # Managed motes boot on `vehicle` (so that the first window's raw readings, 13 mW, do not
    # dominate a short run); the baseline runs `raw` throughout.
    program = "vehicle" if query else "raw"
    motes = TrafficPair("p", hub.link, duration_s=duration, program=program, seed=1)
    async with hub, ProxyManager(fjord, [hub], pushdown=query is not None):
        await motes.run()
    return sum(m.energy.total_j for m in motes.motes.values()) / duration * 1e3 / 2  # mW per mote


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__).parse_args(argv)  # --help
    if not (DATA / "readings.csv").is_file():
        raise SystemExit(
            f"benchmarks.proxies needs the METR-LA data at {DATA} (../shared beside the clone)"
        )
    stations = load_stations(DATA / "stations.csv")
    full = load_trace(DATA / "readings.csv")
    start = min(s[0][0] for s in full.values())
    trace = {k: [r for r in v if r[0] < start + 86_400] for k, v in full.items()}
    rows: list[list[object]] = []
    for name, queries in SCENARIOS.items():
        raw = asyncio.run(metr_la(queries, False, trace, stations))
        pushed = asyncio.run(metr_la(queries, True, trace, stations))
        assert raw["rows"] == pushed["rows"], (name, raw["rows"], pushed["rows"])
        assert raw["drops"] == pushed["drops"] == 0
        rows.append(
            [
                f"{name} ({len(queries)} queries)",
                "/".join(pushed["programs"]),
                raw["bits"],
                pushed["bits"],
                1 - pushed["bits"] / raw["bits"],
                raw["messages"],
                pushed["messages"],
                raw["joules"] / pushed["joules"],
                pushed["rows"],
            ]
        )
    cols = [
        "METR-LA, 207 motes x 1 day",
        "pushed program",
        "bits raw",
        "bits pushed",
        "bits saved",
        "msgs raw",
        "msgs pushed",
        "energy raw/pushed",
        "result rows (equal)",
    ]
    console.print(table("Program pushdown on the METR-LA replay", cols, rows))
    counts = "SELECT pair, COUNT(*) FROM vehicles [RANGE 1 MINUTE] GROUP BY pair"
    speeds = "SELECT pair, AVG(speed) FROM vehicles [RANGE 1 MINUTE] GROUP BY pair"
    raw_mw = asyncio.run(pair_energy(None))
    prow = [
        ["raw (no proxy control)", raw_mw, 1.0],
        ["counts query -> count", c := asyncio.run(pair_energy(counts)), raw_mw / c],
        ["speed query -> vehicle", v := asyncio.run(pair_energy(speeds)), raw_mw / v],
    ]
    pcols = [
        "loop pair, 180 Hz, 1 vehicle/s, 60 s",
        "mW per mote (own account, incl. 20 ms/s listening)",
        "x less than raw",
    ]
    console.print(table("Loop pair: what the proxy runs", pcols, prow))
    record(
        "proxies",
        "`python -m benchmarks.proxies`: the same replay with the proxies pushing programs down "
        "and with every mote left on `raw`; radio bits and energy from the simulated motes' own "
        "accounts (paper profile, 20 ms receive windows included), result row counts checked "
        "equal.\n\n"
        + markdown(cols, rows)
        + "\n\n"
        + markdown(pcols, prow)
        + "\n\nAt METR-LA's 5-minute sampling the `aggregate` program sends one partial "
        "(104 bits) per reading where `raw` batches 8 readings (17 bits each), so it costs MORE "
        "bits; it is pushed because the program choice prefers it (`proxies/choice.py`: "
        "`aggregate` when every query rolls up windows; it cuts result latency "
        "from 8 periods to 1): a cost-only rule would keep `raw` there. The filter cuts bits but not messages (one per passing reading vs 8 readings per raw packet). At 1 vehicle/s `count` (a message every second) costs slightly more than `vehicle` (a message per vehicle). Filter savings depend on the thresholds' selectivity.",
    )


if __name__ == "__main__":
    main()
