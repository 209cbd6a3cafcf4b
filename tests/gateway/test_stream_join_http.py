"""A stream-stream join where a user meets it: registered over HTTP on the daemon, its rows
on the result stream as soon as both partners arrived, its state in /metrics, and a join that
breaks the rule refused with a 400 at the clause's line and column."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from gateway.config import Config
from gateway.daemon import Gateway
from tests.gateway.test_openapi import call
from tests.support import query_routes

JOIN = (
    "SELECT a.station, b.station AS other, b.speed - a.speed AS faster_by "
    "FROM traffic AS a [RANGE 5 MINUTES], traffic AS b [RANGE 5 MINUTES] "
    "WHERE a.segment = b.segment AND a.speed < b.speed - 10"
)


def row(t: float, station: str, speed: float, segment: str = "S1") -> tuple:
    return (t, station, speed, 34.0, -118.0, segment)


def _config(tmp_path) -> Config:
    cfg = Config()
    cfg.state_dir = str(tmp_path / "state")
    cfg.http.port = 0
    return cfg


async def _settle(gw: Gateway) -> None:
    for _ in range(20):
        await asyncio.sleep(0.01)
        gw.fjord.run_until_idle()


async def test_the_daemon_runs_a_stream_stream_join_registered_over_http(tmp_path) -> None:
    async with Gateway(_config(tmp_path)) as gw:
        host, port = await gw.start_http()
        base = f"http://{host}:{port}"
        async with aiohttp.ClientSession() as http:
            dry = await call(http, base, "POST", "/queries", {"sql": JOIN, "dry_run": True})
            assert dry.status_code == 200, dry.data
            plan = json.loads(dry.data)
            assert plan["shape"] == "stream-stream join"
            ops = [op["operator"] for op in plan["operators"]]
            assert ops[0] == "symmetric_hash_join"
            r = await call(http, base, "POST", "/queries", {"sql": JOIN})
            assert r.status_code == 201, r.data
            qid = json.loads(r.data)["id"]
            sub = gw.hub.subscribe(qid)
            # Two readings of one window, no watermark past it: the pair is out at once.
            gw.fjord.push("traffic", row(1000.0, "slow", 20.0))
            gw.fjord.push("traffic", row(1001.0, "fast", 65.0))
            gw.fjord.push("traffic", row(1002.0, "other", 90.0, segment="S2"))
            await _settle(gw)
            batch = await asyncio.wait_for(sub.next_batch(), 5)
            assert batch is not None
            assert [dict(r) for r in batch.rows] == [
                {"station": "slow", "other": "fast", "faster_by": 45.0}
            ]
            d = json.loads((await call(http, base, "GET", f"/queries/{qid}")).data)
            assert d["state"] == "running" and d["columns"] == ["station", "other", "faster_by"]
            join = d["operators"][0]
            assert join["held"] == {"left": 3, "right": 3} and join["fill_threshold"] > 0
            async with http.get(f"{base}/metrics") as m:
                text = await m.text()
            assert f'fjords_join_held_tuples{{query="{qid}"}} 6.0' in text
            assert f'fjords_join_fill_threshold{{query="{qid}"}}' in text
            # the rule is enforced where the user typed it
            wrong = JOIN.replace("b [RANGE 5 MINUTES]", "b [RANGE 10 MINUTES]")
            bad = await call(http, base, "POST", "/queries", {"sql": wrong})
            assert bad.status_code == 400
            err = json.loads(bad.data)
            assert "the windows differ" in err["error"]
            assert (err["line"], err["column"]) == (1, wrong.index("RANGE 10") + 1)
            gone = await call(http, base, "DELETE", f"/queries/{qid}")
            assert gone.status_code in (200, 204)
        assert query_routes(gw) == 0
