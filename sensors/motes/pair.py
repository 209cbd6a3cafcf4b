"""The paper's traffic loop-detector pair (section 5.1) as two simulated motes.

Upstream S_u and downstream S_d light sensors lie `separation_ft` apart in one lane; the
light readings come from :func:`firmware_sim.traces.vehicle_pair_trace` (Poisson arrivals,
realistic speeds and lengths). Each mote samples the trace at its own period, which the
gateway can change with `set_period`, and runs `raw`, `vehicle` or `count`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from firmware_sim.traces import LoopPairTrace, vehicle_pair_trace

from sensors.motes.faults import FaultInjector, MoteClock
from sensors.motes.mote import Pacer, SimulatedMote
from sensors.transports.base import MoteLink

__all__ = ["TrafficPair"]

ROLES = ("upstream", "downstream")


class TrafficPair:
    """Two motes `{pair_id}-u` and `{pair_id}-d`; `link_for(sensor_id)` gives each its link."""

    def __init__(
        self,
        pair_id: str,
        link_for: Callable[[str], MoteLink],
        *,
        duration_s: float = 60.0,
        rate_hz: float = 180.0,
        vehicles_per_second: float = 1.0,
        separation_ft: float = 6.0,
        program: str = "vehicle",
        params: dict[str, Any] | None = None,
        seed: int = 0,
        clocks: tuple[MoteClock, MoteClock] | None = None,
        faults: tuple[FaultInjector, FaultInjector] | None = None,
        trace: LoopPairTrace | None = None,
        start: float = 0.0,
        **mote_options: Any,
    ) -> None:
        self.pair_id = pair_id
        self.start = start  # the trace's time 0 on the motes' clocks (e.g. epoch seconds)
        self.duration_s = duration_s
        self.trace = trace or vehicle_pair_trace(
            duration_s,
            rate_hz=rate_hz,
            vehicles_per_second=vehicles_per_second,
            separation_ft=separation_ft,
            seed=seed,
        )
        self.motes: dict[str, SimulatedMote] = {}
        for i, role in enumerate(ROLES):
            sensor_id = f"{pair_id}-{role[0]}"
            p = dict(params or {})
            if program == "vehicle":
                p.setdefault("role", role)
            mote = SimulatedMote(
                sensor_id,
                link_for(sensor_id),
                field="light",
                program=program,
                params=p,
                period_s=1.0 / self.trace.rate_hz,
                attributes={
                    "pair": pair_id,
                    "role": role,
                    "separation_ft": self.trace.separation_ft,
                },
                clock=clocks[i] if clocks else None,
                faults=faults[i] if faults else None,
                **mote_options,
            )
            mote.period_adjustable = True
            self.motes[role] = mote

    @property
    def upstream(self) -> SimulatedMote:
        return self.motes["upstream"]

    @property
    def downstream(self) -> SimulatedMote:
        return self.motes["downstream"]

    def value_at(self, role: str, t: float) -> float:
        values = self.trace.upstream if role == "upstream" else self.trace.downstream
        k = min(len(values) - 1, int((t - self.start) * self.trace.rate_hz + 1e-9))
        return values[k]

    async def run(self, speedup: float | None = None) -> None:
        """Both motes sample the whole trace concurrently (speedup None: as fast as possible)."""
        async with asyncio.TaskGroup() as tg:
            for role, mote in self.motes.items():
                tg.create_task(self._run_one(role, mote, Pacer(speedup, origin=self.start)))

    async def _run_one(self, role: str, mote: SimulatedMote, pacer: Pacer) -> None:
        await mote.link.send(mote.hello())
        # t = origin + k x period, restarted whenever set_period changes the period
        origin, k, period, t = self.start, 0, mote.period_s, self.start
        while True:
            if mote.period_s != period:
                origin, k, period = t + mote.period_s, 0, mote.period_s
            t = origin + k * period
            if t >= self.start + self.duration_s:
                break
            await mote.step(t, self.value_at(role, t), pacer)
            k += 1
            if k % mote.yield_every == 0:
                await asyncio.sleep(0)
        await mote.finish()
