"""Result sinks per query (webhook, files, MQTT retained per group) and the replay ring for HTTP
clients that reconnect (?since=, Last-Event-ID), against the in-process gateway and its HTTP API
(MQTT against a real Mosquitto)."""

from __future__ import annotations

import asyncio
import functools
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import aiomqtt
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from fjords.errors import QueryError
from gateway.config import Config, MqttConfig
from gateway.daemon import Gateway
from gateway.drops import drop_counts
from gateway.sinks.ring import MARK_SECONDS, ReplayRing
from gateway.sinks.spec import FileSinkSpec, SinkSettings, WebhookSinkSpec, check, resolve_under
from tests.support import Broker, async_eventually

FILTER = "SELECT station, speed, segment FROM traffic"
GROUPED = (
    "SELECT segment, AVG(speed) AS avg_speed, COUNT(*) AS n FROM traffic [RANGE 5 MINUTES] "
    "GROUP BY segment"
)


def _row(t: float, speed: float, segment: str = "S1", station: str = "st1") -> tuple:
    return (t, station, speed, 34.0, -118.0, segment)


#: the receivers here listen on loopback, which the address policy refuses unless allowed
LOCAL_HOOKS = ("127.0.0.1",)


def _config(tmp_path: Path, **kw: Any) -> Config:
    cfg = Config()
    cfg.http.port = 0
    cfg.simulation = None
    cfg.state_dir = str(tmp_path / "state")
    cfg.sinks.webhook_hosts = list(LOCAL_HOOKS)
    for k, v in kw.items():
        setattr(cfg, k, v)
    return cfg


# Liveness bounds only: in-process work, polled every 10 ms (generous; never a timing assertion).
_until = functools.partial(async_eventually, timeout=20, interval=0.01)


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[Gateway]:
    settings = SinkSettings(
        webhook_backoff_initial_s=0.01, webhook_backoff_max_s=0.05, webhook_hosts=[*LOCAL_HOOKS]
    )
    async with Gateway(_config(tmp_path), sinks=settings) as g:
        host, port = await g.start_http()
        g.base = f"http://{host}:{port}"  # type: ignore[attr-defined]
        yield g


# -- the body: types and checks ---------------------------------------------------------------


def test_specs_are_checked(tmp_path: Path) -> None:
    settings = SinkSettings(dir=str(tmp_path))
    check([FileSinkSpec(path="a/b")], settings, have_mqtt=False)
    for bad in ("../x", "/etc", "a/../../x", "~root", "a\\b", ""):
        with pytest.raises(QueryError, match="path"):
            check([FileSinkSpec(path=bad)], settings, have_mqtt=False)
    with pytest.raises(QueryError, match="http"):
        check([WebhookSinkSpec(url="file:///etc/passwd")], settings, have_mqtt=False)
    with pytest.raises(QueryError, match="same sink twice"):
        check([FileSinkSpec(), FileSinkSpec()], settings, have_mqtt=False)
    with pytest.raises(QueryError, match="sinks directory"):
        check([FileSinkSpec()], SinkSettings(), have_mqtt=False)
    hosts = SinkSettings(webhook_hosts=["hooks.example.com", "*.LAN", "10.0.0.*"])
    for ok in (
        "https://hooks.example.com/x",
        "http://HOOKS.example.com./x",
        "http://a.b.lan:81/",
        "http://10.0.0.7/",
    ):
        check([WebhookSinkSpec(url=ok)], hosts, have_mqtt=False)
    for bad in (
        "http://169.254.169.254/latest",
        "http://evil.example.com/",
        "http://10.0.1.7/",
        "http://lan/",
    ):
        with pytest.raises(QueryError, match="webhook_hosts"):
            check([WebhookSinkSpec(url=bad)], hosts, have_mqtt=False)
    (tmp_path / "escape").symlink_to("/tmp")
    with pytest.raises(QueryError, match="outside"):
        resolve_under(tmp_path, "escape/x")
    assert resolve_under(tmp_path, "ok/x") == tmp_path.resolve() / "ok" / "x"


async def test_bad_sinks_are_400_and_install_nothing(gw: Gateway) -> None:
    base = gw.base  # type: ignore[attr-defined]
    bad = [
        [{"type": "ftp"}],
        [{"type": "file", "path": "../../etc"}],
        [{"type": "file", "path": "/abs"}],
        [{"type": "webhook"}],
        [{"type": "webhook", "url": "gopher://x"}],
        [{"type": "webhook", "url": "http://x", "batch_rows": 0}],
        [{"type": "mqtt"}],  # no [mqtt] configured
        [{"type": "file", "colour": "red"}],
        {"type": "file"},
    ]
    async with aiohttp.ClientSession(base) as http:
        for sinks in bad:
            r = await http.post("/queries", json={"sql": FILTER, "sinks": sinks})
            assert r.status == 400, (sinks, await r.text())
            assert "sinks" in (await r.json())["error"]
        assert gw.query_ids() == []


# -- replay on connect -------------------------------------------------------------------------


def test_ring_numbers_rows_and_says_what_is_gone() -> None:
    now = [100.0]
    ring = ReplayRing(3, first_id=10, clock=lambda: now[0])
    ring.columns = ["x"]
    assert ring.extend([(1,), (2,)]) == 10
    now[0] = 200.0
    assert ring.extend([(3,), (4,)]) == 12  # row 10 (x=1) is gone
    r = ring.since_id(10)
    assert (r.first_id, r.rows, r.gone) == (11, [{"x": 2}, {"x": 3}, {"x": 4}], None)
    r = ring.since_id(8)  # rows 9 (before this run) and 10 were asked for
    assert r.first_id == 11 and r.gone is not None and r.gone["rows"] is None
    r = ring.since_id(9)
    assert r.gone == {"since": 9, "first_id": 11, "rows": 1, "reason": "no longer kept"}
    assert ring.since_id(13).rows == [] and ring.since_id(13).gone is None
    r = ring.since_id(99)  # an id this run never gave
    assert r.first_id == 11 and r.gone is not None and r.gone["reason"] == "unknown row id"
    r = ring.since_time(150.0)
    assert r.rows == [{"x": 3}, {"x": 4}] and r.gone is None
    r = ring.since_time(50.0)  # row 10 was published at 100 and is gone
    assert r.first_id == 11 and r.gone is not None


@settings(max_examples=300, deadline=None)
@given(
    size=st.integers(1, 12),
    batches=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 40)), max_size=30),
    asked=st.integers(-10, 1300),
)
def test_a_replay_since_a_time_never_skips_a_kept_row_and_says_when_one_is_gone(
    size: int, batches: list[tuple[int, int]], asked: int
) -> None:
    """Publish times are kept coarsely (one mark per MARK_SECONDS): a replay may repeat rows
    published shortly before the time asked for, never skip one published after it, and says
    rows are gone whenever one published after it is no longer kept."""
    now = [0.0]
    ring = ReplayRing(size, clock=lambda: now[0])
    ring.columns = ["i"]
    published: list[float] = []  # the time of each row, by id - 1
    step = MARK_SECONDS / 4
    for n, gap in batches:
        now[0] += gap * step
        ring.extend([(len(published) + k,) for k in range(n)])
        published += [now[0]] * n
        assert len(ring._marks) <= size + 1  # bounded by the rows kept, not by the batches
    t = asked * step / 2
    r = ring.since_time(t)
    got = [row["i"] for row in r.rows]
    kept = range(ring.oldest_id - 1, len(published))
    assert got == list(range(r.first_id - 1, len(published)))  # from first_id to the newest
    after = [i for i in kept if published[i] > t]
    assert set(after) <= set(got)  # nothing published after t is skipped
    assert all(published[i] > t - MARK_SECONDS for i in got)  # repeats only from just before
    lost = [i for i in range(ring.oldest_id - 1) if published[i] > t]
    if lost:
        assert r.gone is not None and r.gone["reason"] == "no longer kept"
    assert ring.published == len(published)


def test_ring_ids_continue_after_a_restart(tmp_path: Path) -> None:
    from gateway.store import QueryStore

    store = QueryStore(tmp_path)
    store.save("q", "SELECT 1", {})
    assert store.first_row_id("q") == 1
    ring = ReplayRing(5, store.first_row_id("q"), lease=lambda n: store.lease_row_ids("q", n))
    ring.extend([1, 2, 3])
    store.close()
    store = QueryStore(tmp_path)
    assert store.first_row_id("q") > 3  # ids 1-3 are never given again


async def _sse_events(resp: aiohttp.ClientResponse, n: int) -> list[dict[str, str]]:
    """The next `n` SSE events with data (comments skipped), as {field: value}."""
    events: list[dict[str, str]] = []
    current: dict[str, str] = {}
    async with asyncio.timeout(20):
        async for raw in resp.content:
            line = raw.decode().rstrip("\n")
            if not line:
                if "data" in current:
                    events.append(current)
                    if len(events) >= n:
                        return events
                current = {}
            elif not line.startswith(":"):
                key, _, value = line.partition(": ")
                current[key] = value
    return events


async def test_sse_reconnect_gets_what_it_missed_and_is_told_what_is_gone(
    tmp_path: Path,
) -> None:
    cfg = _config(tmp_path)
    async with Gateway(cfg) as gw:
        gw.hub.ring_rows = 5
        host, port = await gw.start_http()
        rq = gw.add_query(FILTER)
        async with aiohttp.ClientSession(f"http://{host}:{port}") as http:
            url = f"/queries/{rq.id}/results"
            async with http.get(url) as first:
                await first.content.readline()  # ": connected": subscribed
                for i in range(3):
                    gw.fjord.push("traffic", _row(float(i), 40.0 + i))
                got = await _sse_events(first, 3)
            ids = [int(e["id"]) for e in got]
            assert ids == [ids[0], ids[0] + 1, ids[0] + 2]
            # Disconnected: 2 more rows; a reconnect with Last-Event-ID gets exactly those.
            for i in range(3, 5):
                gw.fjord.push("traffic", _row(float(i), 40.0 + i))
            await _until(lambda: gw.hub.published.get(rq.id, 0) >= 5)
            async with http.get(url, headers={"Last-Event-ID": str(ids[-1])}) as again:
                replay = await _sse_events(again, 2)
            assert [json.loads(e["data"])["speed"] for e in replay] == [43.0, 44.0]
            assert [int(e["id"]) for e in replay] == [ids[-1] + 1, ids[-1] + 2]
            # 5 more: the ring (5 rows) no longer has row ids[0] + 1 ... : told, then the rest.
            for i in range(5, 10):
                gw.fjord.push("traffic", _row(float(i), 40.0 + i))
            await _until(lambda: gw.hub.published.get(rq.id, 0) >= 10)
            async with http.get(url, params={"since": str(ids[0])}) as late:
                events = await _sse_events(late, 6)
            assert events[0]["event"] == "gone"
            gone = json.loads(events[0]["data"])["gone"]
            assert gone["rows"] == 4 and gone["first_id"] == ids[0] + 5
            assert [json.loads(e["data"])["speed"] for e in events[1:]] == [
                45.0, 46.0, 47.0, 48.0, 49.0,
            ]  # fmt: skip
            # NDJSON with ids, and a time: everything published after it.
            async with http.get(
                url, params={"format": "ndjson", "ids": "true", "since": str(ids[0] + 7)}
            ) as nd:
                lines = [json.loads(await nd.content.readline()) for _ in range(2)]
            assert lines == [
                {"id": ids[0] + 8, "row": {"station": "st1", "speed": 48.0, "segment": "S1"}},
                {"id": ids[0] + 9, "row": {"station": "st1", "speed": 49.0, "segment": "S1"}},
            ]
            async with http.ws_connect(f"/queries/{rq.id}/ws?since={ids[0] + 8}&ids=1") as ws:
                msg = await asyncio.wait_for(ws.receive_json(), 20)
            assert msg == {
                "id": ids[0] + 9,
                "row": {"station": "st1", "speed": 49.0, "segment": "S1"},
            }
            r = await http.get(url, params={"since": "yesterday"})
            assert r.status == 400 and "since" in (await r.json())["error"]
            async with http.get(
                url, params={"since": "2000-01-01T00:00:00Z", "format": "ndjson"}
            ) as t:
                first_line = json.loads(await t.content.readline())
            assert "gone" in first_line  # rows published since 2000 are no longer all kept


# -- webhook -------------------------------------------------------------------------------------


class Receiver:
    """A local webhook: answers 503 to the first `fail` POSTs, then 200; `down` refuses all."""

    def __init__(self, fail: int = 0, status: int = 503) -> None:
        self.fail = fail
        self.status = status
        self.posts: list[dict[str, Any]] = []
        self.refused = 0
        self.hang = False
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.hang:
            await asyncio.sleep(3600)
        if self.refused < self.fail:
            self.refused += 1
            return web.Response(status=self.status)
        self.posts.append(body)
        return web.Response(status=204)

    async def __aenter__(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/hook", self.handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/hook"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    def rows(self) -> list[dict[str, Any]]:
        return [r for post in self.posts for r in post["rows"]]


async def test_webhook_retries_a_failing_receiver_until_it_recovers(gw: Gateway) -> None:
    base = gw.base  # type: ignore[attr-defined]
    async with Receiver(fail=3) as hook, aiohttp.ClientSession(base) as http:
        sink = {"type": "webhook", "url": hook.url, "batch_rows": 4, "batch_ms": 0}
        r = await http.post("/queries", json={"sql": FILTER, "sinks": [sink]})
        assert r.status == 201, await r.text()
        qid = (await r.json())["id"]
        for i in range(10):
            gw.fjord.push("traffic", _row(float(i), float(i)))
        await _until(lambda: len(hook.rows()) >= 10)
        assert [row["speed"] for row in hook.rows()] == [float(i) for i in range(10)]
        assert all(len(p["rows"]) <= 4 and p["query"] == qid for p in hook.posts)
        assert [p["batch"] for p in hook.posts] == sorted({p["batch"] for p in hook.posts})
        state = (await (await http.get(f"/queries/{qid}")).json())["sinks"][0]
        assert state["rows_sent"] == 10 and state["dropped"] == 0
        assert state["last_error"] == "HTTP 503" and hook.refused == 3


async def test_a_webhook_that_refuses_a_batch_drops_it_counted(gw: Gateway) -> None:
    async with Receiver(fail=1, status=400) as hook:
        rq = gw.add_query(FILTER, {"sinks": [{"type": "webhook", "url": hook.url, "batch_ms": 0}]})
        gw.fjord.push("traffic", _row(1.0, 1.0))
        await _until(lambda: drop_counts(gw).get(("sink_webhook", "rejected"), 0) == 1)
        gw.fjord.push("traffic", _row(2.0, 2.0))  # the next batch goes through
        await _until(lambda: len(hook.rows()) == 1)
        assert hook.rows()[0]["speed"] == 2.0 and hook.posts[0]["dropped"] == 1
        assert gw.sinks.describe(rq.id)[0]["last_error"] == "HTTP 400"


async def test_a_dead_webhook_drops_counted_and_blocks_nothing(tmp_path: Path, caplog) -> None:
    settings = SinkSettings(
        webhook_timeout_s=0.3, webhook_backoff_initial_s=0.01, webhook_hosts=[*LOCAL_HOOKS]
    )
    async with (
        Gateway(_config(tmp_path), sinks=settings) as gw,
        Receiver() as hook,
        aiohttp.ClientSession("http://{}:{}".format(*await gw.start_http())) as http,
    ):
        hook.hang = True  # accepts, never answers: each POST waits for the timeout
        sink = {"type": "webhook", "url": hook.url, "batch_rows": 10, "queue_rows": 20}
        qid = (await (await http.post("/queries", json={"sql": FILTER, "sinks": [sink]})).json())[
            "id"
        ]
        other = gw.add_query("SELECT speed FROM traffic")
        sub = gw.hub.subscribe(other.id)
        for i in range(500):
            gw.fjord.push("traffic", _row(float(i), float(i)))
        got: list[dict] = []
        while len(got) < 500:  # the other query's client gets every row meanwhile
            batch = await asyncio.wait_for(sub.next_batch(), 20)
            assert batch is not None
            got += batch.rows
        assert [r["speed"] for r in got] == [float(i) for i in range(500)]
        await _until(lambda: drop_counts(gw).get(("sink_webhook", "queue_full"), 0) >= 400)
        await _until(lambda: gw.sinks.describe(qid)[0]["last_error"] is not None)
        state = (await (await http.get(f"/queries/{qid}")).json())["sinks"][0]
        assert state["dropped_by_reason"]["queue_full"] >= 400 and state["rows_sent"] == 0
        # A timeout reads as any failed connection: last_error must not tell open ports apart.
        assert state["last_error"] == "connection failed"
        gw.drop_watch.check()
        assert "sink_webhook (queue_full)" in caplog.text  # logged the first time
        metrics = await (await http.get("/metrics")).text()
        assert 'fjords_dropped_total{reason="queue_full",stage="sink_webhook"}' in metrics
        health = await (await http.get("/healthz")).json()
        assert health["status"] == "degraded"
        assert any("sink_webhook" in r for r in health["reasons"])
        assert ("result_clients", "buffer_full") not in drop_counts(gw)  # not counted twice


# -- files ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["ndjson", "parquet"])
async def test_file_sink_rows_equal_what_sse_clients_got(gw: Gateway, fmt: str) -> None:
    base = gw.base  # type: ignore[attr-defined]
    async with aiohttp.ClientSession(base) as http:
        sink = {"type": "file", "format": fmt, "path": "out/q", "rotate_mb": 0.001, "batch_ms": 0}
        r = await http.post("/queries", json={"sql": FILTER, "sinks": [sink]})
        assert r.status == 201, await r.text()
        qid = (await r.json())["id"]
        async with http.get(f"/queries/{qid}/results") as sse:
            await sse.content.readline()
            for i in range(300):
                gw.fjord.push("traffic", _row(float(i), i / 3, f"S{i % 4}", f"st{i % 7}"))
                if i % 50 == 49:  # in batches, so that the files rotate between them
                    await _until(lambda i=i: gw.sinks.describe(qid)[0]["rows_sent"] > i)
            events = await _sse_events(sse, 300)
        seen = [json.loads(e["data"]) for e in events]
        state: dict = {}

        async def written() -> int:
            nonlocal state
            state = (await (await http.get(f"/queries/{qid}")).json())["sinks"][0]
            return state["rows_sent"]

        await _until(written, lambda n: n >= 300, interval=0.02)
    directory = Path(state["directory"])
    assert directory == (Path(gw.config.state_dir or "") / "sinks" / "out" / "q").resolve()
    await gw.__aexit__(None, None, None)  # closing finishes the current file
    files = sorted(p for p in directory.iterdir() if not p.name.startswith("."))
    assert len(files) > 1  # rotated by size
    assert all(p.name.startswith(qid) and p.suffix == f".{fmt}" for p in files)
    rows: list[dict] = []
    for p in files:
        if fmt == "ndjson":
            rows += [json.loads(line) for line in p.read_text().splitlines()]
        else:
            rows += pq.read_table(p).to_pylist()
    assert rows == seen
    assert not [p for p in directory.iterdir() if p.name.startswith(".")]  # no partial files


async def test_an_idle_file_rotates_on_time(gw: Gateway) -> None:
    sink = {"type": "file", "format": "parquet", "rotate_s": 0.2, "batch_ms": 0}
    rq = gw.add_query(FILTER, {"sinks": [sink]})
    gw.fjord.push("traffic", _row(1.0, 1.0))
    # No more rows: the Parquet file is finished (renamed into view) when its time is up.
    await _until(lambda: gw.sinks.describe(rq.id)[0]["files"])
    state = gw.sinks.describe(rq.id)[0]
    done = Path(state["directory"]) / state["files"][0]
    assert pq.read_table(done).to_pylist() == [{"station": "st1", "speed": 1.0, "segment": "S1"}]
    assert state["current_file"] is None


async def test_deleting_the_query_finishes_its_files(gw: Gateway) -> None:
    sink = {"type": "file", "format": "parquet", "path": "gone", "batch_ms": 0}
    rq = gw.add_query(FILTER, {"sinks": [sink]})
    directory = Path(gw.sinks.describe(rq.id)[0]["directory"])
    for i in range(3):
        gw.fjord.push("traffic", _row(float(i), float(i)))
    await _until(lambda: gw.hub.published.get(rq.id, 0) >= 3)
    gw.remove_query(rq.id)  # what was published is still written, then the file is finished
    await _until(lambda: not gw.sinks._retiring)
    files = list(directory.iterdir())
    assert [p.suffix for p in files] == [".parquet"]
    assert [r["speed"] for r in pq.read_table(files[0]).to_pylist()] == [0.0, 1.0, 2.0]


async def test_file_sink_refuses_a_symlink_out_of_the_sinks_directory(gw: Gateway) -> None:
    root = Path(gw.sinks.settings.dir or "")
    root.mkdir(parents=True, exist_ok=True)
    os.symlink("/tmp", root / "elsewhere")
    async with aiohttp.ClientSession(gw.base) as http:  # type: ignore[attr-defined]
        sink = {"type": "file", "path": "elsewhere/q"}
        r = await http.post("/queries", json={"sql": FILTER, "sinks": [sink]})
        assert r.status == 400 and "outside" in (await r.json())["error"]


# -- persisted with the query --------------------------------------------------------------------


async def test_sinks_and_row_ids_survive_a_restart(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    sinks = [{"type": "file", "path": "kept"}, {"type": "webhook", "url": "http://127.0.0.1:9/"}]
    async with Gateway(cfg) as gw:
        qid = await gw.register(FILTER, {"sinks": sinks})
        gw.fjord.push("traffic", _row(1.0, 1.0))
        await _until(lambda: gw.hub.published.get(qid, 0) >= 1)
        last_id = gw.hub.rings[qid].next_id - 1
    async with Gateway(_config(tmp_path)) as gw:
        d = gw.describe_query(qid)
        assert [s["type"] for s in d["sinks"]] == ["file", "webhook"]
        assert d["options"]["sinks"][0]["path"] == "kept"
        assert d["sinks"][0]["directory"].endswith("/sinks/kept")
        assert gw.hub.rings[qid].next_id > last_id  # a row id is never given twice


async def test_a_saved_webhook_to_a_host_no_longer_allowed_fails_that_query_only(
    tmp_path: Path,
) -> None:
    """Narrowing `[sinks] webhook_hosts` after a webhook query was saved: the next start keeps
    running, lists that query as failed with the reason, and restores the others."""
    sink = [{"type": "webhook", "url": "http://127.0.0.1:9/"}]
    async with Gateway(_config(tmp_path)) as gw:
        hooked = await gw.register(FILTER, {"sinks": sink})
        plain = await gw.register(FILTER)
    narrowed = SinkSettings(webhook_hosts=["hooks.example.com"])
    async with Gateway(_config(tmp_path), sinks=narrowed) as gw:
        assert plain in gw.fjord.queries
        assert hooked not in gw.fjord.queries
        assert "webhook_hosts" in gw.describe_query(hooked)["error"]
        host, port = await gw.start_http()
        async with aiohttp.ClientSession(f"http://{host}:{port}") as http:
            r = await http.post("/queries", json={"sql": FILTER, "sinks": sink})
            assert r.status == 400 and "webhook_hosts" in (await r.json())["error"]


def test_subscription_row_ids_stay_right_when_a_slow_client_loses_rows() -> None:
    from gateway.results import ResultHub

    hub = ResultHub(ring_rows=0)
    sub = hub.subscribe("q", buffer=3)
    hub.publish("q", [{"x": i} for i in range(5)])  # ids 1-5; the buffer keeps 3-5
    batch = sub.drain()
    assert (batch.first_id, batch.missed, batch.rows[0]) == (3, 2, {"x": 2})
    hub.publish("q", [{"x": 5}])
    assert sub.drain().first_id == 6


def test_mqtt_sink_coalesces_per_group_and_bounds_the_groups() -> None:
    from gateway.sinks.mqtt import MqttSink, topic_level
    from gateway.sinks.spec import MqttSinkSpec

    class Link:
        prefix = "p"

    assert [topic_level(v) for v in ("S05", "a/b", "+", "#", None, 3.5)] == [
        "S05", "a%2Fb", "%2B", "%23", "%00", "3.5",
    ]  # fmt: skip
    sink = MqttSink("q", MqttSinkSpec(), None, Link(), ("seg",), max_groups=2)  # type: ignore[arg-type]
    sink.offer([{"seg": "A", "v": 1}, {"seg": "B", "v": 2}, {"seg": "A", "v": 3}, {"seg": "C"}])
    assert {t: json.loads(p) for t, p in sink.latest.items()} == {
        "p/results/q/A": {"seg": "A", "v": 3},
        "p/results/q/B": {"seg": "B", "v": 2},
    }
    assert sink.superseded == 1 and sink.dropped == {"too_many_groups": 1}
    assert MqttSink("q", MqttSinkSpec(), None, Link(), (), max_groups=2).topic({}) == (  # type: ignore[arg-type]
        "p/results/q/last"
    )


# -- MQTT: retained last value per group --------------------------------------------------------


async def test_mqtt_sink_retains_the_latest_row_of_every_group(
    broker: Broker,
    tmp_path: Path,
) -> None:
    cfg = _config(tmp_path, mqtt=MqttConfig(url=f"mqtt://{broker.host}:{broker.port}"))
    async with Gateway(cfg) as gw:
        host, port = await gw.start_http()
        async with aiohttp.ClientSession(f"http://{host}:{port}") as http:
            sink = {"type": "mqtt", "qos": 1}
            r = await http.post("/queries", json={"sql": GROUPED, "sinks": [sink]})
            assert r.status == 201, await r.text()
            qid = (await r.json())["id"]
            rows = [(10.0, "S1", 40.0), (20.0, "S2", 60.0), (30.0, "S 3/x", 10.0)]
            rows += [(400.0, "S1", 50.0), (410.0, "S2", 70.0)]  # second window
            for t, seg, speed in rows:
                gw.fjord.push("traffic", _row(t, speed, seg))
            gw.fjord.end_of_stream()
            state: dict = {}

            async def sent() -> int:
                nonlocal state
                state = (await (await http.get(f"/queries/{qid}")).json())["sinks"][0]
                return state["rows_sent"] + state["superseded"]

            await _until(sent, lambda n: n >= 5, interval=0.02)
            assert state["groups"] == 3 and state["dropped"] == 0
            # A subscriber that connects now gets every group's latest value at once.
            async with aiomqtt.Client(broker.host, broker.port, identifier="late") as late:
                await late.subscribe(f"fjords/results/{qid}/#", qos=1)
                got: dict[str, Any] = {}
                async with asyncio.timeout(10):
                    async for msg in late.messages:
                        assert msg.retain
                        got[msg.topic.value] = json.loads(msg.payload)
                        if len(got) == 3:
                            break
            base = f"fjords/results/{qid}"
            assert got[f"{base}/S1"]["avg_speed"] == 50.0
            assert got[f"{base}/S2"]["avg_speed"] == 70.0
            assert got[f"{base}/S%203%2Fx"]["avg_speed"] == 10.0
            assert (await http.delete(f"/queries/{qid}")).status == 204
            # Deleting the query clears its retained values.
            async with aiomqtt.Client(broker.host, broker.port, identifier="after") as after:
                await _until(lambda: not gw.sinks._retiring, timeout=10)
                await asyncio.sleep(0.2)
                await after.subscribe(f"fjords/results/{qid}/#", qos=1)
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.5):
                        async for msg in after.messages:
                            raise AssertionError(f"still retained: {msg.topic.value}")


async def _retained(broker: Broker, pattern: str, wait: float = 0.5) -> dict[str, bytes]:
    """The retained messages the broker holds under `pattern` (a new subscriber's first burst)."""
    got: dict[str, bytes] = {}
    async with aiomqtt.Client(broker.host, broker.port) as c:
        await c.subscribe(pattern, qos=1)
        try:
            async with asyncio.timeout(wait):
                async for msg in c.messages:
                    if msg.retain:
                        got[msg.topic.value] = bytes(msg.payload)  # type: ignore[arg-type]
        except TimeoutError:
            pass
    return got


async def test_deleting_after_a_restart_clears_groups_an_earlier_run_retained(
    broker: Broker,
    tmp_path: Path,
) -> None:
    """The groups published before a restart are not in this run's memory: deleting the query
    must still leave nothing retained under its topics."""
    mqtt = MqttConfig(url=f"mqtt://{broker.host}:{broker.port}")
    async with Gateway(_config(tmp_path, mqtt=mqtt)) as gw:
        qid = await gw.register(GROUPED, {"sinks": [{"type": "mqtt"}]})
        for t, seg in ((10.0, "S1"), (20.0, "S2"), (400.0, "S1")):
            gw.fjord.push("traffic", _row(t, 50.0, seg))
        await _until(lambda: gw.describe_query(qid)["sinks"][0]["groups"] == 2)
        await _until(lambda: gw.describe_query(qid)["sinks"][0]["queued"] == 0)
    base = f"fjords/results/{qid}"
    assert set(await _retained(broker, f"{base}/#", 2.0)) == {f"{base}/S1", f"{base}/S2"}
    async with Gateway(_config(tmp_path, mqtt=mqtt)) as gw:
        assert qid in gw.fjord.queries
        gw.fjord.push("traffic", _row(1000.0, 50.0, "S3"))  # this run publishes S3 only
        gw.fjord.end_of_stream()
        await _until(lambda: gw.describe_query(qid)["sinks"][0]["groups"] == 1)
        gw.remove_query(qid)
        await _until(lambda: not gw.sinks._retiring, timeout=10)
        await _until(lambda: gw.sinks.link is not None and gw.sinks.link.idle(), timeout=10)
    assert await _retained(broker, f"{base}/#", 1.0) == {}


# -- the contract --------------------------------------------------------------------------------


async def test_sinks_and_since_match_the_document(gw: Gateway) -> None:
    from tests.gateway.test_openapi import call

    base = gw.base  # type: ignore[attr-defined]
    sinks = [
        {"type": "file", "format": "parquet", "path": "doc"},
        {"type": "webhook", "url": "http://127.0.0.1:9/hook", "batch_rows": 10},
    ]
    async with aiohttp.ClientSession() as http:
        created = await call(http, base, "POST", "/queries", {"sql": GROUPED, "sinks": sinks})
        assert created.status_code == 201
        qid = json.loads(created.data)["id"]
        got = await call(http, base, "GET", f"/queries/{qid}")
        assert [s["type"] for s in json.loads(got.data)["sinks"]] == ["file", "webhook"]
        for q in ({"since": "12"}, {"since": "2026-01-01T00:00:00+00:00", "ids": "true"}):
            async with http.get(f"{base}/queries/{qid}/results", params=q) as r:
                assert r.status == 200
        for q in ({"since": "soon"}, {"ids": "maybe"}):
            r = await call(http, base, "GET", f"/queries/{qid}/results", query=q)
            assert r.status_code == 400
        bad = {"sql": GROUPED, "sinks": [{"type": "file", "path": "/etc"}]}
        assert (await call(http, base, "POST", "/queries", bad)).status_code == 400


async def test_sinks_write_early_and_final_rows_with_their_flags_and_nulls(gw: Gateway) -> None:
    """Every row, early and final, reaches every sink with `final` (a boolean, in Parquet too)
    and `as_of` (a number, as window_start is); a ROLLUP's rolled-up group values are nulls,
    never the text "None"."""
    queries = {
        "changes": "SELECT segment, AVG(speed) AS a FROM traffic [RANGE 1 HOUR] "
        "GROUP BY segment EMIT CHANGES EVERY 10 MINUTES",
        "rollup": "SELECT segment, station, AVG(speed) AS a FROM traffic [RANGE 1 HOUR] "
        "GROUP BY ROLLUP(segment, station)",
    }
    base = gw.base  # type: ignore[attr-defined]
    hooks = {k: Receiver() for k in queries}
    ids: dict[str, str] = {}
    async with hooks["changes"], hooks["rollup"], aiohttp.ClientSession(base) as http:
        for k, sql in queries.items():
            sinks = [
                {"type": "file", "format": "parquet", "path": f"{k}/p", "batch_ms": 0},
                {"type": "file", "format": "ndjson", "path": f"{k}/n", "batch_ms": 0},
                {"type": "webhook", "url": hooks[k].url, "batch_ms": 0},
            ]
            r = await http.post("/queries", json={"sql": sql, "sinks": sinks})
            assert r.status == 201, await r.text()
            ids[k] = (await r.json())["id"]
        for t, st, speed in ((10.0, "a", 40.0), (20.0, "b", 60.0), (700.0, "a", 50.0)):
            gw.fjord.push("traffic", _row(t, speed, "S1", st))
        gw.fjord.push("traffic", _row(710.0, 50.0, "S1", "b"))
        gw.fjord.end_of_stream()
        # EMIT CHANGES: an early row every 10 minutes, then the final one; ROLLUP: its 3 levels
        want = {
            "changes": [("S1", False, k * 600.0) for k in range(1, 6)] + [("S1", True, 3600.0)],
            "rollup": [("S1", "a"), ("S1", "b"), ("S1", None), (None, None)],
        }
        for k, qid in ids.items():
            n = len(want[k])
            await _until(lambda q=qid, n=n: all(s["rows_sent"] >= n for s in gw.sinks.describe(q)))
        dirs = {k: [Path(s["directory"]) for s in gw.sinks.describe(q)[:2]] for k, q in ids.items()}
    await gw.__aexit__(None, None, None)
    for k in queries:
        parquet = [pq.read_table(p) for p in sorted(dirs[k][0].glob("*.parquet"))]
        ndjson = [line for p in sorted(dirs[k][1].glob("*.ndjson")) for line in p.open()]
        for rows in (
            [r for t in parquet for r in t.to_pylist()],
            list(map(json.loads, ndjson)),
            hooks[k].rows(),
        ):
            if k == "changes":
                assert [(r["segment"], r["final"], r["as_of"]) for r in rows] == want[k]
                assert all(type(r["final"]) is bool and type(r["as_of"]) is float for r in rows)
            else:
                assert sorted(((r["segment"], r["station"]) for r in rows), key=str) == sorted(
                    want[k], key=str
                )
            assert "None" not in json.dumps(rows)
        if k == "changes":
            assert all(t.schema.field("final").type == pa.bool_() for t in parquet)
            assert all(
                t.schema.field("as_of").type == t.schema.field("window_start").type for t in parquet
            )
        else:
            assert all(t.schema.field("segment").type == pa.string() for t in parquet)
