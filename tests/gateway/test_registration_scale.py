"""Registering queries over HTTP costs the same at the 300th as at the 1st: a registration must
not fold every query into every sensor's demand again (at 1,000 queries that costs ~40 ms a
POST instead of ~10 ms). Work is counted, not timed."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

import proxies.demand as demand
from gateway.config import Config
from gateway.daemon import Gateway
from gateway.sources import configure_sources

SQL = "SELECT time, station, speed FROM traffic WHERE speed >= {} AND speed < {}"


@pytest.fixture
def folded(monkeypatch):
    """How many value ranges the proxies' demand folds merge (the work of folding range
    queries into sensors' demands)."""
    count = [0]
    real = demand.union_ranges

    def counting(ranges):
        ranges = list(ranges)
        count[0] += len(ranges)
        return real(ranges)

    monkeypatch.setattr(demand, "union_ranges", counting)
    return count


async def test_the_300th_registration_folds_queries_plus_sensors(folded, tmp_path) -> None:
    cfg = Config()
    cfg.state_dir = str(tmp_path / "state")
    cfg.http.port = 0
    cfg.http.write_rate_per_s = 0  # 300 POSTs as fast as they go (the limit: test_http_guard.py)
    cfg.simulation.stations = 100  # type: ignore[union-attr]
    gw = Gateway(cfg)
    configure_sources(gw)  # the embedded simulated fleet, as `fjords-gateway run` has it
    async with gw:
        host, port = await gw.start_http()
        async with aiohttp.ClientSession(f"http://{host}:{port}") as http:
            for _ in range(500):  # the simulated motes say hello
                sensors = len((await (await http.get("/sensors")).json())["sensors"])
                if sensors >= 100:
                    break
                await asyncio.sleep(0.01)
            assert sensors >= 100
            per_post = []
            for i in range(300):
                before = folded[0]
                lo = (i * 7) % 70 + (i % 10) / 10
                r = await http.post("/queries", json={"sql": SQL.format(lo, lo + 2)})
                assert r.status == 201, await r.text()
                per_post.append(folded[0] - before)
            await gw.proxies.settle()
            # The stream-wide queries once, each sensor's own (none here): ~300, where a fold
            # per sensor is sensors x 300.
            late = sum(per_post[-50:]) / 50
            assert late < 300 + sensors * 2, late
            listed = (await (await http.get("/sensors")).json())["sensors"]
            traffic = [s for s in listed if s.get("stream") == "traffic"]
            assert traffic and all(len(s["queries"]) == 300 for s in traffic)
