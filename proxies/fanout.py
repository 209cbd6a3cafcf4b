"""`DemandFanOut`: the consumers' demand, carried to every proxy it concerns.

The consumers are the Fjord's queries and the standing demands (`proxies.standing`: the
archive's, the Spark queries'), which its owner names; both are read at each sync.

The demand index (`proxies.demand_index`) says which sensors a change of the queries touches,
at a cost of queries + sensors, not their product. Those sensors are marked stale and update
(each proxy chooses its program again) oldest first: at once for a few milliseconds (all of
them, for a fleet of ordinary size, so a new program goes out in the sensor's next receive
window), the rest in the background in slices, together with those of later changes, so that
a registration never stalls the event loop.

EXPLAIN asks it too (`what_if`): which sensors' program or rate a query would change, with the
cost model's power and battery life before and after, and whom each samples for now (its
`consumers`); nothing changes.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Container
from typing import Any

from firmware_sim.energy import Battery
from firmware_sim.profiles import resolve_profile

from fjords.demand import Demand
from fjords.runtime.fjord import Fjord
from proxies.choice import ProgramChoice
from proxies.clock import StreamClock
from proxies.demand import analyse
from proxies.demand_index import DemandIndex
from proxies.proxy import SensorProxy
from proxies.standing import StandingDemands
from proxies.stats import ManagerStats

__all__ = ["DemandFanOut"]


class DemandFanOut:
    """See the module docstring. The registry adds and removes its proxies; `standing`: the
    demands of consumers other than the Fjord's queries (default: none)."""

    def __init__(
        self,
        fjord: Fjord,
        clock: StreamClock,
        stats: ManagerStats,
        *,
        standing: StandingDemands | None = None,
        default_period_s: float | None = None,
        slice_s: float = 0.004,
    ) -> None:
        self._fjord = fjord
        self.standing = standing if standing is not None else StandingDemands()
        self._clock = clock
        self._stats = stats
        self.slice_s = slice_s  # the longest one update pass holds the event loop
        self._index = DemandIndex(default_period_s=default_period_s)
        self._proxies: dict[str, SensorProxy] = {}
        self._stale: dict[str, None] = {}  # sensors whose demand is still to update, in order
        self._wake: asyncio.Event | None = None  # set while `run` waits for stale sensors

    @property
    def pending(self) -> bool:
        """Whether some sensors' demand is still to update."""
        return bool(self._stale)

    def queries_changed(self, *, background: bool) -> None:
        """Queries (or standing demands) were added or removed: update the sensors they
        concern, at once, or (with `background`, while `run` runs) for a slice at once and the
        rest behind it."""
        self.sync()
        self.update_stale(self.slice_s if background else math.inf)

    def sync(self) -> None:
        """Mark the sensors the consumers' changes touch; `run` updates them."""
        self._stale.update(dict.fromkeys(self._index.sync(self._fjord.queries, self.standing)))
        if self._stale and self._wake is not None:
            self._wake.set()  # (else `run` takes them when it starts)

    def add(self, proxy: SensorProxy, now: float) -> None:
        """A new sensor: index it and give it its demand now."""
        self._proxies[proxy.sensor_id] = proxy
        self.sync()  # (queries changed without `queries_changed` still count)
        self._index.add_sensor(proxy.sensor_id, proxy.stream, proxy.view)
        self.update(proxy, now)

    def remove(self, sensor_id: str) -> None:
        self._index.remove_sensor(sensor_id)
        self._stale.pop(sensor_id, None)
        self._proxies.pop(sensor_id, None)

    def update(self, proxy: SensorProxy, now: float) -> None:
        """Give `proxy` its current demand (it chooses again only if that changed)."""
        demand = self._index.demand(proxy.sensor_id)
        if demand != proxy.demand or proxy.choice is None:
            self._stats.demand_updates += 1
            proxy.set_demand(demand, now)

    def update_stale(self, budget_s: float) -> None:
        """Update stale sensors' demands, oldest first, for at most about `budget_s`."""
        deadline = time.perf_counter() + budget_s
        now = self._clock.now()
        stale = self._stale
        while stale:
            sid = next(iter(stale))
            del stale[sid]
            proxy = self._proxies.get(sid)
            if proxy is not None:
                self.update(proxy, now)
            if time.perf_counter() >= deadline:
                return

    async def run(self) -> None:
        """Update stale sensors in slices, yielding between them, until cancelled."""
        self._wake = wake = asyncio.Event()
        if self._stale:
            wake.set()
        try:
            while True:
                await wake.wait()
                wake.clear()
                while self._stale:
                    self.update_stale(self.slice_s)
                    await asyncio.sleep(0)
        finally:
            self._wake = None
            self.update_stale(math.inf)  # stopped half-way: finish now

    def what_if(self, demand: Demand, *, fixed: Container[str]) -> list[dict[str, Any]]:
        """EXPLAIN: the sensors (but the `fixed` ones, which take no controls) whose program or
        rate would change if a query with `demand` were added, with the cost model's power and
        battery life before and after, and the consumers it samples for now."""
        changes = []
        for sid in sorted(self._proxies):
            proxy = self._proxies[sid]
            if proxy.stream != demand.stream or proxy.choice is None or sid in fixed:
                continue
            extra = analyse("__explain__", demand, proxy.view)
            after = proxy.what_if(self._index.demand(sid, extra))
            before = proxy.choice
            if after.key() == before.key():
                continue
            changes.append(
                {
                    "sensor": sid,
                    "before": _summary(before, proxy.profile),
                    "after": _summary(after, proxy.profile),
                    "reason": after.reason,
                    "consumers": list(proxy.demand.queries),
                }
            )
        return changes


def _summary(choice: ProgramChoice, profile: str) -> dict[str, Any]:
    p = choice.prediction
    power: float | None
    days: float | None
    if p is not None:
        power, days = p.power_mw, p.lifetime_days
    elif choice.program == "sleep":
        # Asleep: the processor idles, the radio is off (the wake-ups every few seconds to check
        # are brief enough to leave out).
        prof = resolve_profile(profile)
        power = prof.cpu_idle_mw
        days = Battery.of(prof).lifetime_s(power) / 86_400.0
    else:
        power = days = None
    return {
        "program": choice.program,
        "sample_rate_hz": choice.rate_hz,
        "power_mw": power,
        "battery_days": days,
    }
