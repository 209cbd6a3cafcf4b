"""The daemon's background tasks are supervised: a source that fails is logged, counted in
/metrics and restarted with backoff, and /healthz says `degraded` (HTTP 200) with the reason
meanwhile; the scheduler and the HTTP API keep going."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gateway.config import Config, MqttConfig
from gateway.daemon import Gateway
from gateway.http_api import make_app
from tests.support import async_eventually, free_port

pytestmark = pytest.mark.timeout(60)


async def test_a_failing_source_is_restarted_and_health_is_degraded_meanwhile() -> None:
    cfg = Config()
    cfg.simulation = None
    runs = 0
    healed = asyncio.Event()

    async def flaky(gw: Gateway) -> None:
        nonlocal runs
        runs += 1
        if runs <= 2:
            raise RuntimeError(f"source bug #{runs}")
        healed.set()
        await asyncio.Event().wait()

    gw = Gateway(cfg)
    gw.add_source("flaky", flaky)
    async with gw, TestClient(TestServer(make_app(gw))) as http:
        await async_eventually(
            lambda: runs >= 1 and not gw.supervised["flaky"].stats.connected,
            timeout=60,
            interval=0.005,
        )
        resp = await http.get("/healthz")
        assert resp.status == 200
        body = await resp.json()
        assert body["status"] == "degraded"
        assert any("flaky" in r and "source bug" in r for r in body["reasons"])
        await asyncio.wait_for(healed.wait(), 20)
        assert (await (await http.get("/healthz")).json())["status"] == "ok"
        metrics = await (await http.get("/metrics")).text()
        assert 'fjords_task_restarts_total{task="flaky"} 2.0' in metrics
        assert not gw.failed.is_set()  # the daemon keeps running


async def test_health_names_a_broker_that_is_down() -> None:
    cfg = Config()
    cfg.simulation = None
    cfg.mqtt = MqttConfig(url=f"mqtt://127.0.0.1:{free_port()}")  # nobody listens there
    from gateway.sources import configure_sources

    gw = Gateway(cfg)
    configure_sources(gw)
    async with gw:
        for _ in range(200):
            reasons = gw.health()["reasons"]
            if any("link lost" in r for r in reasons):
                break
            await asyncio.sleep(0.02)
        health = gw.health()
        assert health["status"] == "degraded"
        names = " ".join(health["reasons"])
        assert "mqtt-bridge" in names and "mqtt 127.0.0.1" in names
        metrics_links = {name for name, _ in gw.hub_stats()["links"]}
        assert any(n.startswith("mqtt ") for n in metrics_links)
