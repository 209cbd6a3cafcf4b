"""Rows leave the gateway as they are produced, and cost once per query, not per client.

- The result hub encodes a query's rows to JSON once for all its HTTP clients (SSE, NDJSON),
  against a live daemon; WebSocket clients and sinks still get dicts.
- `ResultHub.publisher` (the daemon's per-query batch callback) is `publish_tuples`.
- A burst is routed in slices (`RunLoop.router_slice_rows`) and the scheduler yields when rows
  wait for clients: a client has the burst's first rows before its last samples are routed.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from gateway.config import Config
from gateway.daemon import Gateway
from gateway.results import ResultHub, encode_row
from gateway.run_loop import RunLoop
from tests.support import async_eventually


def row(t: float, station: str = "st1", speed: float = 50.0, segment: str = "S1") -> tuple:
    return (t, station, speed, 34.0, -118.0, segment)


@pytest.fixture
async def gateway(tmp_path):
    cfg = Config()
    cfg.state_dir = str(tmp_path / "state")
    cfg.http.port = 0
    gw = Gateway(cfg)
    async with gw:
        host, port = await gw.start_http()
        gw.base = f"http://{host}:{port}"  # type: ignore[attr-defined]
        yield gw


async def _data_lines(resp: aiohttp.ClientResponse, n: int) -> list[str]:
    out = []
    while len(out) < n:
        line = (await resp.content.readline()).decode().strip()
        if line.startswith("data: "):
            out.append(line[6:])
        elif line.startswith("{"):
            out.append(line)
    return out


async def test_http_clients_of_one_query_share_one_encoding(gateway: Gateway) -> None:
    async with aiohttp.ClientSession(gateway.base) as http:  # type: ignore[attr-defined]
        sql = "SELECT time, station, speed FROM traffic WHERE speed > 10"
        qid = (await (await http.post("/queries", json={"sql": sql})).json())["id"]
        streams = [await http.get(f"/queries/{qid}/results") for _ in range(3)]
        streams.append(await http.get(f"/queries/{qid}/results?format=ndjson"))
        ws = await http.ws_connect(f"/queries/{qid}/ws")
        await async_eventually(
            lambda: gateway.hub.subscribers(qid), lambda n: n == 5, interval=0.02
        )
        assert gateway.hub.subscribers(qid) == 5
        for t in range(1, 6):
            gateway.fjord.push("traffic", row(float(t), speed=20.0 + t))
        want = [{"time": float(t), "station": "st1", "speed": 20.0 + t} for t in range(1, 6)]
        for resp in streams:
            got = await asyncio.wait_for(_data_lines(resp, 5), 10)
            assert [json.loads(x) for x in got] == want
            assert got == [encode_row(r) for r in want]  # the text every client gets
        got_ws = [json.loads(await asyncio.wait_for(ws.receive_str(), 10)) for _ in range(5)]
        assert got_ws == want
        # Four HTTP clients, one encoding per row.
        assert gateway.hub.encoded_rows == 5
        for resp in streams:
            resp.close()
        await ws.close()


def test_publisher_is_publish_tuples() -> None:
    cols = ["time", "station", "speed"]
    rows = [(1.0, "a", 3.0), (2.0, "b", 4.0)]
    old, new = ResultHub(ring_rows=10), ResultHub(ring_rows=10)
    subs = [old.subscribe("q"), new.subscribe("q"), new.subscribe("q", encoded=True)]
    publish = new.publisher("q", cols)
    for _ in range(2):
        old.publish_tuples("q", cols, rows)
        publish(rows)
    assert old.published == new.published == {"q": 4}
    assert list(old.rings["q"].rows) == list(new.rings["q"].rows) == rows * 2
    assert old.rings["q"].next_id == new.rings["q"].next_id == 5
    a, b, c = (s.drain() for s in subs)
    assert a.rows == b.rows == [dict(zip(cols, r, strict=True)) for r in rows * 2]
    assert c.rows == [encode_row(r) for r in b.rows]
    assert a.first_id == b.first_id == c.first_id == 1


def test_nothing_is_made_for_a_query_nobody_follows() -> None:
    hub = ResultHub(ring_rows=10)
    publish = hub.publisher("q", ["x"])
    publish([(1,), (2,)])
    assert list(hub.rings["q"].rows) == [(1,), (2,)]  # the ring keeps the tuples as they are
    assert hub.encoded_rows == 0
    assert not hub.flush_due()  # no client waits: the scheduler need not yield


def test_flush_due_after_rows_were_offered() -> None:
    hub = ResultHub()
    sub = hub.subscribe("q", encoded=True)
    hub.publisher("q", ["x"])([(1,)])
    assert hub.flush_due()
    assert not hub.flush_due()  # reset by reading
    assert sub.drain().rows == ['{"x": 1}']


def test_an_encoded_replay_gets_the_same_text() -> None:
    hub = ResultHub(ring_rows=10)
    hub.publisher("q", ["x", "y"])([(1, "a"), (2, "b")])
    sub = hub.subscribe("q", since_id=0, encoded=True)
    batch = sub.drain()
    assert batch.rows == ['{"x": 1, "y": "a"}', '{"x": 2, "y": "b"}']
    assert batch.first_id == 1


async def test_a_bursts_first_rows_reach_a_client_before_its_last_samples_are_routed() -> None:
    """207 motes sharing a timestamp arrive as one burst; routed whole, a row would wait for
    the burst's last sample. Sliced, with the scheduler yielding when rows wait for clients,
    a subscriber (as an SSE writer is) has rows while the rest of the burst is still queued."""
    cfg = Config()
    cfg.http.port = 0
    gw = Gateway(cfg, run_loop=RunLoop(router_slice_rows=4))
    async with gw:
        qid = gw.add_query("SELECT time, station, speed FROM traffic WHERE speed > 10").id
        sub = gw.hub.subscribe(qid, encoded=True)
        router = gw.fjord.streams["traffic"].router
        routed_when_received: list[int] = []

        async def client() -> None:
            got = 0
            while got < 40:
                batch = await sub.next_batch()
                assert batch is not None
                routed_when_received.append(router.tuples_in)
                got += len(batch.rows)

        reader = asyncio.create_task(client())
        await asyncio.sleep(0)
        for i in range(40):  # one burst: pushed in one event-loop turn
            gw.fjord.push("traffic", row(100.0, station=f"s{i}", speed=50.0))
        await asyncio.wait_for(reader, 10)
        assert routed_when_received[0] < 40, routed_when_received
        assert len(routed_when_received) > 1


async def test_a_router_behind_takes_a_quarter_of_its_backlog_per_transition() -> None:
    """Sliced at 4 samples, a backlog of 400 would take 100 router transitions (one per
    event-loop turn when the loop is shared); behind, a router takes a quarter of what waits."""
    cfg = Config()
    cfg.http.port = 0
    gw = Gateway(cfg, run_loop=RunLoop(router_slice_rows=4))
    gw.add_query("SELECT time, station, speed FROM traffic WHERE speed > 10")
    for i in range(400):  # queued before the scheduler starts
        gw.fjord.push("traffic", row(100.0 + i // 100, station=f"s{i % 100}", speed=50.0))
    async with gw:
        router = gw.fjord.streams["traffic"].router
        for _ in range(1000):
            if router.tuples_in == 400:
                break
            await asyncio.sleep(0)
        assert router.tuples_in == 400
        assert router.transitions < 40, router.transitions


def test_encoded_rows_of_any_value_are_the_dicts_json() -> None:
    """The publisher encodes the Fjord's tuples at once (fjords.output.json_objects); a value
    it does not know (here a date, a list) goes through encode_row: the same text either way."""
    import datetime

    hub = ResultHub(ring_rows=10)
    cols = ["time", "station", "speed"]
    texts, dicts = hub.subscribe("q", encoded=True), hub.subscribe("q")
    publish = hub.publisher("q", cols)
    batches = [
        [(1, "st1", 2.5), (2, 'q"uote', float("nan")), (3, "é", -0.0)],
        [(4, datetime.date(2026, 11, 24), [1, 2]), (5, None, True)],
    ]
    for rows in batches:
        publish(rows)
    want = [dict(zip(cols, r, strict=True)) for rows in batches for r in rows]
    assert texts.drain().rows == [encode_row(d) for d in want]
    got = dicts.drain().rows
    assert len(got) == len(want) and got[0] == want[0] and got[3] == want[3]
    assert hub.encoded_rows == 5
