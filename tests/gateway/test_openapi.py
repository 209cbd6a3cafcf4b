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
) -> Resp:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    async with http.request(
        method, base + path, data=data, params=query, headers={"Content-Type": "application/json"}
    ) as r:
        payload = await r.read() if path.split("?")[0].endswith("/results") is False else b""
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
async def gw(tmp_path):  # noqa: ANN001, ANN201
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
        assert (await call(http, base, "DELETE", f"/queries/{qid}")).status_code == 204
        assert (await call(http, base, "DELETE", f"/queries/{qid}")).status_code == 404
