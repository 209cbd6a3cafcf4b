"""Spark over a fleet: two gateways' archives under one root (the METR-LA trace, its stations
split between gateways A and B), read per gateway with the stream's declared schema (the session's `local[2]` SparkSession:
tests/conftest.py `spark`).

Batch and streaming results per (gateway, window) are checked exactly against a brute force in
pyarrow; a gateway a day behind the other loses nothing (one watermark per gateway, `min`);
late readings are counted per gateway, in readings, against what the results lack; segments
that drift from the declared schema are read (NULL, cast) or refused and counted, never a
failed job; the CLI takes `--gateway` and several `--archive`.
"""

from __future__ import annotations

import io
import json
import logging
from collections import defaultdict
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.support import shared_file

pytestmark = pytest.mark.needs_spark

WINDOW = 3600.0
DAY = 86_400
Q_COUNT = (
    "SELECT gateway, COUNT(*) AS n, SUM(speed) AS total FROM traffic [RANGE 1 HOUR] "
    "GROUP BY gateway"
)


@pytest.fixture(scope="module")
def two_days() -> pa.Table:
    """Two days of the METR-LA trace as the gateways archive it, with a gateway per station:
    the first half of the stations (sorted) is A's, the rest B's."""
    from gateway.spark.sources import trace_table

    week = trace_table(
        shared_file("data/metr-la/readings.csv"), shared_file("data/metr-la/stations.csv")
    )
    t0 = week["time"][0].as_py()
    t = week.filter(pc.less(week["time"], t0 + 2 * DAY))
    stations = sorted(set(t["station"].to_pylist()))
    a = pa.array(stations[: len(stations) // 2])
    gw = pc.if_else(pc.is_in(t["station"], value_set=a), "A", "B")
    return t.append_column("gw", gw)


def of(t: pa.Table, gateway: str) -> pa.Table:
    return t.filter(pc.equal(t["gw"], gateway)).drop_columns(["gw"])


def brute(t: pa.Table, gateway: str) -> dict[tuple[str, float], tuple[int, float]]:
    """(gateway, window_start) -> (readings, sum of speed) of one gateway's rows."""
    acc: dict[tuple[str, float], list[float]] = defaultdict(lambda: [0, 0.0])
    for time, speed in zip(t["time"].to_pylist(), t["speed"].to_pylist(), strict=True):
        a = acc[(gateway, (time // WINDOW) * WINDOW)]
        a[0] += 1
        a[1] += speed if speed is not None else 0.0
    return {k: (int(n), s) for k, (n, s) in acc.items()}


def as_counts(rows: list[dict]) -> dict[tuple[str, float], tuple[int, float]]:
    out = {}
    for r in rows:
        key = (r["gateway"], r["window_start"])
        assert key not in out, f"window {key} output twice"
        out[key] = (r["n"], r["total"] or 0.0)
    return out


def assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k, (n, s) in want.items():
        assert got[k][0] == n, k
        assert got[k][1] == pytest.approx(s, rel=1e-9, abs=1e-6), k


def test_batch_reads_every_gateway_exactly(spark, two_days: pa.Table, tmp_path: Path) -> None:
    from gateway.spark.batch import result_rows, run_archive
    from gateway.spark.sources import archive_table

    root = tmp_path / "archive"
    for g in ("A", "B"):
        archive_table(of(two_days, g), root, gateway=g, segments=4)
    want = {**brute(of(two_days, "A"), "A"), **brute(of(two_days, "B"), "B")}
    _, df = run_archive(spark, Q_COUNT, root)
    assert_same(as_counts(result_rows(df)), want)
    _, df = run_archive(spark, Q_COUNT, root, gateways=["B"])
    assert_same(as_counts(result_rows(df)), brute(of(two_days, "B"), "B"))
