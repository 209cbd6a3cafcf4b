"""The generated fleet behind the embedded defaults looks like a loop-detector network."""

from __future__ import annotations

import itertools

import pytest

from gateway.fleet import generated_stations, generated_trace


def test_stations_are_grouped_into_segments() -> None:
    st = generated_stations(40, 8)
    assert len(st) == 40
    assert sorted({a["segment"] for a in st.values()}) == [f"S{i:02d}" for i in range(1, 9)]


def test_trace_is_periodic_plausible_and_deterministic() -> None:
    st = generated_stations(10, 2)
    tr = generated_trace(st, start=1_330_588_800 + 17, duration_s=86_400, period_s=60)
    series = tr["sim0000"]
    assert len(series) == 1440 and series[0][0] == 1_330_588_800
    assert all(b[0] - a[0] == 60 for a, b in itertools.pairwise(series))
    speeds = [v for s in tr.values() for _, v in s]
    assert 3 <= min(speeds) < 50 < max(speeds) <= 80  # free flow and slow-downs both occur
    assert tr == generated_trace(st, start=1_330_588_800 + 17, duration_s=86_400, period_s=60)


def test_bad_sizes() -> None:
    with pytest.raises(ValueError):
        generated_stations(0, 1)
