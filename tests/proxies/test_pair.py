"""The paper's loop-detector pair behind its proxies: count -> vehicle -> count -> sleep."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable

from fjords.engine import Engine
from fjords.runtime.fjord import Fjord
from gateway.sensors_view import sensors_catalog
from proxies.manager import ProxyManager
from sensors.motes import TrafficPair
from sensors.transports.inprocess import InProcessHub
from tests.proxies.helpers import VEHICLES, make_fjord

DURATION = 80.0
COUNTS = "SELECT pair, COUNT(*) AS n FROM vehicles [RANGE 20 SECONDS] GROUP BY pair"
SPEEDS = "SELECT pair, AVG(speed) AS mph, AVG(length) AS ft FROM vehicles [RANGE 5 SECONDS] GROUP BY pair"


def window_of(detail: str) -> int:
    return int(re.search(r"window (\d+)", detail).group(1))  # type: ignore[union-attr]


def pair(hub: InProcessHub, program: str) -> TrafficPair:
    return TrafficPair(
        "p1",
        hub.link,
        duration_s=DURATION,
        rate_hz=180.0,
        vehicles_per_second=1.0,
        program=program,
        seed=7,
        yield_every=8,
    )


async def at(mote_time: float, motes: TrafficPair, action: Callable[[], None]) -> None:
    while (motes.upstream._last_t or 0.0) < mote_time:
        await asyncio.sleep(0)
    action()


async def test_count_vehicle_count_sleep_within_a_window_and_10x_less_energy() -> None:
    fjord: Fjord = make_fjord(vehicles=VEHICLES)
    engine = Engine(fjord)
    rows: dict[str, list[tuple]] = {"counts": [], "speeds": []}
    engine.add_query(COUNTS, query_id="counts").sink.add_callback(rows["counts"].append)
    hub = InProcessHub()
    changes: list[float] = []
    windows: dict[str, list[int]] = {"p1-u": [], "p1-d": []}
    async with hub, ProxyManager(fjord, [hub], sleep_s=5.0) as manager:
        motes = pair(hub, "raw")

        def change(fn: Callable[[], None]) -> Callable[[], None]:
            def run() -> None:
                fjord.run_until_idle()  # what has arrived reaches the queries before they go
                fn()
                manager.queries_changed()
                changes.append(manager.now())  # the proxies' clock: stream time
                for sid, p in manager.proxies.items():
                    windows[sid].append(p.windows)  # receive windows announced so far

            return run

        def add_speeds() -> None:
            engine.add_query(SPEEDS, query_id="speeds").sink.add_callback(rows["speeds"].append)

        programs: list[tuple[float, str]] = []

        async def watch() -> None:  # what the upstream mote runs, over its own time
            while True:
                name = motes.upstream.program_name
                if not programs or programs[-1][1] != name:
                    programs.append((motes.upstream._last_t or 0.0, name))
                await asyncio.sleep(0)

        watcher = asyncio.create_task(watch())
        async with asyncio.TaskGroup() as tg:
            tg.create_task(motes.run())
            tg.create_task(at(20.0, motes, change(add_speeds)))
            tg.create_task(at(40.0, motes, change(lambda: fjord.remove_query("speeds"))))
            tg.create_task(at(60.0, motes, change(lambda: fjord.remove_query("counts"))))
        watcher.cancel()
        await manager.settle()
        manager.flush_pairs()
        catalog = {e["id"]: e for e in sensors_catalog(manager)}
    fjord.end_of_stream()
    fjord.run_until_idle()

    # The upstream mote ran raw until the first window, then count, vehicle, count, sleep.
    names = [name for _, name in programs]
    assert names == ["raw", "count", "vehicle", "count"], programs
    assert motes.upstream.stats.asleep_s > 0.8 * (DURATION - 60.0 - 4.0)
    for sid in ("p1-u", "p1-d"):
        proxy = manager.proxies[sid]
        assert proxy.stats.retries == 0 and proxy.stats.unanswered == 0  # each sent once
        assert catalog[sid]["status"] in ("asleep", "online")
        assert catalog[sid]["wanted"]["program"] == "sleep"
        # Each switch: sent in the first receive window after the change, applied in the next
        # one (the in-process link hands it over after the window the mote announced).
        for changed, window in zip(changes, windows[sid], strict=True):
            sent = [(t, d) for t, what, d in proxy.history if what == "sent" and t >= changed]
            acked = [(t, d) for t, what, d in proxy.history if what == "acked" and t >= changed]
            assert window_of(sent[0][1]) == window + 1
            assert window_of(acked[0][1]) == window + 2
    switches = [t for t, name in programs[1:]]
    for changed, switched in zip(changes, switches[1:], strict=False):
        assert 0 < switched - changed <= 4.2
    # No query asked for a SAMPLE PERIOD: the motes keep their own 180 Hz (>= the 60 Hz that
    # counting and the 180 Hz that speeds need).
    assert manager.proxies["p1-u"].believed.rate_hz == 180.0

    # Answers: counts per minute match the trace; speeds came while vehicle ran.
    # Raw at first (the proxy detects vehicles), then count windows aligned to the switch time,
    # not to the query's 20 s: one window straddles 20 s, hence the slack.
    truth = [v for v in motes.trace.vehicles if v.t0 < 20.0]
    counted = sum(n for _, n, ws, _ in rows["counts"] if ws == 0.0)
    assert abs(counted - len(truth)) <= 2, (counted, len(truth))
    speeds = [r for r in rows["speeds"] if r[1] is not None]
    assert speeds and all(20 <= r[1] <= 120 for r in speeds)

    # Energy, by the motes' own accounts, vs the same pair running raw for the same time.
    raw_hub = InProcessHub()  # never entered: what they send goes nowhere
    raw_motes = pair(raw_hub, "raw")
    await raw_motes.run()
    ours = sum(m.energy.total_j for m in motes.motes.values())
    raw = sum(m.energy.total_j for m in raw_motes.motes.values())
    assert raw >= 10 * ours, (raw, ours)
