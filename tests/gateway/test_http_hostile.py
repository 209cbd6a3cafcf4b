"""Hostile HTTP clients against the real daemon (`fjords-gateway run` subprocess).

Every malformed request is a 400 (or 401/403/413/415) with a JSON message, never a 500; with a
token, every endpoint but /healthz needs it; streams check the token and the Origin; writes need
`application/json` so a web page cannot forge them. The daemon stays up throughout.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.daemon import wait_healthy
from tests.support import ROOT, free_port

TOKEN = "s3cret-token"
READ_TOKEN = "read-only-token"
GOOD = "SELECT segment, AVG(speed) AS a FROM traffic [RANGE 1 MINUTE] GROUP BY segment"
JSON = {"Content-Type": "application/json"}


class Daemon:
    def __init__(self, url: str, proc: subprocess.Popen) -> None:
        self.url, self.proc = url, proc

    def call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) of one request; HTTP errors are answers, not exceptions."""
        req = urllib.request.Request(
            self.url + path, data=body, method=method, headers=headers or {}
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return (
                    r.status,
                    dict(r.headers),
                    r.read() if method != "GET" or "results" not in path else b"",
                )
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def alive(self) -> None:
        assert self.proc.poll() is None, self.proc.stderr.read()
        status, _, body = self.call("GET", "/healthz")
        assert status == 200, body


def start_daemon(tmp_path: Path, toml: str) -> Daemon:
    port = free_port()
    config = tmp_path / "gateway.toml"
    config.write_text(f'[http]\nport = {port}\n{toml}\n[state]\ndir = "{tmp_path / "state"}"\n')
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "run", "--config", str(config)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, log=proc.stderr.read)
    return Daemon(url, proc)


def stop(d: Daemon) -> str:
    d.proc.terminate()
    try:
        d.proc.wait(timeout=20)
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
    return d.proc.stderr.read()


@pytest.fixture(scope="module")
def open_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    # (writes not rate-limited: hypothesis sends hundreds a second; test_http_guard.py has the limit)
    d = start_daemon(
        tmp_path_factory.mktemp("open"), "write_rate_per_s = 0\n[simulation]\nenabled = false\n"
    )
    yield d
    stop(d)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = start_daemon(
        tmp_path_factory.mktemp("secured"),
        f'token = "{TOKEN}"\nread_token = "{READ_TOKEN}"\n'
        'allowed_origins = ["https://dashboard.example"]\n[simulation]\nenabled = false\n',
    )
    yield d
    stop(d)


def _error(body: bytes) -> str:
    data = json.loads(body)
    assert isinstance(data.get("error"), str) and data["error"]
    assert "Traceback" not in data["error"]
    return data["error"]


# -- no client input is a 500 --------------------------------------------------------------------

DEEP = b'{"sql": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
HOSTILE_BODIES = {
    "invalid utf-8": (b'{"sql": "SELECT \xff\xfe FROM traffic"}', JSON),
    "unknown charset": (
        b'{"sql": "SELECT * FROM traffic"}',
        {"Content-Type": "application/json; charset=x-no-such-charset"},
    ),
    "undecodable in its charset": (
        b'{"sql": "SELECT * FROM traffic"}',
        {"Content-Type": "application/json; charset=utf-16"},
    ),
    "nested 10,000 deep": (DEEP, JSON),
    "bare nesting 10,000 deep": (b"[" * 10_000 + b"]" * 10_000, JSON),
    "huge integer": (b'{"sql": "SELECT * FROM traffic", "dry_run": ' + b"9" * 5000 + b"}", JSON),
    "huge float": (b'{"sql": "SELECT * FROM traffic", "dry_run": 1e999}', JSON),
    "lone surrogate": (b'{"sql": "SELECT time AS \\"\\ud800\\" FROM traffic"}', JSON),
    # IGNORECASE with Unicode rules took it for INTO, and the parser raised a KeyError
    "keyword lookalike": (
        json.dumps({"sql": "SELECT speed FROM traffic WHERE \u0130nto = 1"}).encode(),
        JSON,
    ),
    "array body": (b'["SELECT * FROM traffic"]', JSON),
    "string body": (b'"SELECT * FROM traffic"', JSON),
    "null body": (b"null", JSON),
    "empty body": (b"", JSON),
    "sql a number": (b'{"sql": 5}', JSON),
    "sql an object": (b'{"sql": {"a": 1}}', JSON),
    "dry_run a string": (b'{"sql": "SELECT * FROM traffic", "dry_run": "yes"}', JSON),
    "dry_run a list": (b'{"sql": "SELECT * FROM traffic", "dry_run": [1]}', JSON),
    "publish a number": (b'{"sql": "SELECT * FROM traffic", "publish": 5}', JSON),
    "engine a list": (b'{"sql": "SELECT * FROM traffic", "engine": ["spark"]}', JSON),
    "unknown field": (b'{"sql": "SELECT * FROM traffic", "dryrun": true}', JSON),
    "range overflows": (
        json.dumps({"sql": "SELECT COUNT(*) AS n FROM traffic [RANGE 1e308 WEEKS]"}).encode(),
        JSON,
    ),
    "slide under 1 ms": (
        json.dumps(
            {"sql": "SELECT COUNT(*) AS n FROM traffic [RANGE 1 MINUTE SLIDE 0.0001 SECONDS]"}
        ).encode(),
        JSON,
    ),
}


@pytest.mark.parametrize("dry_run", [False, True], ids=["register", "dry_run"])
@pytest.mark.parametrize("case", sorted(HOSTILE_BODIES))
def test_hostile_bodies_are_400(open_daemon: Daemon, case: str, dry_run: bool) -> None:
    body, headers = HOSTILE_BODIES[case]
    if dry_run and body.startswith(b'{"sql": "SELECT COUNT'):
        body = body[:-1] + b', "dry_run": true}'
    status, hdrs, answer = open_daemon.call("POST", "/queries", body, headers)
    assert status == 400, (case, status, answer)
    assert hdrs["Content-Type"].startswith("application/json")
    _error(answer)
    open_daemon.alive()


@pytest.mark.parametrize(
    "query", ["buffer=abc", "buffer=-1", "buffer=0", "buffer=1e9", "format=x", "format="]
)
def test_bad_query_strings_are_400(open_daemon: Daemon, query: str) -> None:
    status, _, body = open_daemon.call("POST", "/queries", json.dumps({"sql": GOOD}).encode(), JSON)
    assert status == 201, body
    qid = json.loads(body)["id"]
    paths = [f"/queries/{qid}/results?{query}"]
    if query.startswith("buffer"):
        paths.append(f"/queries/{qid}/ws?{query}")
    for path in paths:
        status, _, answer = open_daemon.call("GET", path)
        assert status == 400, (path, status)
        assert "buffer" in _error(answer) or "format" in _error(answer)
    open_daemon.call("DELETE", f"/queries/{qid}")
    open_daemon.alive()


def _nested(inner: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)


# (a named function: Hypothesis read this lambda's source wrongly and warned it never recursed)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(), _nested, max_leaves=12
)
bodies = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {"sql": json_values | st.sampled_from(["SELECT * FROM traffic", GOOD, "SELECT"])},
        optional={
            "dry_run": json_values,
            "publish": json_values,
            "engine": json_values,
        },
    ).map(lambda v: json.dumps(v).encode()),
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    body=bodies,
    content_type=st.sampled_from(["application/json", "application/json; charset=latin-1"]),
)
def test_generated_bodies_never_500(open_daemon: Daemon, body: bytes, content_type: str) -> None:
    status, _, answer = open_daemon.call("POST", "/queries", body, {"Content-Type": content_type})
    assert status in (200, 201, 400), (status, body, answer)
    if status == 201:
        open_daemon.call("DELETE", f"/queries/{json.loads(answer)['id']}")
    else:
        json.loads(answer)


# -- security defaults -------------------------------------------------------------------------


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def secured_qid(secured: Daemon) -> str:
    status, _, body = secured.call(
        "POST", "/queries", json.dumps({"sql": GOOD}).encode(), {**JSON, **bearer(TOKEN)}
    )
    assert status == 201, body
    return json.loads(body)["id"]


READS = [
    "/queries",
    "/queries/{qid}",
    "/queries/{qid}/results",
    "/queries/{qid}/results?format=ndjson",
    "/sensors",
    "/sensors/nope",
    "/tables",
    "/metrics",
]


@pytest.mark.parametrize("path", READS)
def test_reads_need_a_token(secured: Daemon, secured_qid: str, path: str) -> None:
    path = path.format(qid=secured_qid)
    status, hdrs, body = secured.call("GET", path)
    assert status == 401, (path, status)
    assert hdrs.get("WWW-Authenticate", "").startswith("Bearer")
    _error(body)
    assert secured.call("GET", path, headers=bearer("s3cret-tokeX"))[0] == 401  # same length
    assert secured.call("GET", path, headers=bearer(""))[0] == 401
    assert secured.call("GET", path, headers=bearer("\xff\xfe"))[0] == 401  # not UTF-8
    assert secured.call("GET", path, headers={"Authorization": "Basic czNjcmV0"})[0] == 401
    expected = 404 if path == "/sensors/nope" else 200
    assert secured.call("GET", path, headers=bearer(READ_TOKEN))[0] == expected
    assert secured.call("GET", path, headers=bearer(TOKEN))[0] == expected


def test_healthz_needs_no_token(secured: Daemon) -> None:
    secured.alive()


def test_writes_need_the_write_token(secured: Daemon, secured_qid: str) -> None:
    body = json.dumps({"sql": GOOD}).encode()
    assert secured.call("POST", "/queries", body, JSON)[0] == 401
    status, _, answer = secured.call("POST", "/queries", body, {**JSON, **bearer(READ_TOKEN)})
    assert status == 403 and "read-only" in _error(answer)
    assert secured.call("DELETE", f"/queries/{secured_qid}", headers=bearer(READ_TOKEN))[0] == 403
    assert secured.call("DELETE", f"/queries/{secured_qid}")[0] == 401
    # ?token= is for EventSource and WebSocket only, never for a write or a plain read.
    assert secured.call("POST", f"/queries?token={TOKEN}", body, JSON)[0] == 401
    assert secured.call("GET", f"/queries?token={TOKEN}")[0] == 401


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"],
)
def test_writes_need_json_content_type(secured: Daemon, content_type: str | None) -> None:
    headers = bearer(TOKEN)
    if content_type:
        headers["Content-Type"] = content_type
    status, _, answer = secured.call(
        "POST", "/queries", json.dumps({"sql": GOOD}).encode(), headers
    )
    assert status == 415, status
    assert "application/json" in _error(answer)


def test_stream_token_in_query_string_and_origin(secured: Daemon, secured_qid: str) -> None:
    results = f"/queries/{secured_qid}/results"
    assert secured.call("GET", f"{results}?token={READ_TOKEN}")[0] == 200
    assert secured.call("GET", f"{results}?token=wrong")[0] == 401
    assert secured.call("GET", f"{results}?token=%FF%FE")[0] == 401
    evil = {"Origin": "https://evil.example"}
    status, _, body = secured.call("GET", f"{results}?token={READ_TOKEN}", headers=evil)
    assert status == 403 and "origin" in _error(body).lower()
    status, _, _ = secured.call("GET", results, headers={**evil, **bearer(TOKEN)})
    assert status == 403
    allowed = {"Origin": "https://dashboard.example"}
    status, hdrs, _ = secured.call("GET", f"{results}?token={READ_TOKEN}", headers=allowed)
    assert status == 200
    assert hdrs.get("Access-Control-Allow-Origin") == "https://dashboard.example"
    # A forged cross-origin write is refused whatever its content type.
    status, _, _ = secured.call(
        "POST", "/queries", json.dumps({"sql": GOOD}).encode(), {**JSON, **evil, **bearer(TOKEN)}
    )
    assert status == 403


async def test_websocket_checks_token_and_origin(secured: Daemon, secured_qid: str) -> None:
    path = f"{secured.url}/queries/{secured_qid}/ws"
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as e:
            await http.ws_connect(path)
        assert e.value.status == 401
        with pytest.raises(aiohttp.WSServerHandshakeError) as e:
            await http.ws_connect(f"{path}?token={READ_TOKEN}", origin="https://evil.example")
        assert e.value.status == 403
        ws = await http.ws_connect(f"{path}?token={READ_TOKEN}", origin="https://dashboard.example")
        await ws.close()
        ws = await http.ws_connect(path, headers=bearer(TOKEN))
        await ws.close()
    secured.alive()
