"""A generated fleet of loop-detector stations, for the embedded defaults (no data file needed).

Stations are grouped into segments along a freeway; each reports an average speed per period with
free flow around 65 mph, a morning and an evening rush hour that slow some segments down, and an
occasional incident that slows one segment for a while, so a demo query has something to find.
"""

from __future__ import annotations

import math
import random

from sensors.protocol import Scalar

BASE_LAT, BASE_LON = 34.05, -118.25


def generated_stations(count: int, segments: int, seed: int = 1) -> dict[str, dict[str, Scalar]]:
    """station id -> attributes (latitude, longitude, segment), like METR-LA's stations.csv."""
    if count < 1 or segments < 1:
        raise ValueError("a generated fleet needs at least one station and one segment")
    rng = random.Random(seed)
    out: dict[str, dict[str, Scalar]] = {}
    for i in range(count):
        seg = i * segments // count
        out[f"sim{i:04d}"] = {
            "latitude": round(BASE_LAT + 0.02 * seg + rng.uniform(-0.004, 0.004), 5),
            "longitude": round(BASE_LON + 0.015 * seg + rng.uniform(-0.004, 0.004), 5),
            "segment": f"S{seg + 1:02d}",
        }
    return out


def generated_trace(
    stations: dict[str, dict[str, Scalar]],
    start: float,
    duration_s: float,
    period_s: float = 60.0,
    seed: int = 1,
) -> dict[str, list[tuple[float, float]]]:
    """station -> [(time, speed mph)] every `period_s` from `start` (aligned to the period)."""
    rng = random.Random(seed)
    start = math.floor(start / period_s) * period_s
    steps = int(duration_s // period_s)
    segs = sorted({str(a["segment"]) for a in stations.values()})
    congestion = {s: rng.uniform(0.2, 0.7) for s in segs}  # how hard rush hour hits each segment
    incidents = []
    for _ in range(max(1, int(duration_s // 21_600))):  # about one incident every six hours
        incidents.append(
            (rng.choice(segs), start + rng.uniform(0, duration_s), rng.uniform(1200, 3600))
        )
    out: dict[str, list[tuple[float, float]]] = {}
    for sid, attrs in stations.items():
        seg = str(attrs["segment"])
        series = []
        for k in range(steps):
            t = start + k * period_s
            hour = (t % 86_400) / 3600
            rush = math.exp(-((hour - 8.0) ** 2) / 1.5) + math.exp(-((hour - 17.5) ** 2) / 2.0)
            speed = 66.0 - 40.0 * congestion[seg] * rush + rng.gauss(0, 2.5)
            for iseg, it, dur in incidents:
                if iseg == seg and it <= t < it + dur:
                    speed *= 0.45
            series.append((t, round(max(3.0, min(80.0, speed)), 2)))
        out[sid] = series
    return out
