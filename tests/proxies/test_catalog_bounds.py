"""The proxy manager's catalog is bounded, and one sensor's clock is caught before its proxy:
at most `max_sensors` sensors, oversize hellos rejected, silent sensors forgotten (catalog and
progress), readings dated far ahead rejected and counted per sensor in the catalog."""

from __future__ import annotations

import time
import tracemalloc

import msgspec

from fjords.engine import Engine
from fjords.runtime.progress import ProgressPolicy
from gateway.sensors_view import sensors_catalog
from proxies.manager import ProxyManager
from sensors.protocol import Hello, Samples
from sensors.transports.inprocess import InProcessHub
from tests.proxies.helpers import TRAFFIC, make_fjord
from tests.proxies.test_proxy import PROGRAMS

T0 = 1_330_588_800.0
TEN_YEARS = 10 * 365 * 86_400.0


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def hello(sid: str, **attributes: object) -> Hello:
    return Hello(
        sensor_id=sid,
        schema=(("speed", "float"),),
        programs=PROGRAMS,
        program="raw",
        sample_period_ms=300_000.0,
        attributes={"station": sid, "segment": "S01", **attributes},  # type: ignore[dict-item]
    )


def samples(sid: str, *times: float) -> Samples:
    return Samples(sensor_id=sid, times=times, rows=tuple((50.0,) for _ in times))


def _nth(msg: Samples, seq: int) -> Samples:
    return msgspec.structs.replace(msg, seq=seq)


async def feed(manager: ProxyManager, hub: InProcessHub, messages: list) -> None:
    for msg in messages:
        await hub.link(msg.sensor_id).send(msg)
    await manager.settle()


async def test_hellos_beyond_max_sensors_are_rejected_and_counted(caplog) -> None:
    fjord = make_fjord(traffic=TRAFFIC)
    async with InProcessHub() as hub, ProxyManager(fjord, [hub], max_sensors=3) as manager:
        await feed(manager, hub, [hello(f"s{i}") for i in range(3)])
        # (confirmed: each sends readings; one that said hello and no more would make room)
        await feed(
            manager, hub, [_nth(samples(f"s{i}", T0 + k), k) for k in (1, 2) for i in range(3)]
        )
        await feed(manager, hub, [hello(f"s{i}") for i in range(3, 5)])
        assert sorted(manager.proxies) == ["s0", "s1", "s2"]
        assert manager.stats.catalog_full == 2
        await feed(manager, hub, [samples("s4", T0)])  # data of a rejected sensor: dropped
        assert manager.stats.before_hello == 1
    assert sum("max_sensors" in r.getMessage() for r in caplog.records) == 1  # logged once


async def test_a_full_catalog_of_hellos_and_nothing_more_makes_room_for_a_newcomer() -> None:
    """Made-up ids that said hello and nothing more cannot lock a real sensor out: the one
    heard from longest ago is forgotten for it."""
    fjord = make_fjord(traffic=TRAFFIC)
    async with InProcessHub() as hub, ProxyManager(fjord, [hub], max_sensors=3) as manager:
        await feed(manager, hub, [hello("real")])
        await feed(manager, hub, [_nth(samples("real", T0 + k), k) for k in (1, 2)])
        await feed(manager, hub, [hello("junk1"), hello("junk2")])
        await feed(manager, hub, [hello("newcomer")])
        assert sorted(manager.proxies) == ["junk2", "newcomer", "real"]
        assert manager.stats.evicted_unconfirmed == 1 and manager.stats.catalog_full == 0


async def test_oversize_hellos_are_rejected_and_counted() -> None:
    fjord = make_fjord(traffic=TRAFFIC)
    many = {f"a{i}": i for i in range(100)}
    async with InProcessHub() as hub, ProxyManager(fjord, [hub]) as manager:
        await feed(
            manager,
            hub,
            [hello("many", **many), hello("big", note="x" * 10_000), hello("ok")],
        )
        assert list(manager.proxies) == ["ok"] and manager.stats.oversize_hellos == 2


async def test_a_silent_sensor_is_forgotten_from_catalog_and_progress() -> None:
    wall = Clock(1000.0)
    fjord = make_fjord(traffic=TRAFFIC)
    async with (
        InProcessHub() as hub,
        ProxyManager(
            fjord, [hub], forget_offline_after_s=3600.0, wall_clock=wall, tick_s=3600
        ) as manager,
    ):
        await feed(manager, hub, [hello("old"), hello("new"), samples("old", T0)])
        wall.t += 1800
        await feed(manager, hub, [samples("new", T0)])
        wall.t += 1801  # 'old' silent for an hour and a second, 'new' for half an hour
        manager.tick()
        fjord.run_until_idle()
        assert list(manager.proxies) == ["new"] and manager.stats.forgotten == 1
        assert "old" not in fjord.streams["traffic"].info.sensors
        assert "old" not in fjord.streams["traffic"].router.progress.sensors
        assert [e["id"] for e in sensors_catalog(manager)] == ["new"]
        await feed(manager, hub, [hello("old")])  # it may come back as a new sensor
        assert "old" in manager.proxies


async def test_a_reading_ten_years_ahead_is_rejected_before_the_proxy_and_shown() -> None:
    t0 = time.time() - 3600  # live sensors: clocks synchronised with the gateway's
    fjord = make_fjord(traffic=TRAFFIC)
    engine = Engine(fjord)
    rows: list[tuple] = []
    engine.add_query("SELECT station, speed FROM traffic").sink.add_batch_callback(rows.extend)
    async with InProcessHub() as hub, ProxyManager(fjord, [hub]) as manager:
        await feed(manager, hub, [hello("a"), hello("b"), hello("liar")])
        await feed(manager, hub, [samples(s, t0, t0 + 300) for s in ("a", "b", "liar")])
        await feed(manager, hub, [samples("liar", t0 + TEN_YEARS)])
        cat = {e["id"]: e for e in sensors_catalog(manager)}
        assert cat["liar"]["clock_rejects"] == 1 and cat["liar"]["clock_suspect"]
        assert cat["liar"]["clock_offset_s"] > TEN_YEARS / 2
        assert cat["a"]["clock_rejects"] == 0 and not cat["a"]["clock_suspect"]
        # Its later, honest readings are not "out of order" behind the outlier.
        await feed(manager, hub, [samples(s, t0 + 600) for s in ("a", "b", "liar")])
        fjord.run_until_idle()
        cat = {e["id"]: e for e in sensors_catalog(manager)}
        assert not cat["liar"]["clock_suspect"] and cat["liar"]["counters"]["out_of_order"] == 0
        assert manager.now() == t0 + 600  # stream time never jumped to the outlier
    assert sum(1 for r in rows if r[0] == "liar") == 3
    assert fjord.streams["traffic"].router.late == 0


async def test_catalog_entries_are_small() -> None:
    """10,000 retained hellos must not cost 95 MB: measure what one sensor costs."""
    fjord = make_fjord(traffic=TRAFFIC)
    hub = InProcessHub(queue_bound=20_000)
    async with hub, ProxyManager(fjord, [hub], progress=ProgressPolicy()) as manager:
        await feed(manager, hub, [hello("warm")])
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        await feed(manager, hub, [hello(f"s{i}") for i in range(500)])
        per_sensor = (tracemalloc.get_traced_memory()[0] - before) / 500
        tracemalloc.stop()
    assert len(manager.proxies) == 501
    # About 10.1 KB with the in-process link (2 KB) and the stall watch (0.2 KB); a hello's
    # attributes add at most max_hello_bytes.
    assert per_sensor < 11_000, per_sensor
