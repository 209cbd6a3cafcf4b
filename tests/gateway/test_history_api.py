"""The HTTP side of history: `since` on POST /queries (epoch seconds or ISO-8601, refused with
a reason where the history cannot serve it), and snapshots as a read a read-only token may ask."""

from __future__ import annotations

import json

import aiohttp
import pytest

from gateway.config import Config
from gateway.daemon import Gateway


@pytest.fixture
async def gw(tmp_path):
    cfg = Config()
    cfg.http.port = 0
    cfg.http.token = "w"
    cfg.http.read_token = "r"
    cfg.simulation = None
    cfg.state_dir = None
    cfg.history.keep_s = 1800
    async with Gateway(cfg) as g:
        host, port = await g.start_http()
        g.base = f"http://{host}:{port}"  # type: ignore[attr-defined]
        q = g.fjord.streams["traffic"].queue
        q.put_many(
            [(float(t), f"s{i}", 50.0 + i, 34.0, -118.0, f"S{i % 2}")
             for t in range(1_700_000_000, 1_700_003_600, 60) for i in range(3)]
        )  # fmt: skip
        g.fjord.run_until_idle()
        yield g


async def _post(g, path: str, body: dict, token: str = "w") -> tuple[int, dict]:
    async with (
        aiohttp.ClientSession() as http,
        http.post(g.base + path, json=body, headers={"Authorization": f"Bearer {token}"}) as r,
    ):
        return r.status, json.loads(await r.read())


SQL = "SELECT segment, COUNT(*) AS n FROM traffic [RANGE 10 MINUTES] GROUP BY segment"


async def test_since_takes_epoch_seconds_or_iso_8601(gw) -> None:
    status, body = await _post(gw, "/queries", {"sql": SQL, "since": 1_700_002_400})
    assert status == 201, body
    status, body = await _post(gw, "/queries", {"sql": SQL, "since": "2023-11-14T22:53:20Z"})
    assert status == 201, body
    assert gw.fjord.queries[body["id"]].start_time == 1_700_002_400.0


@pytest.mark.parametrize(
    "since, says",
    [
        ("yesterday", "neither epoch seconds nor ISO-8601"),
        (1_700_000_000, "before what the history"),  # evicted: it keeps 1800 s
    ],
)
async def test_since_the_history_cannot_serve_is_a_400(gw, since, says) -> None:
    status, body = await _post(gw, "/queries", {"sql": SQL, "since": since})
    assert status == 400 and says in body["error"], body
    assert not gw.fjord.queries


async def test_a_read_only_token_may_ask_a_snapshot_but_not_register(gw) -> None:
    status, body = await _post(gw, "/snapshot", {"sql": SQL}, token="r")
    assert status == 200, body
    assert {r["segment"]: r["n"] for r in body["rows"]} == {"S0": 20, "S1": 10}
    assert (await _post(gw, "/queries", {"sql": SQL}, token="r"))[0] == 403


async def test_engine_spark_needs_an_archive(gw) -> None:
    status, body = await _post(gw, "/snapshot", {"sql": SQL, "engine": "spark"}, token="r")
    assert status == 400 and "[archive] dir" in body["error"], body


async def test_a_spark_job_that_fails_is_a_502_naming_why(tmp_path) -> None:
    """A failure outside the query (an unreadable page, a lost executor) is answered, named."""
    from fjords.runtime.history import HistoricalAggregates

    class Failing:
        name = "spark"

        def aggregates(self, stream, start, end, before, static, measure):
            def groups() -> list[tuple]:
                raise RuntimeError("Job aborted: executor lost\n\tat org.apache.spark...")

            return HistoricalAggregates(groups, [], True)

    cfg = Config()
    cfg.http.port = 0
    cfg.simulation = None
    cfg.state_dir = None
    cfg.archive.dir = str(tmp_path / "archive")
    async with Gateway(cfg) as g:
        host, port = await g.start_http()
        g.base = f"http://{host}:{port}"  # type: ignore[attr-defined]
        g._spark_aggregates = Failing  # type: ignore[method-assign]
        g.fjord.streams["traffic"].queue.put_many(
            [(1_700_000_000.0 + t, "s1", 50.0, 34.0, -118.0, "S1") for t in range(0, 600, 60)]
        )
        g.fjord.run_until_idle()
        status, body = await _post(
            g, "/snapshot", {"sql": "SELECT COUNT(*) AS n FROM traffic", "engine": "spark"}
        )
    assert status == 502 and "executor lost" in body["error"], body
    assert "org.apache" not in body["error"]
