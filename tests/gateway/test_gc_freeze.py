"""The gateway's long-lived objects are kept out of the collector's full passes (each pass over
1,000 queries pauses the event loop for 130-200 ms), and a removed query's objects are still
collected."""

from __future__ import annotations

import functools
import gc
import weakref

import pytest

from gateway.config import Config
from gateway.daemon import Gateway
from gateway.gc_freeze import HeapFreezer
from gateway.run_loop import RunLoop
from tests.support import async_eventually

SQL = "SELECT time, station, speed FROM traffic WHERE speed > {}"
# The waits below: in-process work, polled every 10 ms, within a generous bound.
_until = functools.partial(async_eventually, timeout=30, interval=0.01)


def _tracked(obj: object) -> bool:
    """Whether the collector's passes walk `obj` (frozen objects are in no generation)."""
    return any(o is obj for o in gc.get_objects())


@pytest.fixture(autouse=True)
def _unfrozen():
    yield
    gc.unfreeze()


async def test_started_gateway_freezes_its_queries_and_a_removed_query_is_collected() -> None:
    cfg = Config()
    gw = Gateway(cfg, run_loop=RunLoop(gc_quiet_s=0.05))
    ids = [gw.add_query(SQL.format(i)).id for i in range(20)]
    async with gw:
        kept = gw.fjord.queries[ids[0]].sink
        assert gw.heap_freezer.freezes == 1
        assert not _tracked(kept)  # frozen: no full pass walks it
        # A removed query: its objects are unfrozen, collected, the rest frozen again.
        gone = weakref.ref(gw.fjord.queries[ids[1]].sink)
        gw.remove_query(ids[1])
        await _until(lambda: gw.heap_freezer.freezes == 2)
        assert gw.heap_freezer.freezes == 2
        assert gone() is None
        assert not _tracked(kept)
        # A query added later is frozen after the quiet time too.
        late = gw.add_query(SQL.format(99))
        await _until(lambda: gw.heap_freezer.freezes == 3)
        assert not _tracked(late.sink)
    assert gc.get_freeze_count() == 0  # a stopped gateway's objects may be collected again


async def test_gc_freeze_off_freezes_nothing() -> None:
    gw = Gateway(Config(), run_loop=RunLoop(gc_freeze=False))
    gw.add_query(SQL.format(1))
    async with gw:
        assert gw.heap_freezer.freezes == 0
        assert gc.get_freeze_count() == 0


def test_removal_unfreezes_at_once() -> None:
    freezer = HeapFreezer(quiet_s=60)
    freezer.freeze()
    assert gc.get_freeze_count() > 0
    freezer.changed(removed=True)
    assert gc.get_freeze_count() == 0


async def test_sensors_that_join_are_frozen_once_the_fleet_is_quiet_and_one_that_leaves_is_collected() -> (
    None
):
    """Proxies come with the fleet, after the start-up freeze: unless a sensor joining counts
    as a change (as a query does), a gateway's whole fleet (207 proxies, their counters,
    demands and estimators) stays in the collector's full passes for good. One forgotten
    unfreezes."""
    from proxies.manager import ProxyManager
    from sensors.protocol import Hello
    from sensors.transports.inprocess import InProcessHub

    gw = Gateway(Config(), run_loop=RunLoop(gc_quiet_s=0.05))
    gw.add_query(SQL.format(50))
    hub = InProcessHub()
    manager = ProxyManager(
        gw.fjord, [hub], on_catalog_change=lambda removed: gw.heap_freezer.changed(removed=removed)
    )
    async with gw, hub, manager:
        gw.attach_proxies(manager)
        await _until(lambda: not gw.heap_freezer.pending)
        passes = gw.heap_freezer.freezes
        for sid in ("m1", "m2"):
            await hub.link(sid).send(
                Hello(
                    sensor_id=sid,
                    schema=(("speed", "float"),),
                    attributes={"station": sid, "segment": "S01"},
                )
            )
        await manager.settle()
        assert sorted(manager.proxies) == ["m1", "m2"] and gw.heap_freezer.pending
        await _until(lambda: not gw.heap_freezer.pending)
        assert gw.heap_freezer.freezes > passes
        assert not _tracked(manager.proxies["m1"])
        gone = weakref.ref(manager.proxies["m2"])
        manager.forget("m2")
        assert gc.get_freeze_count() == 0  # unfrozen at once: its cycles can be collected
        await _until(lambda: not gw.heap_freezer.pending)
        assert gone() is None
        assert not _tracked(manager.proxies["m1"])


async def test_a_routers_index_is_built_before_the_freeze_not_at_the_first_reading() -> None:
    """A range filter's index is rebuilt lazily at the next reading after a change: built after
    the freeze, it would stay in every full pass. The freeze builds it first."""
    gw = Gateway(Config(), run_loop=RunLoop(gc_quiet_s=0.05))
    for lo in (10, 20, 30):
        gw.add_query(
            f"SELECT time, station, speed FROM traffic WHERE speed >= {lo} AND speed < {lo + 5}"
        )
    async with gw:
        index = gw.fjord.streams["traffic"].router.index
        (iv,) = index._iv.values()
        assert not iv._dirty
        assert not _tracked(iv._snaps)


def test_a_burst_of_installs_is_frozen_as_it_goes_and_still_gets_its_quiet_pass() -> None:
    """10,000 queries restored at start-up are one burst, never quiet until it ends: every
    `burst` changes a pass runs at once, so each full collection walks only the queries
    since the last (install time per query stays flat), and the quiet pass that builds and
    freezes what was left lazy still follows."""
    cfg = Config()
    gw = Gateway(cfg, run_loop=RunLoop(gc_quiet_s=3600))
    gw.heap_freezer.burst = 50
    ids = [gw.add_query(SQL.format(i)).id for i in range(120)]
    assert gw.heap_freezer.freezes == 2  # after the 50th and the 100th install
    assert not _tracked(gw.fjord.queries[ids[99]].sink)
    assert _tracked(gw.fjord.queries[ids[100]].sink)  # since the last pass: walked, for now
    assert gw.heap_freezer.pending  # the quiet pass is still due
    built: list[int] = []
    gw.heap_freezer.prepare.append(lambda: built.append(1))
    gw.heap_freezer.freeze()
    assert built and not gw.heap_freezer.pending
    assert not _tracked(gw.fjord.queries[ids[119]].sink)


def test_burst_passes_can_be_switched_off() -> None:
    freezer = HeapFreezer(quiet_s=3600, burst=0)
    for _ in range(1000):
        freezer.changed()
    assert freezer.freezes == 0 and freezer.pending
