"""Every documented endpoint answers as gateway/openapi.yaml says (validated with openapi-core)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from openapi_core import OpenAPI
from openapi_core.datatypes import RequestParameters
from werkzeug.datastructures import Headers, ImmutableMultiDict

from gateway.config import Config
from gateway.daemon import Gateway

SPEC = OpenAPI.from_file_path(str(Path(__file__).resolve().parents[2] / "gateway" / "openapi.yaml"))


@dataclass
class Req:
    host_url: str
    path: str
    method: str
    body: bytes | None = None
    content_type: str = "application/json"
    query: dict[str, str] = field(default_factory=dict)

    @property
    def parameters(self) -> RequestParameters:
        return RequestParameters(
            query=ImmutableMultiDict(self.query), header=Headers({}), cookie=ImmutableMultiDict()
        )


@dataclass
class Resp:
    status_code: int
    content_type: str
    data: bytes
    headers: Headers


async def call(
    http: aiohttp.ClientSession,
    base: str,
    method: str,
    path: str,
    body: object = None,
    raw: bytes | None = None,
    query: dict | None = None,
    headers: dict[str, str] | None = None,
) -> Resp:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    async with http.request(
        method,
        base + path,
        data=data,
        params=query,
        headers={"Content-Type": "application/json", **(headers or {})},
    ) as r:
        streaming = path.split("?")[0].endswith("/results") and r.status == 200
        payload = b"" if streaming else await r.read()
        resp = Resp(
            r.status,
            r.headers.get("Content-Type", "").split(";")[0],
            payload,
            Headers(dict(r.headers)),
        )
    req = Req(
        "http://127.0.0.1:8080", path, method.lower(), data, query=query or {}
    )  # the documented server
    SPEC.validate_response(req, resp)  # raises if the answer does not match the document
    return resp


@pytest.fixture
async def gw(tmp_path):
    cfg = Config()
    cfg.http.port = 0
    cfg.http.max_body_bytes = 2048
    async with Gateway(cfg) as g:
        host, port = await g.start_http()
        g.base = f"http://{host}:{port}"  # type: ignore[attr-defined]
        yield g


async def test_responses_match_the_document(gw: Gateway) -> None:
    base = gw.base  # type: ignore[attr-defined]
    async with aiohttp.ClientSession() as http:
        created = await call(
            http,
            base,
            "POST",
            "/queries",
            {
                "sql": "SELECT segment, AVG(speed) AS a FROM traffic [RANGE 1 MINUTE] GROUP BY segment"
            },
        )
        assert created.status_code == 201
        qid = json.loads(created.data)["id"]
        assert (
            await call(
                http, base, "POST", "/queries", {"sql": "SELECT * FROM traffic", "dry_run": True}
            )
        ).status_code == 200
        assert (
            await call(http, base, "POST", "/queries", {"sql": "SELECT FROM"})
        ).status_code == 400
        assert (
            await call(http, base, "POST", "/queries", {"sql": "SELECT x FROM traffic"})
        ).status_code == 400
        assert (await call(http, base, "POST", "/queries", {"sql": "x" * 5000})).status_code == 413
        assert (await call(http, base, "GET", "/queries")).status_code == 200
        assert (await call(http, base, "GET", f"/queries/{qid}")).status_code == 200
        assert (await call(http, base, "GET", "/queries/nope")).status_code == 404
        assert (await call(http, base, "GET", "/sensors")).status_code == 200
        assert (await call(http, base, "GET", "/sensors/nope")).status_code == 404
        assert (await call(http, base, "GET", "/tables")).status_code == 200
        assert (await call(http, base, "GET", "/metrics")).status_code == 200
        assert (await call(http, base, "GET", "/healthz")).status_code == 200
        snap = "SELECT segment, COUNT(*) AS n FROM traffic [RANGE 1 HOUR] GROUP BY segment"
        assert (await call(http, base, "POST", "/snapshot", {"sql": snap})).status_code == 200
        assert (
            await call(http, base, "POST", "/snapshot", {"sql": snap, "partial": True})
        ).status_code == 200
        assert (
            await call(http, base, "POST", "/snapshot", {"sql": snap + " EMIT EVERY 1 MINUTE"})
        ).status_code == 400
        assert (await call(http, base, "POST", "/snapshot", {"sqll": snap})).status_code == 400
        spark = {"sql": snap, "engine": "spark"}  # this gateway has no archive
        assert (await call(http, base, "POST", "/snapshot", spark)).status_code == 400
        assert (await call(http, base, "DELETE", f"/queries/{qid}")).status_code == 204
        assert (await call(http, base, "DELETE", f"/queries/{qid}")).status_code == 404


@pytest.fixture
async def secured(tmp_path):
    cfg = Config()
    cfg.http.port = 0
    cfg.http.token = "w"
    cfg.http.read_token = "r"
    async with Gateway(cfg) as g:
        host, port = await g.start_http()
        g.base = f"http://{host}:{port}"  # type: ignore[attr-defined]
        yield g


async def test_refusals_match_the_document(secured: Gateway) -> None:
    base = secured.base  # type: ignore[attr-defined]
    write, read = {"Authorization": "Bearer w"}, {"Authorization": "Bearer r"}
    sql = {"sql": "SELECT * FROM traffic"}
    async with aiohttp.ClientSession() as http:
        for path in ("/queries", "/queries/x", "/sensors", "/sensors/x", "/tables", "/metrics"):
            assert (await call(http, base, "GET", path)).status_code == 401
            evil = {**write, "Origin": "https://evil.example"}
            assert (await call(http, base, "GET", path, headers=evil)).status_code == 403
        assert (await call(http, base, "GET", "/queries/x/results")).status_code == 401
        assert (await call(http, base, "GET", "/healthz")).status_code == 200
        assert (await call(http, base, "POST", "/queries", sql)).status_code == 401
        assert (await call(http, base, "POST", "/queries", sql, headers=read)).status_code == 403
        plain = {**write, "Content-Type": "text/plain"}
        assert (await call(http, base, "POST", "/queries", sql, headers=plain)).status_code == 415
        bad = [b"\xff", b"[" * 5000, b'{"sql": 1}', b'{"sql": "x", "dry_run": "yes"}']
        for raw in bad:
            r = await call(http, base, "POST", "/queries", raw=raw, headers=write)
            assert r.status_code == 400
        created = await call(http, base, "POST", "/queries", sql, headers=write)
        qid = json.loads(created.data)["id"]
        for q in ({"buffer": "abc"}, {"format": "x"}):
            r = await call(http, base, "GET", f"/queries/{qid}/results", query=q, headers=read)
            assert r.status_code == 400
        r = await call(http, base, "DELETE", f"/queries/{qid}", headers=read)
        assert r.status_code == 403
        r = await call(http, base, "DELETE", f"/queries/{qid}", headers=write)
        assert r.status_code == 204
