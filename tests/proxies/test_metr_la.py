"""The METR-LA replay through the proxies: filter and aggregate pushdown, offline and return.

Real readings (one day of 20 stations) replayed as fast as possible by one simulated mote per
station over the in-process transport; each scenario runs twice, with the proxies pushing
programs down and with every mote left on `raw`, and the query results must be identical.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import pytest
from firmware_sim.profiles import resolve_profile

from fjords.engine import Engine
from gateway.sensors_view import sensors_catalog
from proxies.manager import ProxyManager
from sensors.motes import FaultConfig, FaultInjector, TraceReplayFleet, load_stations, load_trace
from tests.proxies.helpers import TRAFFIC, ControlHub, make_fjord
from tests.support import shared_file

DAY = 86_400.0
N_STATIONS = 20


@pytest.fixture(scope="module")
def day() -> tuple[dict[str, list[tuple[float, float]]], dict[str, dict[str, Any]]]:
    stations = load_stations(shared_file("data/metr-la/stations.csv"))
    chosen = dict(list(stations.items())[:N_STATIONS])
    trace = load_trace(shared_file("data/metr-la/readings.csv"), stations=set(chosen))
    t0 = min(s[0][0] for s in trace.values())
    trace = {k: [r for r in v if r[0] < t0 + DAY] for k, v in trace.items()}
    return trace, chosen


async def replay(
    trace: dict[str, list[tuple[float, float]]],
    stations: dict[str, dict[str, Any]],
    queries: dict[str, str],
    *,
    pushdown: bool,
    faults: dict[str, FaultConfig] | None = None,
) -> tuple[dict[str, list[tuple]], TraceReplayFleet, ProxyManager]:
    fjord = make_fjord(traffic=TRAFFIC)
    engine = Engine(fjord)
    results: dict[str, list[tuple]] = {}
    for qid, sql in queries.items():
        results[qid] = []
        engine.add_query(sql, query_id=qid).sink.add_callback(results[qid].append)
    hub = ControlHub()
    injectors = {k: FaultInjector(v) for k, v in (faults or {}).items()}
    async with hub:
        # yield_every=1: the motes take turns sample by sample, so stream time (the proxies'
        # clock for liveness) means the same for all of them.
        fleet = TraceReplayFleet(
            trace,
            stations,
            hub.link,
            faults=lambda s: injectors.get(s) or FaultInjector(),
            yield_every=1,
        )
        async with ProxyManager(fjord, [hub], pushdown=pushdown) as manager:
            await fleet.run()
            await manager.settle()
    fjord.end_of_stream()
    fjord.run_until_idle()
    return results, fleet, manager


def radio_bits(fleet: TraceReplayFleet) -> float:
    per_bit = resolve_profile("paper").tx_joules_per_bit
    return sum(m.energy.joules["radio"] for m in fleet.motes.values()) / per_bit


def thresholds() -> dict[str, str]:
    """100 queries over the same stations: 50 want slow traffic, 50 want fast traffic."""
    qs = {}
    for i in range(50):
        qs[f"slow{i}"] = f"SELECT station, time, speed FROM traffic WHERE speed < {20 + 0.5 * i}"
        qs[f"fast{i}"] = f"SELECT station, time, speed FROM traffic WHERE speed > {68 + 0.05 * i}"
    return qs


async def test_filter_pushdown_same_results_fewer_bits(day, capsys) -> None:
    trace, stations = day
    queries = thresholds()
    raw, raw_fleet, _ = await replay(trace, stations, queries, pushdown=False)
    pushed, fleet, manager = await replay(trace, stations, queries, pushdown=True)
    union = [[None, 44.5], [68.0, None]]
    for mote in fleet.motes.values():
        assert mote.program_name == "filter"
        assert mote.program.params["ranges"] == [(-math.inf, 44.5), (68.0, math.inf)]
    for entry in sensors_catalog(manager):
        assert entry["program"] == "filter" and entry["params"] == {"ranges": union}
        assert entry["counters"]["acks"] == 1 and entry["counters"]["retries"] == 0
    assert all(m.program_name == "raw" for m in raw_fleet.motes.values())
    assert sum(len(r) for r in raw.values()) > 1000
    for qid in queries:
        assert sorted(pushed[qid]) == sorted(raw[qid]), qid
    bits_raw, bits_filter = radio_bits(raw_fleet), radio_bits(fleet)
    saved = 1 - bits_filter / bits_raw
    with capsys.disabled():
        print(
            f"\nMETR-LA, {N_STATIONS} stations x 1 day, 100 threshold queries: radio bits "
            f"raw {bits_raw:.0f}, filter {bits_filter:.0f}: {saved:.1%} fewer"
        )
    assert bits_filter < bits_raw


AGG_QUERIES = {
    "st5": "SELECT station, AVG(speed) AS a, MIN(speed) AS lo, MAX(speed) AS hi, SUM(speed) AS s, "
    "COUNT(*) AS n FROM traffic [RANGE 5 MINUTES] GROUP BY station",
    "st15": "SELECT station, AVG(speed) AS a, MIN(speed) AS lo, MAX(speed) AS hi, COUNT(speed) AS n "
    "FROM traffic [RANGE 15 MINUTES] GROUP BY station",
    "seg15": "SELECT segment, AVG(speed) AS a, COUNT(*) AS n FROM traffic [RANGE 15 MINUTES] "
    "WHERE segment IN ('S21', 'S10', 'S27') GROUP BY segment",
}


def upsampled(trace: dict[str, list[tuple[float, float]]], hours: float, every_s: float) -> dict:
    """A faster sensor: each 5-minute reading repeated every `every_s` seconds over its period."""
    t0 = min(s[0][0] for s in trace.values())
    out = {}
    for sid, series in trace.items():
        rows = []
        for t, v in series:
            if t >= t0 + hours * 3600:
                break
            rows += [(t + k * every_s, v) for k in range(int(300 // every_s))]
        out[sid] = rows
    return out


async def test_aggregate_pushdown_equals_raw(day) -> None:
    trace, stations = day
    # Stations sampling every 30 s: ten readings per 5-minute partial, so pushing the
    # aggregation down saves radio bits and the cost model picks it.
    fast = upsampled(trace, hours=6, every_s=30)
    raw, raw_fleet, _ = await replay(fast, stations, AGG_QUERIES, pushdown=False)
    pushed, fleet, manager = await replay(fast, stations, AGG_QUERIES, pushdown=True)
    in_segments = {s for s, a in stations.items() if a["segment"] in ("S21", "S10", "S27")}
    for sid, mote in fleet.motes.items():
        assert (mote.program_name, mote.program.params) == ("aggregate", {"window_ms": 300000}), sid
    assert radio_bits(fleet) < radio_bits(raw_fleet)
    counters = {e["id"]: e["counters"] for e in sensors_catalog(manager)}
    assert all(c["misaligned_windows"] == 0 and c["stale_partials"] == 0 for c in counters.values())
    assert len(raw["st5"]) == N_STATIONS * 72 and len(raw["st15"]) == N_STATIONS * 24
    # One partial per 5-minute window: the same sums, bit for bit.
    assert pushed["st5"] == raw["st5"]
    # 15-minute windows add three partial sums instead of thirty readings: the same up to float
    # rounding; counts, minima and maxima exactly.
    assert len(pushed["st15"]) == len(raw["st15"])
    for p, r in zip(pushed["st15"], raw["st15"], strict=True):
        assert p[0] == r[0] and p[2:] == r[2:] and p[1] == pytest.approx(r[1], rel=1e-12)
    # Across stations the arrival order differs between runs: equal up to float rounding.
    assert in_segments and len(pushed["seg15"]) == len(raw["seg15"]) > 0
    key = {(r[0], r[-2]): r for r in raw["seg15"]}
    for row in pushed["seg15"]:
        ref = key[(row[0], row[-2])]
        assert row[2] == ref[2] and row[1] == pytest.approx(ref[1], rel=1e-12)


async def test_no_aggregate_pushdown_when_it_would_cost_more(day) -> None:
    trace, stations = day
    # METR-LA reports every 5 minutes: a partial per reading costs more than batched raw.
    short = {k: v[:36] for k, v in trace.items()}
    _, fleet, manager = await replay(short, stations, AGG_QUERIES, pushdown=True)
    assert all(m.program_name == "raw" for m in fleet.motes.values())
    assert all("would cost more" in e["wanted"]["reason"] for e in sensors_catalog(manager))


async def test_offline_return_and_reordering(day) -> None:
    trace, stations = day
    ids = list(stations)[:5]
    trace = {k: trace[k] for k in ids}
    stations = {k: stations[k] for k in ids}
    t0 = min(v[0][0] for v in trace.values())
    gone, late = ids[0], ids[1]
    spell = (t0 + 4 * 3600, t0 + 14 * 3600)
    faults = {
        gone: FaultConfig(offline=(spell,)),
        late: FaultConfig(delay=0.3, max_delay_s=1500, seed=3),
    }
    queries = {
        "slow": "SELECT station, time, speed FROM traffic WHERE speed < 66",
        "agg": "SELECT station, COUNT(*) AS n FROM traffic [RANGE 1 HOUR] WHERE speed < 66 "
        "GROUP BY station",
    }
    got, fleet, manager = await replay(trace, stations, queries, pushdown=True, faults=faults)
    proxy = manager.proxies[gone]
    events = [what for _, what, _ in proxy.history]
    assert "offline" in events and "online" in events
    back = events.index("online")
    # Back (with a hello): its filter is sent again in its next window and acknowledged.
    assert events[back : back + 4] == ["online", "hello", "sent", "acked"]
    assert fleet.motes[gone].program_name == "filter"
    assert proxy.stats.offline_spells == 1 and proxy.status == "online"
    offline_at = next(t for t, what, _ in proxy.history if what == "offline")
    assert spell[0] < offline_at < spell[1]
    rows = defaultdict(list)
    for station, t, _ in got["slow"]:
        rows[station].append(t)
    # Nothing from it while it was away, all of it before and after; the others never waited.
    expected = {s: [t for t, v in trace[s] if v < 66] for s in ids}
    assert rows[gone] == [t for t in expected[gone] if not spell[0] <= t < spell[1]]
    assert all(sorted(rows[s]) == expected[s] for s in ids if s not in (gone, late))
    # Reordered packets: the late ones are dropped and counted, the rest pushed in order.
    r = manager.proxies[late].stats
    assert r.out_of_order > 0 and rows[late] == sorted(set(rows[late]))
    assert set(rows[late]) < set(expected[late])
    hours = [row[-2] for row in got["agg"] if row[0] == gone]
    assert hours and not [h for h in hours if spell[0] <= h and h + 3600 <= spell[1]]
