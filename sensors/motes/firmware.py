"""A fleet of firmware motes: the AVR protocol image in simavr, one per station, behind a base station.

Each station's readings go into its mote's A-to-D (``scale`` counts per unit, 10-bit); the
mote's UART bytes are forwarded to the :class:`~sensors.transports.serial.PtyBaseStation`
frame by frame exactly as the firmware wrote them, and the gateway's controls for a sensor
reach that mote's receiver as the gateway's bytes (the station's `device_link`: a sealed
control's tag covers them, so nothing re-encodes it), heard in its next listen window. Unlike
:class:`~sensors.motes.replay.TraceReplayFleet`, nothing here is Python's idea of a mote: what
the gateway sees is what the firmware sends.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from firmware_sim.loop import (
    DEFAULT_BUILD,
    FirmwareMote,
    Image,
    LoopError,
    MoteConfig,
    build_image,
    to_counts,
)

from sensors.auth import Keyring
from sensors.framing import FrameDecoder, FrameError, frame_payload
from sensors.protocol import Samples, Scalar
from sensors.transports.serial import PtyBaseStation, PtyDeviceLink

__all__ = ["FirmwareFleet", "FleetStats", "grid"]

log = logging.getLogger(__name__)

#: Counts per mile per hour: 0.1 mph resolution, up to 102.3 mph in 10 bits.
DEFAULT_SCALE = 10.0


@dataclass(slots=True)
class FleetStats:
    frames: int = 0
    samples: int = 0
    bad_frames: int = 0
    controls: int = 0
    #: Per sensor, the firmware's frames by message kind (what it actually sent).
    kinds: dict[str, Counter[str]] = field(default_factory=dict)


def grid(series: list[tuple[float, float]]) -> tuple[float, float, list[float]]:
    """(start s, step s, values on a regular grid): gaps repeat the last reading."""
    times = [t for t, _ in series]
    steps = [b - a for a, b in itertools.pairwise(times) if b > a]
    step = min(steps) if steps else 300.0
    start = times[0]
    n = round((times[-1] - start) / step) + 1
    values: list[float] = [math.nan] * n
    for t, v in series:
        values[min(n - 1, round((t - start) / step))] = v
    last = next((v for v in values if not math.isnan(v)), 0.0)
    for i, v in enumerate(values):
        if math.isnan(v):
            values[i] = last
        last = values[i]
    return start, step, values


class FirmwareFleet:
    """One :class:`~firmware_sim.loop.FirmwareMote` per station behind `station`."""

    def __init__(
        self,
        trace: dict[str, list[tuple[float, float]]],
        stations: Mapping[str, Mapping[str, Scalar]],
        station: PtyBaseStation,
        *,
        program: str = "raw",
        limit: int | None = None,
        scale: float = DEFAULT_SCALE,
        listen_every_periods: int = 1,
        window_wall_ms: int = 50,
        build_dir: Path = DEFAULT_BUILD,
        keys: Keyring | None = None,
    ) -> None:
        """`keys`: each mote's key goes into its EEPROM (``keys.key_for(sensor_id)``): it seals
        everything it sends and obeys only sealed controls; a mote without a key (or no
        `keys`) is unauthenticated."""
        ids = [s for s in stations if trace.get(s)]
        if limit is not None:
            ids = ids[:limit]
        if not ids:
            raise ValueError("no station has both attributes and readings")
        self.trace = trace
        self.station = station
        self.program = program
        self.stats = FleetStats()
        self.decoder = FrameDecoder()
        self.window_wall_ms = window_wall_ms
        self.build_dir = build_dir
        self.configs: dict[str, tuple[MoteConfig, list[int], float]] = {}
        self.energy: dict[str, dict[str, Any]] = {}
        self.links: dict[str, PtyDeviceLink] = {}
        for sid in ids:
            start, step, values = grid(trace[sid])
            attrs = {"station": sid, **stations[sid]}
            config = MoteConfig(
                sensor_id=sid,
                period_ms=round(step * 1000),
                start_ms=round(start * 1000),
                field="speed",
                scale=scale,
                program=program,
                listen_every_ms=round(step * 1000) * listen_every_periods,
                attributes=attrs,
                key=keys.key_for(sid) if keys is not None else None,
            )
            self.configs[sid] = (config, to_counts(values, scale), step * 1000)

    @property
    def samples(self) -> int:
        return self.stats.samples

    async def run(self, speedup: float | None = None) -> None:
        """Run every mote to the end of its trace (each in its own simavr process)."""
        image = await asyncio.to_thread(build_image, self.build_dir)
        try:
            await self._run_all(image, speedup)
        except* LoopError as group:  # one mote's runner failed: say which, not a group
            raise group.exceptions[0] from None

    async def _run_all(self, image: Image, speedup: float | None) -> None:
        async with asyncio.TaskGroup() as tg:
            for sid, (config, counts, step_ms) in self.configs.items():
                mote = FirmwareMote(
                    config,
                    counts,
                    step_ms,
                    image=image,
                    speedup=speedup,
                    window_wall_ms=self.window_wall_ms,
                )
                tg.create_task(self._run_one(mote), name=f"firmware mote {sid}")

    async def _run_one(self, mote: FirmwareMote) -> None:
        sid = mote.config.sensor_id
        link = self.links[sid] = self.station.device_link(sid)  # its controls, as sent
        async with mote, asyncio.TaskGroup() as tg:
            controls = tg.create_task(self._controls(mote, link), name=f"controls {sid}")
            await self._forward(mote)
            self.energy[sid] = await mote.wait()
            controls.cancel()

    def report(self) -> list[str]:
        """One line per mote: the frames its firmware sent, by kind, and the controls it
        ignored as not authentic."""
        lines = []
        for sid, kinds in self.stats.kinds.items():
            line = f"firmware mote {sid} sent " + ", ".join(
                f"{kind} {n}" for kind, n in sorted(kinds.items())
            )
            ignored = {k: n for k, n in self.energy.get(sid, {}).get("rejected", {}).items() if n}
            if ignored:
                line += "; ignored controls: " + ", ".join(f"{k} {n}" for k, n in ignored.items())
            lines.append(line)
        return lines

    def per_mote(self) -> dict[str, dict[str, Any]]:
        """Per mote that ran to its end: frames it sent (and by kind), readings it converted, the controls
        its firmware ignored as not authentic (`rejected`, by reason) and those the base
        station dropped (more queued than the mote took)."""
        return {
            sid: {
                "frames": sum(self.stats.kinds.get(sid, Counter()).values()),
                "sent": dict(self.stats.kinds.get(sid, Counter())),
                "taken": stats.get("conversions", 0),
                "controls_ignored": dict(stats.get("rejected", {})),
                "controls_dropped": self.links[sid].dropped if sid in self.links else 0,
            }
            for sid, stats in self.energy.items()
        }

    async def _forward(self, mote: FirmwareMote) -> None:
        """The mote's UART to the base station, one whole frame at a time."""
        kinds = self.stats.kinds.setdefault(mote.config.sensor_id, Counter())
        pending = bytearray()
        while data := await mote.read():
            pending += data
            *frames, rest = bytes(pending).split(b"\x00")
            pending = bytearray(rest)
            for body in frames:
                if not body:
                    continue
                frame = b"\x00" + body + b"\x00"
                self.station.write_frame(frame)
                self.stats.frames += 1
                for item in self.decoder.feed(frame):  # only to count what went out
                    if isinstance(item, FrameError):
                        if not self.stats.bad_frames:
                            log.warning("firmware %s sent a bad frame: %s", mote.config, item)
                        self.stats.bad_frames += 1
                        continue
                    kinds[item.kind] += 1
                    if isinstance(item, Samples):
                        self.stats.samples += len(item.times)
            await self.station.room()

    async def _controls(self, mote: FirmwareMote, link: PtyDeviceLink) -> None:
        while True:
            control = await link.next_control()
            self.stats.controls += 1
            await mote.write(frame_payload(control))
