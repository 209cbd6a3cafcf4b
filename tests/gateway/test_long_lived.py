"""The gateway's long-lived objects are kept out of the collector's full passes (issue 14: each
pass over 1,000 queries paused the event loop for 130-200 ms), and a removed query's objects
are still collected."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from gateway.config import Config
from gateway.daemon import Gateway, RunLoop
from gateway.long_lived import LongLived

SQL = "SELECT time, station, speed FROM traffic WHERE speed > {}"


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
        assert gw.long_lived.freezes == 1
        assert not _tracked(kept)  # frozen: no full pass walks it
        # A removed query: its objects are unfrozen, collected, the rest frozen again.
        gone = weakref.ref(gw.fjord.queries[ids[1]].sink)
        gw.remove_query(ids[1])
        for _ in range(200):
            if gw.long_lived.freezes == 2:
                break
            await asyncio.sleep(0.01)
        assert gw.long_lived.freezes == 2
        assert gone() is None
        assert not _tracked(kept)
        # A query added later is frozen after the quiet time too.
        late = gw.add_query(SQL.format(99))
        for _ in range(200):
            if gw.long_lived.freezes == 3:
                break
            await asyncio.sleep(0.01)
        assert not _tracked(late.sink)
    assert gc.get_freeze_count() == 0  # a stopped gateway's objects may be collected again


async def test_gc_freeze_off_freezes_nothing() -> None:
    gw = Gateway(Config(), run_loop=RunLoop(gc_freeze=False))
    gw.add_query(SQL.format(1))
    async with gw:
        assert gw.long_lived.freezes == 0
        assert gc.get_freeze_count() == 0


def test_removal_unfreezes_at_once() -> None:
    ll = LongLived(quiet_s=60)
    ll.freeze()
    assert gc.get_freeze_count() > 0
    ll.changed(removed=True)
    assert gc.get_freeze_count() == 0


async def _until(cond, timeout: float = 5.0) -> None:  # noqa: ANN001
    for _ in range(int(timeout / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_sensors_that_join_are_frozen_once_the_fleet_is_quiet_and_one_that_leaves_is_collected() -> (
    None
):  # noqa: E501
    """Proxies come with the fleet, after the start-up freeze: before, a gateway's whole fleet
    (207 proxies, their counters, demands and estimators) stayed in the collector's full
    passes for good. A sensor joining is a change as a query is; one forgotten unfreezes."""
    from proxies.manager import ProxyManager
    from sensors.protocol import Hello
    from sensors.transports.inprocess import InProcessHub

    gw = Gateway(Config(), run_loop=RunLoop(gc_quiet_s=0.05))
    gw.add_query(SQL.format(50))
    hub = InProcessHub()
    manager = ProxyManager(
        gw.fjord, [hub], on_catalog_change=lambda removed: gw.long_lived.changed(removed=removed)
    )
    async with gw, hub, manager:
        gw.attach_proxies(manager)
        await _until(lambda: not gw.long_lived.pending)
        passes = gw.long_lived.freezes
        for sid in ("m1", "m2"):
            await hub.link(sid).send(
                Hello(
                    sensor_id=sid,
                    schema=(("speed", "float"),),
                    attributes={"station": sid, "segment": "S01"},
                )
            )
        await manager.settle()
        assert sorted(manager.proxies) == ["m1", "m2"] and gw.long_lived.pending
        await _until(lambda: not gw.long_lived.pending)
        assert gw.long_lived.freezes > passes
        assert not _tracked(manager.proxies["m1"])
        gone = weakref.ref(manager.proxies["m2"])
        manager.forget("m2")
        assert gc.get_freeze_count() == 0  # unfrozen at once: its cycles can be collected
        await _until(lambda: not gw.long_lived.pending)
        assert gone() is None
        assert not _tracked(manager.proxies["m1"])


async def test_a_routers_index_is_built_before_the_freeze_not_at_the_first_reading() -> None:
    """A range filter's index is rebuilt lazily at the next reading after a change: after the
    freeze, so it stayed in every full pass. The freeze builds it first."""
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
    gw.long_lived.burst = 50
    ids = [gw.add_query(SQL.format(i)).id for i in range(120)]
    assert gw.long_lived.freezes == 2  # after the 50th and the 100th install
    assert not _tracked(gw.fjord.queries[ids[99]].sink)
    assert _tracked(gw.fjord.queries[ids[100]].sink)  # since the last pass: walked, for now
    assert gw.long_lived.pending  # the quiet pass is still due
    built: list[int] = []
    gw.long_lived.prepare.append(lambda: built.append(1))
    gw.long_lived.freeze()
    assert built and not gw.long_lived.pending
    assert not _tracked(gw.fjord.queries[ids[119]].sink)


def test_burst_passes_can_be_switched_off() -> None:
    ll = LongLived(quiet_s=3600, burst=0)
    for _ in range(1000):
        ll.changed()
    assert ll.freezes == 0 and ll.pending
