"""The HTTP guard (gateway/http_guard.py): its state machines, then each limit against the
gateway's own server in-process (raw sockets where a client must misbehave), and the
registrations taking turns with the rest of the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import resource
from collections.abc import AsyncIterator

import aiohttp
import pytest

from gateway.config import Config, ConfigError
from gateway.daemon import Gateway
from gateway.http_guard import (
    ConnectionCounts,
    GuardedConnection,
    GuardSettings,
    HttpGuard,
    TokenBuckets,
    check_fd_limit,
    client_key,
)
from tests.support import async_eventually

Q = "SELECT segment, AVG(speed) AS a FROM traffic [RANGE 1 MINUTE] GROUP BY segment"


# -- the state ----------------------------------------------------------------------------------


def test_token_bucket_allows_a_burst_then_the_rate() -> None:
    b = TokenBuckets(rate=2.0, burst=3)
    assert [b.take("a", 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert b.take("a", 0.0) == pytest.approx(0.5)  # a token comes every 0.5 s
    assert b.take("b", 0.0) == 0.0  # per client
    assert b.take("a", 0.5) == 0.0
    assert b.take("a", 0.5) > 0
    assert b.take("a", 100.0) == 0.0  # refilled, to the burst at most
    assert [b.take("a", 100.0) for _ in range(3)][-1] > 0


def test_token_bucket_off_and_forgetting() -> None:
    assert all(TokenBuckets(rate=0.0, burst=1).take("a", 0.0) == 0.0 for _ in range(10))
    b = TokenBuckets(rate=1.0, burst=2, max_keys=10)
    for i in range(11):
        b.take(f"c{i}", float(i))
    assert len(b) <= 10  # the ones refilled (idle) are forgotten, the recent kept
    assert b.take("c10", 10.0) == 0.0 and b.take("c10", 10.0) > 0
    for i in range(100):  # many at once, none idle: the oldest go
        b.take(f"d{i}", 20.0)
    assert len(b) <= 10  # (the newest kept: d99 has 1 of its 2 left)
    assert b.take("d99", 20.0) == 0.0 and b.take("d99", 20.0) > 0


def test_connection_counts_per_client_and_overall() -> None:
    c = ConnectionCounts(total_cap=3, per_client_cap=2)
    for client in ("a", "a", "b"):
        assert c.refusal(client) is None
        c.open(client)
    assert c.refusal("a") == "max_connections_per_client"
    assert c.refusal("c") == "max_connections"
    c.close("a")
    assert c.refusal("c") is None and c.by_client == {"a": 1, "b": 1}


class FakeTransport:
    def __init__(self, unsent: int = 0) -> None:
        self.unsent = unsent

    def get_write_buffer_size(self) -> int:
        return self.unsent


def test_the_connection_closed_to_make_room() -> None:
    """Of the client holding the most connections, the one idle longest; never one still
    sending its last answer."""
    guard = HttpGuard(GuardSettings(max_connections=10, max_connections_per_client=10))
    conns = []
    for i, (client, unsent) in enumerate([("a", 0), ("b", 100), ("b", 0), ("b", 0), ("c", 0)]):
        conn = GuardedConnection(guard, lambda: asyncio.Protocol())
        conn.client, conn.transport = client, FakeTransport(unsent)  # type: ignore[assignment]
        guard.counts.open(client)
        guard.idle[conn] = float(i)
        conns.append(conn)
    assert guard._victim() is conns[2]  # b holds 3; its oldest is still sending
    guard.idle.pop(conns[2])
    guard.idle.pop(conns[3])
    assert guard._victim() is conns[0]  # b's last one is sending: a's (a tie with c), older
    guard.idle.clear()
    assert guard._victim() is None


def test_client_key() -> None:
    assert client_key(("127.0.0.1", 5)) == "127.0.0.1"
    assert client_key(("::ffff:10.0.0.7", 5, 0, 0)) == "10.0.0.7"
    assert client_key(("fe80::1%eth0", 5, 0, 2)) == "fe80::/64"
    assert client_key(("2001:db8::1:2:3:4", 5, 0, 0)) == client_key(("2001:db8::9", 5, 0, 0))
    assert client_key(None) == "local"


def test_fd_limit_raised_to_what_the_caps_need(monkeypatch, caplog) -> None:
    set_to: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 1_048_576))
    monkeypatch.setattr(resource, "setrlimit", lambda _, limits: set_to.append(limits))
    cfg = Config()
    cfg.http.max_connections = 2000
    soft, needed = check_fd_limit(cfg)
    assert set_to == [(needed, 1_048_576)] and soft == needed > 2000
    assert "open-files limit" not in caplog.text


def test_fd_limit_too_low_is_a_warning(monkeypatch, caplog) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _: (256, 512))
    monkeypatch.setattr(resource, "setrlimit", lambda *_: None)
    with caplog.at_level(logging.WARNING, "gateway.http"):
        soft, needed = check_fd_limit(Config())
    assert soft == 512 < needed
    assert "LimitNOFILE" in caplog.text and "max_connections = 256" in caplog.text


@pytest.mark.parametrize(
    ("http", "says"),
    [
        ("max_connections = 10\nmax_connections_per_client = 11", "max_connections_per_client"),
        ("header_timeout_s = inf", "header_timeout_s"),
        ("header_timeout_s = 0", "header_timeout_s"),
        ("body_timeout_s = nan", "body_timeout_s"),
        ("write_rate_per_s = -1", "write_rate_per_s"),
        ("write_burst = 0", "write_burst"),
        ("max_connections = 0", "max_connections"),
    ],
)
def test_bad_limits_are_config_errors(tmp_path, http: str, says: str) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(f"[http]\n{http}\n")
    with pytest.raises(ConfigError, match=says):
        Config.load(path)


# -- against the server ------------------------------------------------------------------------


def settings(**http: float) -> Config:
    cfg = Config()
    cfg.simulation = None
    cfg.http.port = 0
    for key, value in http.items():
        setattr(cfg.http, key, value)
    return cfg


@contextlib.asynccontextmanager
async def serving(**http: float) -> AsyncIterator[Gateway]:
    """The gateway (no sensors) serving its API with these `[http]` settings."""
    gw = Gateway(settings(**http))
    async with gw:
        host, port = await gw.start_http()
        gw.base = f"http://{host}:{port}"  # type: ignore[attr-defined]
        yield gw


def stats(gw: Gateway):
    from gateway.http_api import GUARD_KEY

    assert gw._runner is not None
    return gw._runner.app[GUARD_KEY].stats


async def raw(
    gw: Gateway, source: str = "127.0.0.1"
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    assert gw.address is not None
    return await asyncio.open_connection(*gw.address, local_addr=(source, 0))


async def closed(reader: asyncio.StreamReader) -> bytes:
    """What the server wrote before it closed the connection."""
    return await asyncio.wait_for(reader.read(), 20)


async def test_slowloris_headers_are_cut_off() -> None:
    async with serving(header_timeout_s=0.3) as serve:
        reader, writer = await raw(serve)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")

        async def trickle() -> None:
            for _ in range(200):  # a header byte now and then, never the end of the headers
                writer.write(b"X")
                await asyncio.sleep(0.05)

        dripping = asyncio.create_task(trickle())
        try:
            answer = await closed(reader)
        finally:
            dripping.cancel()
        assert answer.startswith(b"HTTP/1.1 408") and b"header_timeout_s" in answer
        assert stats(serve).closed == {"header_timeout": 1}
        # A client that sends its request in time is served, also after an idle pause.
        async with aiohttp.ClientSession(serve.base) as http:  # type: ignore[attr-defined]
            assert (await http.get("/healthz")).status == 200


async def test_a_slow_body_is_408_and_closed() -> None:
    async with serving(body_timeout_s=0.3) as serve:
        reader, writer = await raw(serve)
        writer.write(
            b"POST /queries HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"sql": '
        )
        answer = await closed(reader)
        assert answer.startswith(b"HTTP/1.1 408") and b"body took longer" in answer
        await async_eventually(lambda: stats(serve).closed, lambda c: c == {"body_timeout": 1})
        assert serve.query_ids() == []


async def test_past_the_per_client_cap_a_503() -> None:
    async with serving(max_connections_per_client=2, max_connections=10) as serve:
        held = [await raw(serve) for _ in range(2)]
        reader, writer = await raw(serve)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await closed(reader)
        assert answer.startswith(b"HTTP/1.1 503") and b"max_connections_per_client" in answer
        assert b"Retry-After: 1" in answer
        assert stats(serve).refused == {"max_connections_per_client": 1}
        # Another address is not this one's cap.
        reader, writer = await raw(serve, "127.0.0.2")
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (await closed(reader)).startswith(b"HTTP/1.1 200")
        for _, w in held:
            w.close()


async def test_at_the_cap_an_idle_connection_makes_room_a_stream_does_not() -> None:
    async with serving(max_connections=3, max_connections_per_client=3) as serve:
        qid = await serve.register("SELECT station, speed FROM traffic")
        async with aiohttp.ClientSession(serve.base) as http:  # type: ignore[attr-defined]
            stream = await http.get(f"/queries/{qid}/results")
            assert stream.status == 200
            idle = [await raw(serve, "127.0.0.2") for _ in range(2)]
            await async_eventually(lambda: stats(serve).connections, lambda n: n == 3)
            # A newcomer at the cap: one of the idle ones is closed for it, not the stream.
            reader, writer = await raw(serve, "127.0.0.3")
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # (its headers unfinished)
            assert await closed(idle[0][0]) == b""
            assert stats(serve).closed == {"evicted": 1}
            writer.write(b"\r\n")
            assert (await reader.readline()).startswith(b"HTTP/1.1 200")
            assert serve.hub.subscribers(qid) == 1
            # Streams and requests in progress hold their slots; idle ones make room.
            second = await http.get(f"/queries/{qid}/results")  # the last of 127.0.0.2's
            assert second.status == 200
            assert await closed(idle[1][0]) == b""
            third = await http.get(f"/queries/{qid}/results")  # 127.0.0.3's, idle now
            assert third.status == 200
            assert (await closed(reader)).endswith(b"}")  # the rest of its answer, then closed
            assert serve.hub.subscribers(qid) == 3
            fourth, _ = await raw(serve, "127.0.0.4")
            answer = await closed(fourth)
            assert answer.startswith(b"HTTP/1.1 503") and b"[http] max_connections)" in answer
            assert stats(serve).refused == {"max_connections": 1}
            assert stats(serve).closed == {"evicted": 3}
            third.close()
            writer.close()
            second.close()
            stream.close()


async def test_writes_past_the_rate_are_429_reads_are_not_limited() -> None:
    async with serving(write_rate_per_s=0.01, write_burst=2) as serve:
        async with aiohttp.ClientSession(serve.base) as http:  # type: ignore[attr-defined]
            for _ in range(2):
                assert (await http.post("/queries", json={"sql": Q})).status == 201
            refused = await http.post("/queries", json={"sql": Q})
            assert refused.status == 429
            assert int(refused.headers["Retry-After"]) >= 1
            assert (await http.delete(f"/queries/{serve.query_ids()[0]}")).status == 429
            for _ in range(20):
                assert (await http.get("/queries")).status == 200
            metrics = await (await http.get("/metrics")).text()
        assert 'fjords_http_requests_refused_total{reason="rate_limited"} 2.0' in metrics
        assert len(serve.query_ids()) == 2


async def test_keep_alive_limits() -> None:
    async with serving(max_requests_per_connection=2, keepalive_timeout_s=0.3) as serve:
        reader, writer = await raw(serve)
        request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        writer.write(request)
        first = await reader.readuntil(b"\r\n\r\n")
        assert b"Connection: close" not in first
        await reader.readexactly(int(first.split(b"Content-Length: ")[1].split(b"\r\n")[0]))
        writer.write(request)
        assert b"Connection: close" in await closed(reader)
        # An idle keep-alive connection is closed after keepalive_timeout_s.
        reader, writer = await raw(serve)
        writer.write(request)
        await reader.readuntil(b"\r\n\r\n")
        answer = await closed(reader)
        assert answer.endswith(b"}")  # the body, then the close


async def test_registrations_take_turns_with_the_event_loop() -> None:
    async with serving() as serve:
        """Concurrent registrations (a POST flood) install one at a time, with a turn of the event
        loop between two: the Fjord's and the result streams' tasks run between installs."""
        turns = 0

        async def other_work() -> None:
            nonlocal turns
            while True:
                turns += 1
                await asyncio.sleep(0)

        seen: list[int] = []
        real = serve.registry.add_query

        def add_query(*args, **kwargs):
            seen.append(turns)
            return real(*args, **kwargs)

        serve.registry.add_query = add_query  # type: ignore[method-assign]
        task = asyncio.create_task(other_work())
        await asyncio.sleep(0)
        try:
            await asyncio.gather(
                *(serve.register(Q.replace("1 MINUTE", f"{i + 1} MINUTES")) for i in range(20))
            )
        finally:
            task.cancel()
        assert len(seen) == 20
        assert all(b > a for a, b in itertools.pairwise(seen)), seen


async def test_concurrent_deletes_of_one_query() -> None:
    async with serving() as serve:
        qid = await serve.register(Q)
        async with aiohttp.ClientSession(serve.base) as http:  # type: ignore[attr-defined]
            answers = await asyncio.gather(*(http.delete(f"/queries/{qid}") for _ in range(5)))
        assert {r.status for r in answers} <= {204, 404} and 204 in {r.status for r in answers}
        assert serve.query_ids() == []
