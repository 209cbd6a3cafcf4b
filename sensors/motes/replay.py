"""Replaying a recorded trace: one scalar mote per station (METR-LA readings.csv).

`readings.csv` has `time,station,speed` rows (unix seconds); `stations.csv` has
`station,latitude,longitude,segment`, which every mote puts in its hello's attributes. The
fleet replays as fast as the links take it (`speedup=None`) or `speedup` times real time.
Each mote accepts `set_period` at whole multiples of its trace's step (it sub-samples the
trace), so SAMPLE PERIOD and LIFETIME change what it sends.
"""

from __future__ import annotations

import asyncio
import csv
import math
import os
import stat
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sensors.motes.faults import FaultInjector
from sensors.motes.mote import Pacer, SimulatedMote
from sensors.protocol import Scalar
from sensors.transports.base import MoteLink

__all__ = ["TraceFormatError", "TraceReplayFleet", "load_stations", "load_trace"]


class TraceFormatError(ValueError):
    """A trace or stations file that cannot be replayed; says which file, line and why."""


def _rows(path: Path, required: tuple[str, ...]) -> tuple[csv.DictReader[str], Any]:
    if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block, a device never end
        raise TraceFormatError(f"{path}: not a regular file")
    f = path.open(newline="")
    reader = csv.DictReader(f)
    header = reader.fieldnames  # read once: after the close it would read again
    missing = [c for c in required if c not in (header or [])]
    if missing:
        f.close()
        raise TraceFormatError(f"{path}: missing column(s) {missing}; header is {header}")
    return reader, f


def load_trace(
    path: str | Path, *, value: str = "speed", stations: set[str] | None = None
) -> dict[str, list[tuple[float, float]]]:
    """station -> [(time, value)] sorted by time; rows of other stations, and rows with no value
    (a missing reading), are skipped."""
    path = Path(path)
    reader, f = _rows(path, ("time", "station", value))
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    with f:
        for row in reader:
            station = row["station"]
            if stations is not None and station not in stations:
                continue
            if row[value] in ("", None):
                continue  # no reading at that time: a mote has nothing to send
            try:
                t, v = float(row["time"]), float(row[value])
            except (TypeError, ValueError):
                raise TraceFormatError(
                    f"{path}:{reader.line_num}: time and {value} must be numbers, got {row}"
                ) from None
            if not (math.isfinite(t) and math.isfinite(v)):
                raise TraceFormatError(f"{path}:{reader.line_num}: non-finite number in {row}")
            out[station].append((t, v))
    for series in out.values():
        series.sort()
    return dict(out)


def load_stations(path: str | Path) -> dict[str, dict[str, Scalar]]:
    """station -> its attributes (numbers parsed where they are numbers)."""
    path = Path(path)
    reader, f = _rows(path, ("station",))
    out: dict[str, dict[str, Scalar]] = {}
    with f:
        for row in reader:
            attrs: dict[str, Scalar] = {}
            for k, v in row.items():
                if k == "station" or k is None:
                    continue
                if k not in ("latitude", "longitude"):
                    attrs[k] = v
                    continue
                try:
                    attrs[k] = number = float(v)
                except (TypeError, ValueError):
                    raise TraceFormatError(
                        f"{path}:{reader.line_num}: {k} is not a number: {v!r}"
                    ) from None
                if not math.isfinite(number):
                    raise TraceFormatError(f"{path}:{reader.line_num}: {k} is not finite: {v!r}")
            station = row["station"]
            if not station or any(c in station for c in "/+#\0"):  # an MQTT topic level, a URL's
                raise TraceFormatError(
                    f"{path}:{reader.line_num}: station {station!r} cannot be a sensor id "
                    "(no '/', '+', '#' or NUL)"
                )
            out[station] = attrs
    return out


class TraceReplayFleet:
    """One :class:`SimulatedMote` per station; `link_for(sensor_id)` gives each its link."""

    def __init__(
        self,
        trace: dict[str, list[tuple[float, float]]],
        stations: dict[str, dict[str, Scalar]],
        link_for: Callable[[str], MoteLink],
        *,
        program: str = "raw",
        params: dict[str, Any] | None = None,
        faults: Callable[[str], FaultInjector] | None = None,
        limit: int | None = None,
        backpressure: bool = True,
        **mote_options: Any,
    ) -> None:
        ids = [s for s in stations if s in trace]
        if not ids:
            raise TraceFormatError("no station has both attributes and readings")
        if limit is not None:
            ids = ids[:limit]
        self.trace = trace
        self.motes: dict[str, SimulatedMote] = {}
        for station in ids:
            series = trace[station]
            period = series[1][0] - series[0][0] if len(series) > 1 else 300.0
            options = dict(mote_options)
            # A receive window per raw packet (8 readings) at most: rides on the data.
            options.setdefault("listen_every_s", 8 * period)
            # set_period at whole multiples of the trace's step sub-samples it.
            options.setdefault("trace_step_s", period)
            self.motes[station] = SimulatedMote(
                station,
                link_for(station),
                field="speed",
                program=program,
                params=params,
                period_s=period,
                attributes={"station": station, **stations[station]},
                faults=faults(station) if faults else None,
                backpressure=backpressure,
                **options,
            )
        self.start = min(trace[s][0][0] for s in self.motes)

    @property
    def samples(self) -> int:
        return sum(len(self.trace[s]) for s in self.motes)

    async def run(self, speedup: float | None = None) -> None:
        """All motes replay concurrently; returns when every one has sent its last reading."""
        async with asyncio.TaskGroup() as tg:
            for station, mote in self.motes.items():
                tg.create_task(
                    mote.run(self.trace[station], Pacer(speedup, origin=self.start)),
                    name=f"mote {station}",
                )
