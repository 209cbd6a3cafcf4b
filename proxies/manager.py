"""`ProxyManager`: every sensor's proxy, between the transports and the Fjord.

    async with hub, ProxyManager(fjord, [hub]) as proxies:
        ...                             # readings flow; add or remove queries, then:
        proxies.queries_changed()       # every proxy recomputes its demand and program

The manager owns its tasks, not the transports (enter those yourself, before it). It composes
one part per job, each made with the parts it uses, so a reading goes one way:

    transport -> `Intake` -> `ClockGuards` -> `SensorProxy` -> `Outbox` -> Fjord

- `proxies.intake.Intake`: the transports' messages to their proxies (the listener and one
  reader task per transport), discovery of sensors without a hello, start-up holds.
- `proxies.registry.SensorRegistry`: the catalog of sensors (hellos, plain devices, bounds,
  loop pairs, forgetting silent sensors) and the liveness sweep.
- `proxies.fanout.DemandFanOut`: the queries' demand, and the standing demands of other
  consumers (`standing`: the archive's...), to the proxies it concerns, in slices in the
  background; EXPLAIN's `what_if`.
- `proxies.outbox.Outbox`: pushes into the Fjord through one bounded queue (drop oldest,
  `stats.outbox_drops`) and its pump task; controls to the sensors, in order, by one sender.
- `proxies.clock`: "now" (`StreamClock`, by default stream time) and the per-stream future
  bound on readings' times (`ClockGuards`).

A ticker task sweeps the proxies for silence every `tick_s` (a sensor is offline only if also
silent on `wall_clock` for as long as its limit takes at its own pace: a real-time loop pair
beside a fleet replayed 60x is not silent because stream time raced ahead), forgets sensors
silent for `forget_offline_after_s` and wakes the routers so they notice idleness when nothing
flows. Stream progress is not the manager's: each proxy announces its sensor's pace and the
stream's router releases quiet sensors by wall-clock idleness (`fjords.runtime.progress`).
Every drop is counted (`stats`) and logged once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Self

from fjords.demand import Demand
from fjords.runtime.fjord import Fjord
from fjords.runtime.progress import ProgressPolicy
from fjords.supervision import log_task_failure
from proxies.admission import NewIdLimit
from proxies.choice import DEFAULT_SLEEP_S
from proxies.clock import ClockGuards, StreamClock
from proxies.control import DEFAULT_RETRY_AFTER_S
from proxies.discovery import Discovery
from proxies.fanout import DemandFanOut
from proxies.intake import Intake
from proxies.outbox import Outbox
from proxies.pair import PairJoin
from proxies.proxy import SensorProxy
from proxies.registry import SensorRegistry, StreamFor, default_stream_for
from proxies.stall import DEFAULT_STALL_AFTER, DEFAULT_STALL_MIN_S
from proxies.standing import StandingDemands
from proxies.stats import ManagerStats
from sensors.transports.base import Transport

__all__ = ["ManagerStats", "ProxyManager", "default_stream_for"]

log = logging.getLogger("proxies")


class ProxyManager:
    """See the module docstring. `on_catalog_change(removed)` is told when a sensor joins the
    catalog (False) or leaves it (True): the gateway keeps long-lived objects out of the
    garbage collector's way. `discovery` holds the data of sensors without a hello (default:
    `Discovery()`). `standing`: the demands of consumers other than the Fjord's queries (the
    gateway's archive, its Spark queries), which its owner changes and then calls
    `queries_changed`."""

    def __init__(
        self,
        fjord: Fjord,
        transports: Sequence[Transport],
        *,
        stream_for: StreamFor | None = None,
        default_period_s: float | None = None,
        profile: str = "paper",
        queue_bound: int = 10_000,
        clock: Callable[[], float] | None = None,
        offline_after: float = 3.0,
        stall_after: float = DEFAULT_STALL_AFTER,
        stall_min_s: float = DEFAULT_STALL_MIN_S,
        retry_windows: int = 2,
        max_sends: int = 5,
        retry_after_s: float = DEFAULT_RETRY_AFTER_S,
        sleep_s: float = DEFAULT_SLEEP_S,
        listen_ms_per_s: float | None = None,
        pushdown: bool = True,
        tick_s: float = 1.0,
        max_travel_s: float = 0.5,
        max_sensors: int = 10_000,
        forget_offline_after_s: float = 86_400.0,
        max_hello_attributes: int = 64,
        max_hello_bytes: int = 4096,
        wall_clock: Callable[[], float] = time.monotonic,
        progress: ProgressPolicy | None = None,
        on_catalog_change: Callable[[bool], None] | None = None,
        discovery: Discovery | None = None,
        standing: StandingDemands | None = None,
        max_new_per_minute: float | None = None,
        forget_unknown_after_s: float | None = None,
        max_unknown: int | None = None,
    ) -> None:
        self.fjord = fjord
        self.transports = list(transports)
        self.tick_s = tick_s
        self.stats = stats = ManagerStats()
        self.progress_policy = progress or fjord.progress_policy or ProgressPolicy()
        if discovery is None:
            discovery = Discovery(
                max_sensors=1024 if max_unknown is None else max_unknown,
                forget_after_s=math.inf
                if forget_unknown_after_s is None
                else forget_unknown_after_s,
            )
        self.discovery = discovery
        self.clock = StreamClock(clock)
        self.guards = ClockGuards(fjord, self.progress_policy)
        self.outbox = Outbox(fjord, self.guards, self.clock, stats, bound=queue_bound)
        self.fanout = DemandFanOut(
            fjord, self.clock, stats, standing=standing, default_period_s=default_period_s
        )
        self.registry = SensorRegistry(
            fjord,
            outbox=self.outbox,
            guards=self.guards,
            fanout=self.fanout,
            clock=self.clock,
            stats=stats,
            stream_for=stream_for or default_stream_for(fjord),
            proxy_options={
                "profile": profile,
                "default_period_s": default_period_s,
                "offline_after": offline_after,
                "stall_after": stall_after,
                "stall_min_s": stall_min_s,
                "retry_windows": retry_windows,
                "max_sends": max_sends,
                "retry_after_s": retry_after_s,
                "sleep_s": sleep_s,
                "listen_ms_per_s": listen_ms_per_s,
                "control": pushdown,
            },
            wall_clock=wall_clock,
            max_travel_s=max_travel_s,
            max_sensors=max_sensors,
            forget_offline_after_s=forget_offline_after_s,
            max_hello_attributes=max_hello_attributes,
            max_hello_bytes=max_hello_bytes,
            on_catalog_change=on_catalog_change,
        )
        self.intake = Intake(
            fjord,
            registry=self.registry,
            outbox=self.outbox,
            guards=self.guards,
            clock=self.clock,
            discovery=self.discovery,
            stats=stats,
            wall_clock=wall_clock,
            tick_s=tick_s,
            idle_timeout_s=self.progress_policy.idle_timeout_s,
            new_ids=None
            if max_new_per_minute is None
            else NewIdLimit(
                max_new_per_minute,
                startup=max_sensors + (1024 if max_unknown is None else max_unknown),
                startup_s=self.progress_policy.idle_timeout_s,
            ),
        )
        self._task: asyncio.Task[None] | None = None

    @property
    def proxies(self) -> dict[str, SensorProxy]:
        """Every sensor's proxy, by sensor id."""
        return self.registry.proxies

    @property
    def pairs(self) -> dict[str, PairJoin]:
        """The loop pairs, by pair id."""
        return self.registry.pairs

    # -- lifecycle -----------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self.run(), name="proxy-manager")
        self._task.add_done_callback(functools.partial(log_task_failure, logger=log))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
        self.outbox.flush()

    async def run(self) -> None:
        """Read every transport, pump the outbox, tick; until cancelled or the transports end."""
        intake, outbox = self.intake, self.outbox
        listening = [t for t in self.transports if hasattr(t, "set_listener")]
        for t in listening:
            t.set_listener(functools.partial(intake.arrived, t))
        try:
            async with asyncio.TaskGroup() as tg:
                readers = [
                    tg.create_task(intake.read(t), name=f"proxy-reader-{i}")
                    for i, t in enumerate(self.transports)
                ]
                pump = tg.create_task(outbox.pump(), name="proxy-pump")
                sender = tg.create_task(outbox.sender(), name="proxy-sender")
                ticker = tg.create_task(self._ticker(), name="proxy-ticker")
                demand = tg.create_task(self.fanout.run(), name="proxy-demand")
                await asyncio.gather(*readers)
                ticker.cancel()
                demand.cancel()
                await outbox.sent()  # what the readers asked for is sent
                sender.cancel()
                outbox.close()
                await pump
        finally:
            for t in listening:
                t.set_listener(None)

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            self.tick()

    # -- what the gateway calls ------------------------------------------------------------
    def now(self) -> float:
        return self.clock.now()

    def queries_changed(self) -> None:
        """Queries or standing demands were added or removed: the proxies they concern update
        demand and program (`proxies.fanout`: while the manager runs, a registration never
        stalls the loop)."""
        running = self._task is not None and not self._task.done()
        self.fanout.queries_changed(background=running)

    def what_if(self, demand: Demand) -> list[dict[str, Any]]:
        """EXPLAIN: the sensors whose program or rate would change if a query with `demand`
        were added, with the cost model's power and battery life before and after."""
        return self.fanout.what_if(demand, fixed=self.registry.fixed)

    def programmable(self, sensor_id: str) -> bool:
        """Whether the sensor takes controls (plain devices do not)."""
        return self.registry.programmable(sensor_id)

    def clock_report(self, proxy: SensorProxy) -> dict[str, Any]:
        """`clock_rejects` (readings dated implausibly far ahead, dropped), `clock_suspect` and
        the offset of the sensor's latest reading from the gateway's clock and its peers."""
        return self.guards.report(proxy)

    def forget(self, sensor_id: str) -> None:
        """Remove a sensor from the catalog and from its stream's progress."""
        self.registry.forget(sensor_id)

    def stalled(self) -> list[str]:
        """The sensors whose data stopped while their programs should send (`proxies.stall`)."""
        return self.registry.stalled()

    def tick(self) -> None:
        """Check every proxy for silence now (the ticker task does this every `tick_s`); let
        the streams notice idle sensors; forget sensors silent for `forget_offline_after_s`."""
        self.registry.sweep()
        self.registry.forget_silent()
        self.intake.forget_unknown()
        self.fjord.check_idle()

    async def settle(self) -> None:
        """Wait until every message received so far is handled and its tuples are pushed."""
        while True:
            waiting = any(
                t.stats.received - t.stats.dropped_queue_full > t.stats.delivered
                for t in self.transports
            )
            if not (waiting or self.intake.busy or self.outbox.pending or self.fanout.pending):
                return
            await asyncio.sleep(0)

    def flush_pairs(self) -> None:
        """End of input: vehicles still waiting for a partner come out alone."""
        self.outbox.put(self.registry.unpaired())
        self.outbox.flush()
