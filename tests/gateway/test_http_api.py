"""The HTTP API against a live aiohttp server with a real Fjord behind it."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from gateway.config import Config
from gateway.daemon import Gateway

Q1 = "SELECT segment, AVG(speed) AS avg_speed FROM traffic [RANGE 1 MINUTE] GROUP BY segment"


def row(t: float, station: str = "st1", speed: float = 50.0, segment: str = "S1") -> tuple:
    return (t, station, speed, 34.0, -118.0, segment)


@pytest.fixture
async def gateway(tmp_path):
    cfg = Config()
    cfg.state_dir = str(tmp_path / "state")
    cfg.http.port = 0
    cfg.http.max_body_bytes = 4096
    cfg.http.client_buffer_rows = 5
    gw = Gateway(cfg)
    async with gw:
        host, port = await gw.start_http()
        gw.base = f"http://{host}:{port}"  # type: ignore[attr-defined]
        yield gw


async def test_register_list_get_delete(gateway: Gateway) -> None:
    async with aiohttp.ClientSession(gateway.base) as http:  # type: ignore[attr-defined]
        r = await http.post("/queries", json={"sql": Q1})
        assert r.status == 201
        body = await r.json()
        qid = body["id"]
        assert body["columns"] == ["segment", "avg_speed", "window_start", "window_end"]
        assert body["operators"]
        r = await http.get("/queries")
        assert [q["id"] for q in (await r.json())["queries"]] == [qid]
        assert (await http.get(f"/queries/{qid}")).status == 200
        assert (await http.delete(f"/queries/{qid}")).status == 204
        r = await http.get(f"/queries/{qid}")
        assert r.status == 404 and "no query" in (await r.json())["error"]
        assert (await http.delete(f"/queries/{qid}")).status == 404


async def test_bad_input_gets_clear_errors(gateway: Gateway) -> None:
    async with aiohttp.ClientSession(gateway.base) as http:  # type: ignore[attr-defined]
        r = await http.post(
            "/queries", data=b"{not json", headers={"Content-Type": "application/json"}
        )
        assert r.status == 400 and "malformed JSON" in (await r.json())["error"]
        r = await http.post("/queries", json=["a list"])
        assert r.status == 400
        r = await http.post("/queries", json={"sql": "SELECT *\nFROM traffic WHERE"})
        body = await r.json()
        assert r.status == 400 and body["line"] == 2 and body["expected"]
        r = await http.post("/queries", json={"sql": "SELECT nope FROM traffic"})
        assert r.status == 400 and "unknown column" in (await r.json())["error"]
        r = await http.post(
            "/queries", json={"sql": "SELECT * FROM traffic", "padding": "x" * 10_000}
        )
        assert r.status == 413
        r = await http.get("/nowhere")
        assert r.status == 404
        assert (await http.get("/healthz")).status == 200  # still serving


async def test_results_stream_as_sse_and_ndjson(gateway: Gateway) -> None:
    async with aiohttp.ClientSession(gateway.base) as http:  # type: ignore[attr-defined]
        qid = (
            await (
                await http.post(
                    "/queries", json={"sql": "SELECT station, speed FROM traffic WHERE speed > 10"}
                )
            ).json()
        )["id"]
        sse = await http.get(f"/queries/{qid}/results")
        nd = await http.get(f"/queries/{qid}/results?format=ndjson")
        assert sse.headers["Content-Type"].startswith("text/event-stream")
        await asyncio.sleep(0.05)
        gateway.fjord.push("traffic", row(1, speed=5))
        gateway.fjord.push("traffic", row(2, speed=42))
        line = await asyncio.wait_for(_next_sse_data(sse), 5)
        assert line == {"station": "st1", "speed": 42.0}
        assert json.loads(await asyncio.wait_for(nd.content.readline(), 5)) == {
            "station": "st1",
            "speed": 42.0,
        }
        sse.close()
        nd.close()


async def _next_sse_data(resp: aiohttp.ClientResponse) -> dict:
    while True:
        line = (await resp.content.readline()).decode().strip()
        if line.startswith("data: "):
            return json.loads(line[6:])


async def test_websocket_and_slow_client_is_told_what_it_missed(gateway: Gateway) -> None:
    async with aiohttp.ClientSession(gateway.base) as http:  # type: ignore[attr-defined]
        qid = (
            await (await http.post("/queries", json={"sql": "SELECT time FROM traffic"})).json()
        )["id"]
        ws = await http.ws_connect(f"/queries/{qid}/ws")
        await asyncio.sleep(0.05)
        sub = next(iter(gateway.hub._subs[qid]))
        # Publish faster than anyone reads: the buffer (5 rows) keeps the newest.
        for t in range(20):
            gateway.hub.publish(qid, [{"time": t}])
        assert sub.pending() == 5
        first = json.loads((await asyncio.wait_for(ws.receive(), 5)).data)
        assert first == {"missed": 15}
        got = [json.loads((await asyncio.wait_for(ws.receive(), 5)).data)["time"] for _ in range(5)]
        assert got == [15, 16, 17, 18, 19]
        await ws.close()


async def test_token_protects_every_endpoint_but_healthz(tmp_path) -> None:
    cfg = Config()
    cfg.http.port = 0
    cfg.http.token = "s3cret"
    cfg.http.read_token = "reader"
    async with Gateway(cfg) as gw:
        host, port = await gw.start_http()
        async with aiohttp.ClientSession(f"http://{host}:{port}") as http:
            assert (
                await http.post("/queries", json={"sql": "SELECT * FROM traffic"})
            ).status == 401
            ok = await http.post(
                "/queries",
                json={"sql": "SELECT * FROM traffic"},
                headers={"Authorization": "Bearer s3cret"},
            )
            assert ok.status == 201
            r = await http.get("/queries")
            assert r.status == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
            assert (
                await http.get("/queries", headers={"Authorization": "Basic s3cret"})
            ).status == 401
            assert (
                await http.get("/queries", headers={"Authorization": "Bearer reader"})
            ).status == 200
            assert (await http.get("/healthz")).status == 200


async def test_an_unexpected_error_is_a_json_500_without_internals(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(**_: object) -> list:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(gateway, "sensors_page", broken)
    async with aiohttp.ClientSession(gateway.base) as http:  # type: ignore[attr-defined]
        r = await http.get("/sensors")
        assert r.status == 500
        body = await r.json()
        assert "secret" not in body["error"] and "Traceback" not in body["error"]
    assert "secret internals" in caplog.text  # the operator sees it in the log


async def test_cors_preflight_and_same_origin(tmp_path) -> None:
    cfg = Config()
    cfg.http.port = 0
    cfg.http.allowed_origins = ["https://dash.example/"]
    async with Gateway(cfg) as gw:
        host, port = await gw.start_http()
        base = f"http://{host}:{port}"
        async with aiohttp.ClientSession(base) as http:
            same = await http.get("/queries", headers={"Origin": base})
            assert same.status == 200 and "Access-Control-Allow-Origin" not in same.headers
            pre = await http.options(
                "/queries",
                headers={
                    "Origin": "https://dash.example",
                    "Access-Control-Request-Method": "POST",
                },
            )
            assert (
                pre.status == 204 and "Content-Type" in pre.headers["Access-Control-Allow-Headers"]
            )
            evil = await http.options("/queries", headers={"Origin": "https://evil.example"})
            assert evil.status == 403
            assert (await http.get("/queries", headers={"Origin": "null"})).status == 403
            # DNS rebinding: a page on evil.example re-pointed at this tokenless gateway.
            rebound = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
            assert (await http.get("/queries", headers=rebound)).status == 403
            assert (await http.get("/queries", headers={"Host": "evil.example"})).status == 200


async def test_dry_run_installs_nothing(gateway: Gateway) -> None:
    async with aiohttp.ClientSession(gateway.base) as http:  # type: ignore[attr-defined]
        r = await http.post("/queries", json={"sql": Q1, "dry_run": True})
        assert r.status == 200
        body = await r.json()
        assert body["operators"] and body["shape"] == "windowed aggregate"
        assert gateway.fjord.queries == {}


async def test_metrics_tables_sensors_health(gateway: Gateway) -> None:
    async with aiohttp.ClientSession(gateway.base) as http:  # type: ignore[attr-defined]
        await http.post("/queries", json={"sql": "SELECT * FROM traffic"})
        gateway.fjord.push("traffic", row(1))
        await asyncio.sleep(0.05)
        text = await (await http.get("/metrics")).text()
        assert 'fjords_stream_tuples_in_total{stream="traffic"} 1.0' in text
        assert "fjords_queries 1.0" in text
        assert (await (await http.get("/tables")).json()) == {"tables": []}
        assert (await (await http.get("/sensors")).json()) == {
            "sensors": [],
            "total": 0,
            "limit": 500,
            "offset": 0,
            "next": None,
        }
        assert (await http.get("/sensors/nope")).status == 404


async def test_queries_survive_a_restart(tmp_path) -> None:
    cfg = Config()
    cfg.state_dir = str(tmp_path)
    async with Gateway(cfg) as gw:
        qid = gw.add_query(Q1).id
    async with Gateway(cfg) as gw2:
        assert list(gw2.fjord.queries) == [qid]
        gw2.remove_query(qid)
    async with Gateway(cfg) as gw3:
        assert gw3.fjord.queries == {}


async def test_a_client_that_never_reads_does_not_slow_others(gateway: Gateway) -> None:
    async with aiohttp.ClientSession(gateway.base) as http:  # type: ignore[attr-defined]
        qid = (
            await (
                await http.post("/queries", json={"sql": "SELECT time, station FROM traffic"})
            ).json()
        )["id"]
        # A raw socket that subscribes and then never reads a byte.
        host, port = gateway.address  # type: ignore[misc]
        _reader, writer = await asyncio.open_connection(host, port)
        writer.write(
            f"GET /queries/{qid}/results?format=ndjson HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        )
        await writer.drain()
        good = await http.get(f"/queries/{qid}/results?format=ndjson&buffer=100000")
        await asyncio.sleep(0.1)
        n = 5_000
        for i in range(n):
            gateway.fjord.push("traffic", (float(i), "s" * 200, 1.0, 0.0, 0.0, "S"))
            if i % 1000 == 0:
                await asyncio.sleep(0)
        got = 0
        while got < n:
            line = await asyncio.wait_for(good.content.readline(), 10)
            if b'"time"' in line:
                got += 1
        assert got == n  # the reading client got every row
        stuck = [s for s in gateway.hub._subs[qid] if s.missed_total]
        assert stuck and stuck[0].missed_total > 0  # the stuck one lost its oldest rows, counted
        assert gateway.fjord.streams["traffic"].queue.drops == 0  # and the Fjord never waited
        writer.close()
        good.close()
