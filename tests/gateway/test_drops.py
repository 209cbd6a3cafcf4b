"""No silent loss: every drop is counted under fjords_dropped_total{stage, reason}, logged the
first time, and /healthz says `degraded` while drops increase."""

from __future__ import annotations

import asyncio
import logging

from gateway import metrics
from gateway.config import Config
from gateway.daemon import Gateway
from gateway.drops import DropWatch, drop_counts


def rows(n: int, start: int = 0) -> list[tuple]:
    return [(float(i), f"st{i % 3}", 50.0, 34.0, -118.0, "S1") for i in range(start, start + n)]


def test_drop_watch_logs_once_and_reports_only_while_increasing(caplog) -> None:
    now = [0.0]
    counts = {("stream:traffic", "late"): 0}
    watch = DropWatch(
        lambda: {k: v for k, v in counts.items() if v}, window_s=60, clock=lambda: now[0]
    )
    assert watch.health() == []
    with caplog.at_level(logging.WARNING, logger="gateway.drops"):
        for step in range(1, 5):
            now[0] = step * 10.0
            counts["stream:traffic", "late"] = step * 3
            reasons = watch.health()
            assert reasons == [f"dropping data: stream:traffic late (+{step * 3} in the last 60 s)"]
    assert sum("dropping data: stream:traffic (late)" in r.message for r in caplog.records) == 1
    now[0] = 200.0  # no new drops for longer than the window: healthy again, counter kept
    assert watch.health() == [] and watch.health() == []


async def test_the_gateway_counts_every_stage_and_degrades() -> None:
    cfg = Config()
    cfg.simulation = None
    cfg.queue_bound = 10
    cfg.http.client_buffer_rows = 5
    async with Gateway(cfg) as gw:
        rq = gw.add_query("SELECT station, speed FROM traffic")
        sub = gw.hub.subscribe(rq.id)  # a client that never reads
        for t in rows(100):  # faster than the Fjord runs: the stream's queue overflows
            gw.fjord.push("traffic", t)
        await asyncio.sleep(0.2)
        for t in rows(20, start=100):  # in step with the Fjord, but the client buffer holds only 5
            gw.fjord.push("traffic", t)
            await asyncio.sleep(0)
        await asyncio.sleep(0.2)
        counts = drop_counts(gw)
        assert counts[("stream:traffic", "queue_full")] == 90
        assert counts[("result_clients", "buffer_full")] == 10 + 20 - 5
        health = gw.health()
        assert health["status"] == "degraded"
        assert any("stream:traffic queue_full" in r for r in health["reasons"])
        text = metrics.render(gw.fjord, gw.sensors, gw.hub_stats, gw.drop_watch.counts).decode()
        assert 'fjords_dropped_total{reason="queue_full",stage="stream:traffic"} 90.0' in text
        sub.close()


async def test_a_union_counts_rows_its_merge_could_not_keep_in_order() -> None:
    """UNION ALL over two streams, one without sensors: the merge does not wait for it, and a
    row it sends later that would go back in time is dropped and counted."""
    cfg = Config()
    cfg.simulation = None
    async with Gateway(cfg) as gw:
        from fjords.runtime.operators.joins import ZipperMerge
        from fjords.schema import Schema

        gw.fjord.add_stream("other", Schema([("time", "float"), ("s", "str")], time="time"), "s")
        rq = gw.add_query("SELECT time, station FROM traffic UNION ALL SELECT time, s FROM other")
        merge = next(op for op in rq.operators if isinstance(op, ZipperMerge))
        merge.max_held = 3
        for t in rows(10, start=100):
            gw.fjord.push("traffic", t)
        await asyncio.sleep(0.05)
        gw.fjord.run_until_idle()
        gw.fjord.push("other", (1.0, "x"))  # far behind what was output meanwhile
        for _ in range(5):
            await asyncio.sleep(0.05)
            gw.fjord.run_until_idle()
        assert merge.forced == 0  # not held until the bound: "other" held nothing back
        assert drop_counts(gw)[("queries", "union_out_of_order")] == 1
