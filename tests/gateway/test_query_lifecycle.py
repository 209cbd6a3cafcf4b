"""The daemon's query lifecycle: plan, save, then install; a query that
fails is listed as failed with its error (HTTP, result streams, /metrics) and restored as failed;
a saved query that no longer plans is loaded as failed, never a crash."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import aiohttp
import pytest

from fjords.errors import QueryError
from fjords.limits import Limits
from gateway.config import Config
from gateway.daemon import Gateway
from gateway.store import QueryStore
from tests.gateway.test_openapi import call
from tests.support import Broker, query_routes

# Plans, then fails at run time: its second group is over the (lowered) limit.
BAD = "SELECT station, COUNT(*) AS n FROM traffic [RANGE 1 MINUTES] GROUP BY station"
LIMITS = Limits(max_groups_per_window=1)
GOOD = "SELECT station, speed FROM traffic WHERE speed > 0"


def row(t: float, station: str = "st1", speed: float = 50.0, segment: str = "S1") -> tuple:
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


async def test_a_query_that_cannot_be_saved_is_not_installed(tmp_path, monkeypatch) -> None:
    async with Gateway(_config(tmp_path)) as gw:

        def broken_save(*args: object) -> None:
            raise sqlite3.OperationalError("disk I/O error")

        monkeypatch.setattr(gw.store, "save", broken_save)
        with pytest.raises(QueryError, match="could not be saved"):
            await gw.register(GOOD)
        assert not gw.fjord.queries and not gw.query_ids()
        assert query_routes(gw) == 0


async def test_a_lone_surrogate_is_a_400_and_nothing_is_installed_or_saved(tmp_path) -> None:
    async with Gateway(_config(tmp_path)) as gw:
        host, port = await gw.start_http()
        async with aiohttp.ClientSession() as http:
            r = await http.post(
                f"http://{host}:{port}/queries",
                data=b'{"sql": "SELECT speed AS \\"\\ud800\\" FROM traffic"}',
                headers={"Content-Type": "application/json"},
            )
            body = await r.json()
        assert r.status == 400 and "UTF-8" in body["error"], body
        assert not gw.query_ids() and gw.store.load() == []


async def test_a_failing_query_is_reported_and_comes_back_failed(tmp_path) -> None:
    cfg = _config(tmp_path)
    async with Gateway(cfg, limits=LIMITS) as gw:
        host, port = await gw.start_http()
        base = f"http://{host}:{port}"
        good = await gw.register(GOOD)
        bad = await gw.register(BAD)
        early = gw.hub.subscribe(bad)  # a client already reading when it fails
        gw.fjord.push("traffic", row(1000.0))
        gw.fjord.push("traffic", row(1001.0, station="st2"))
        await _settle(gw)
        assert gw.fjord.failed[bad].error.startswith("window_aggregate: LimitExceeded")
        assert await early.next_batch() is None and "max_groups" in (early.error or "")
        async with aiohttp.ClientSession() as http:
            listed = await call(http, base, "GET", f"/queries/{bad}")  # validated against the spec
            d = json.loads(listed.data)
            assert d["state"] == "failed" and "max_groups" in d["error"] and d["sql"] == BAD
            assert (
                json.loads((await call(http, base, "GET", f"/queries/{good}")).data)["state"]
                == "running"
            )
            await call(http, base, "GET", "/queries")
            async with http.get(f"{base}/queries/{bad}/results?format=ndjson") as r:
                lines = [json.loads(x) for x in (await r.read()).splitlines() if x.strip()]
            assert lines == [{"error": d["error"]}]
            async with http.get(f"{base}/queries/{bad}/results") as r:
                text = (await r.read()).decode()
            assert "event: error" in text and "event: end" in text
            async with http.ws_connect(f"{base}/queries/{bad}/ws") as ws:
                assert (await ws.receive_json(timeout=5)) == {"error": d["error"]}
            async with http.get(f"{base}/metrics") as r:
                assert "fjords_query_failures_total 1.0" in await r.text()
        assert gw.fjord.queries[good].sink.rows == 2  # the other query got the samples
    # Restarted: the failed query is listed as failed (not run again), the good one runs.
    async with Gateway(cfg) as gw:
        assert gw.describe_query(bad)["state"] == "failed"
        assert "max_groups" in gw.describe_query(bad)["error"]
        assert good in gw.fjord.queries and bad not in gw.fjord.queries
        gw.remove_query(bad)
        assert not gw.has_query(bad) and [q[0] for q in gw.store.load()] == [good]


async def test_a_saved_query_that_no_longer_plans_is_loaded_as_failed(tmp_path) -> None:
    cfg = _config(tmp_path)
    store = QueryStore(cfg.state_dir)
    store.save("old", "SELECT speed + station AS x FROM traffic", {"publish": "mqtt"})
    store.close()
    cfg.queries = [{"sql": "SELECT -segment AS y FROM traffic", "id": "configured"}]
    async with Gateway(cfg) as gw:
        old = gw.describe_query("old")
        assert old["state"] == "failed" and "speed + station" in old["error"]
        assert old["options"] == {"publish": "mqtt"}
        assert gw.describe_query("configured")["state"] == "failed"
        assert set(gw.query_ids()) == {"old", "configured"} and not gw.fjord.queries
        sub = gw.hub.subscribe("old")
        assert sub.closed and "speed + station" in (sub.error or "")


async def test_long_texts_are_parsed_off_the_loop_and_limited(tmp_path) -> None:
    values = ",".join(f"'S{i:05d}'" for i in range(600))
    sql = f"SELECT * FROM traffic WHERE segment IN ({values})"
    assert len(sql) > 2048  # parsed in a worker thread
    async with Gateway(_config(tmp_path)) as gw:
        assert (await gw.explain_async(sql))["shape"] == "filter"
        qid = await gw.register(sql)
        assert gw.describe_query(qid)["sql"] == sql and gw.store.load()[0][1] == sql
        with pytest.raises(QueryError, match="max_sql_chars"):
            await gw.register(sql + " " * 20_000)
        too_many = ",".join(f"'S{i:05d}'" for i in range(1001))
        with pytest.raises(QueryError, match="max_in_list"):
            await gw.register(f"SELECT * FROM traffic WHERE segment IN ({too_many})")
        assert gw.query_ids() == [qid]


async def test_a_published_query_that_fails_says_why_on_its_mqtt_topic(broker: Broker) -> None:
    import aiomqtt

    from gateway.config import MqttConfig

    cfg = Config()
    cfg.mqtt = MqttConfig(url=f"mqtt://{broker.host}:{broker.port}")
    async with aiomqtt.Client(broker.host, broker.port, identifier="fail-watcher") as watcher:
        await watcher.subscribe("fjords/results/#", qos=1)
        async with Gateway(cfg, limits=LIMITS) as gw:
            rq = gw.add_query(BAD, {"publish": "mqtt"})
            await asyncio.sleep(0.5)  # the bridge is connected and follows the query
            gw.fjord.push("traffic", row(1000.0))
            gw.fjord.push("traffic", row(1001.0, station="st2"))

            async def first() -> aiomqtt.Message:
                async for msg in watcher.messages:
                    return msg
                raise AssertionError("no message")

            msg = await asyncio.wait_for(first(), 10)
            assert msg.topic.value == f"fjords/results/{rq.id}"
            assert "max_groups_per_window" in json.loads(msg.payload)["error"]
            assert rq.id not in gw.mqtt._subs  # no longer followed


UNION = (
    "SELECT time, station, speed FROM traffic WHERE speed < 20 "
    "UNION ALL SELECT time, segment, speed FROM traffic WHERE speed > 70 PRIORITY 200"
)


async def test_a_union_query_lives_like_any_other(tmp_path) -> None:
    """UNION ALL through the HTTP API: registered (201, plan and both branches' routes), listed,
    its rows in time order on its result stream, shown with its merge, refused with where
    (400), deleted (its routes leave the router), and restored after a restart."""
    cfg = _config(tmp_path)
    async with Gateway(cfg) as gw:
        host, port = await gw.start_http()
        base = f"http://{host}:{port}"
        async with aiohttp.ClientSession() as http:
            r = await call(
                http, base, "POST", "/queries", {"sql": UNION, "sinks": [{"type": "file"}]}
            )
            assert r.status_code == 201, r.data
            d = json.loads(r.data)
            qid = d["id"]
            assert d["columns"] == ["time", "station", "speed"] and d["priority"] == 200
            assert [s["stream"] for s in d["shared"]] == ["traffic", "traffic"]
            assert "zipper_merge" in [o["operator"] for o in d["operators"]]
            assert query_routes(gw) == 2
            got: list[dict] = []
            gw.fjord.queries[qid].on_row(got.append)
            for t, st, speed in [(1000, "st1", 10.0), (1000, "st2", 80.0), (1003, "st2", 90.0)]:
                gw.fjord.push("traffic", row(t, st, speed))
                await _settle(gw)
            gw.fjord.push("traffic", row(1002, "st1", 15.0))
            gw.fjord.push("traffic", row(1004, "st1", 50.0))  # both sensors past 1003
            await _settle(gw)
            assert [(r["time"], r["station"]) for r in got] == [
                (1000, "st1"),
                (1000, "S1"),
                (1002, "st1"),
                (1003, "S1"),
            ]
            listed = json.loads((await call(http, base, "GET", "/queries")).data)["queries"]
            assert [q["id"] for q in listed] == [qid] and listed[0]["rows"] == 4
            bad = await call(
                http,
                base,
                "POST",
                "/queries",
                {"sql": "SELECT station FROM traffic UNION ALL SELECT speed FROM traffic"},
            )
            body = json.loads(bad.data)
            assert bad.status_code == 400 and "branch 2" in body["error"] and body["column"] == 46
            assert (await call(http, base, "DELETE", f"/queries/{qid}")).status_code in (200, 204)
            assert not gw.query_ids() and query_routes(gw) == 0
            await call(http, base, "POST", "/queries", {"sql": UNION})
    async with Gateway(cfg) as gw:  # restored from the store
        (rq,) = gw.fjord.queries.values()
        assert rq.sql == UNION and rq.columns == ("time", "station", "speed")
        assert query_routes(gw) == 2
        assert {op.tickets for op in rq.operators} == {200}
