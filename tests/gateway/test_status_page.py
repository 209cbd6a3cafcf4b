"""The status page (`/`), the API reference (`/docs`) and the spec (`/openapi.yaml`): served
without a token, while the data they show needs it; and the page itself, in a real headless
Chromium (driven over the DevTools protocol) against the real daemon: it loads, lists the
sensors, and shows a result row arriving over Server-Sent Events."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from gateway.config import Config
from gateway.daemon import Gateway
from gateway.status_page import render_docs
from tests.daemon import wait_healthy
from tests.support import ROOT, async_eventually, free_port, require_binary

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def guarded(tmp_path):
    cfg = Config()
    cfg.http.port = 0
    cfg.http.token = TOKEN
    async with Gateway(cfg) as gw:
        host, port = await gw.start_http()
        async with aiohttp.ClientSession(f"http://{host}:{port}") as http:
            yield gw, http


async def test_page_docs_and_spec_load_without_a_token_but_data_needs_it(guarded) -> None:
    _gw, http = guarded
    r = await http.get("/")
    assert r.status == 200 and r.content_type == "text/html"
    page = await r.text()
    assert 'id="sensors"' in page and "EventSource" in page
    assert "http://" not in page.replace("http://www.w3.org", "") and "https://" not in page
    r = await http.get("/openapi.yaml")
    assert r.status == 200 and r.content_type == "text/plain"
    spec = yaml.safe_load(await r.text())
    assert "/queries" in spec["paths"] and "/status" in spec["paths"]
    r = await http.get("/docs")
    assert r.status == 200 and r.content_type == "text/html"
    docs = await r.text()
    for path in spec["paths"]:
        assert f"<code>{path}</code>" in docs
    assert (await http.get("/status")).status == 401
    assert (await http.get("/sensors")).status == 401
    r = await http.get("/status", headers=AUTH)
    assert r.status == 200
    body = await r.json()
    assert body["health"]["status"] in ("ok", "degraded") and "traffic" in body["streams"]
    assert body["gateway"] == _gw.config.gateway.id  # which gateway answers


async def test_status_counts_drops_per_query(guarded) -> None:
    _gw, http = guarded
    r = await http.post("/queries", json={"sql": "SELECT station FROM traffic"}, headers=AUTH)
    qid = (await r.json())["id"]
    body = await (await http.get("/status", headers=AUTH)).json()
    q = body["queries"][qid]
    assert q == {
        "rows": 0,
        "queue_drops": 0,
        "dropped_results": q["dropped_results"],
        "client_missed": 0,
    }


def test_render_docs_escapes_the_spec() -> None:
    spec = {
        "info": {"title": "<b>x</b>", "version": "1", "description": "a & b"},
        "paths": {
            "/q/{id}": {
                "parameters": [{"name": "id", "in": "path", "description": "<id>"}],
                "get": {
                    "summary": "<script>alert(1)</script>",
                    "responses": {"200": {"description": "ok"}},
                },
            }
        },
    }
    out = render_docs(spec)
    assert "<script>" not in out and "&lt;script&gt;" in out
    assert "&lt;b&gt;x&lt;/b&gt;" in out and "&lt;id&gt;" in out and "a &amp; b" in out


# -- a real browser ------------------------------------------------------------------------------


class DevTools:
    """A minimal Chrome DevTools Protocol client (one page) over aiohttp's WebSocket."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self._id = 0

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        await self.ws.send_json({"id": self._id, "method": method, "params": params})
        async for msg in self.ws:
            data = json.loads(msg.data)
            if data.get("id") == self._id:
                if "error" in data:
                    raise AssertionError(f"{method}: {data['error']}")
                return data["result"]
        raise AssertionError("the browser closed the connection")

    async def js(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, seconds: float = 60) -> Any:
        """The first truthy value of `expression` (a generous liveness bound, not a timing test)."""
        try:
            return await async_eventually(
                lambda: self.js(expression),
                message=f"truthy: {expression}",
                timeout=seconds,
                interval=0.2,
            )
        except AssertionError as e:
            raise AssertionError(f"{e}\npage: {await self.js('document.body.innerText')}") from None


CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",
]


@contextlib.asynccontextmanager
async def chromium(binary: str) -> AsyncIterator[DevTools]:
    # Chromium's helper processes (renderer, crash handler) outlive the browser process for a
    # moment and keep writing the profile: the browser gets its own process group, the whole
    # group is stopped, and a file written during the cleanup does not fail the test.
    with tempfile.TemporaryDirectory(
        prefix="fjords-chromium-", ignore_cleanup_errors=True
    ) as profile:
        proc = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            port_file = Path(profile) / "DevToolsActivePort"

            def port_written() -> bool:
                assert proc.poll() is None, "chromium exited"
                return port_file.exists() and port_file.read_text().count("\n") >= 1

            await async_eventually(
                port_written, message="chromium opens its DevTools port", timeout=60
            )
            port = int(port_file.read_text().split()[0])
            async with aiohttp.ClientSession() as http:
                targets = await (await http.get(f"http://127.0.0.1:{port}/json/list")).json()
                page = next(t for t in targets if t["type"] == "page")
                async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                    yield DevTools(ws)
        finally:
            _stop_group(proc)


def _stop_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _start_daemon(tmp_path: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    config = tmp_path / "gateway.toml"
    config.write_text(f'[http]\nport = {port}\ntoken = "{TOKEN}"\n')
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "run", "--config", str(config)],
        cwd=ROOT,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg")},
    )
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc)
    return proc, url


@pytest.mark.slow
async def test_the_page_in_a_real_browser_lists_sensors_and_shows_rows_arriving(tmp_path) -> None:
    binary = require_binary("chromium", "chromium")
    gateway, url = _start_daemon(tmp_path)
    try:
        async with chromium(binary) as browser:
            await browser.call("Page.enable")
            await browser.call("Page.navigate", url=url + "/")
            await browser.wait_for(
                "document.readyState === 'complete' && !!document.querySelector('#sensors')"
            )
            # The gateway has a token: the page asks for it before it can show anything.
            await browser.wait_for(
                "getComputedStyle(document.querySelector('#tokenbox')).display !== 'none'"
            )
            await browser.js(
                f"document.querySelector('#token').value = {json.dumps(TOKEN)};"
                "document.querySelector('#settoken').click(); true"
            )
            n = await browser.wait_for("document.querySelectorAll('#sensors tbody tr').length")
            sensors = json.loads(
                urllib.request.urlopen(
                    urllib.request.Request(f"{url}/sensors", headers=AUTH), timeout=10
                ).read()
            )["sensors"]
            assert n >= 1 and sensors
            shown = await browser.js(
                "[...document.querySelectorAll('#sensors tbody tr')].map(r => r.dataset.id)"
            )
            assert set(shown) <= {s["id"] for s in sensors}
            assert await browser.wait_for("document.querySelectorAll('#programs tbody tr').length")
            # A query registered from the page itself, then watched: rows arrive over SSE.
            await browser.js(
                "document.querySelector('#newsql').value = 'SELECT station, speed FROM traffic';"
                "document.querySelector('#register').click(); true"
            )
            qid = await browser.wait_for(
                "(document.querySelector('#queries tbody tr') || {dataset: {}}).dataset.id"
            )
            await browser.js(
                f"document.querySelector('button.watch[data-id={json.dumps(qid)}]').click(); true"
            )
            await browser.wait_for("document.querySelectorAll('#live tbody tr').length > 0")
            header = await browser.js(
                "[...document.querySelectorAll('#live thead th')].map(t => t.textContent)"
            )
            assert header == ["station", "speed"]
            first = await browser.js("document.querySelector('#live tbody tr td').textContent")
            assert first.startswith("sim")
            assert await browser.js("document.querySelector('#error').textContent") == ""
            # An ad hoc question, answered once from the history; what the history holds.
            await browser.js(
                "document.querySelector('#snapsql').value = "
                "'SELECT COUNT(*) AS n FROM traffic';"
                "document.querySelector('#snapshot').click(); true"
            )
            await browser.wait_for("document.querySelectorAll('#snaprows tbody tr').length > 0")
            header = await browser.js(
                "[...document.querySelectorAll('#snaprows thead th')].map(t => t.textContent)"
            )
            assert header == ["n"]
            assert "rows over" in await browser.js(
                "document.querySelector('#snapstatus').textContent"
            )
            assert await browser.wait_for(
                "document.querySelector('#history').textContent.includes('traffic: ')"
            )
            assert await browser.js("document.querySelector('#error').textContent") == ""
            # A query's state and error (GET /queries/{id} carries them when it failed) are shown.
            text = await browser.js(
                "renderQueries([{id: 'qx', sql: 'SELECT 1', state: 'failed', error: 'spark died',"
                " columns: ['a'], operators: [], shared: [], rows: 0}], {queries: {}});"
                "document.querySelector('#queries tbody tr').innerText"
            )
            assert "failed" in text and "spark died" in text
            await _early_rows_and_levels(browser)
    finally:
        gateway.terminate()
        assert gateway.wait(timeout=20) == 0


# An EventSource the test feeds: the page's handling of rows, whatever the daemon's clock.
FAKE_SOURCE = """
window.fed = [];
window.EventSource = class {
  constructor(url) { this.url = url; window.fed.push(this); }
  addEventListener() {}
  close() {}
  feed(row) { this.onmessage({data: JSON.stringify(row)}); }
};
true
"""


async def _early_rows_and_levels(browser: DevTools) -> None:
    """EMIT CHANGES rows: early ones marked with their as_of, the final row replacing the
    early ones of its window and group; a ROLLUP's rolled-up NULLs shown as the level "all"."""
    await browser.js(FAKE_SOURCE)
    cols = ["segment", "avg_speed", "window_start", "window_end", "final", "as_of"]
    q = {
        "id": "qc",
        "sql": "SELECT segment, AVG(speed) AS avg_speed FROM traffic [RANGE 1 HOUR] "
        "GROUP BY segment EMIT CHANGES EVERY 10 MINUTES",
        "columns": cols,
    }
    rows = [
        {
            "segment": seg,
            "avg_speed": v,
            "window_start": 0,
            "window_end": 3600,
            "final": f,
            "as_of": a,
        }
        for seg, v, f, a in (
            ("S1", 40.0, False, 600),
            ("S2", 60.0, False, 600),
            ("S1", 45.0, False, 1200),
            ("S1", 50.0, True, 3600),
        )
    ]
    feed = "".join(f"window.fed.at(-1).feed({json.dumps(r)});" for r in rows)
    table = "[...document.querySelectorAll('#live tbody tr')].map(r => [r.className, r.innerText.split('\\t')])"
    shown = await browser.js(f"watch({json.dumps(q)}); {feed} {table}")
    assert [(cls, cells[0], cells[1], cells[4]) for cls, cells in shown] == [
        ("", "S1", "50", "final"),  # the early rows of S1's hour are gone
        ("early", "S2", "60", "early"),
    ]
    assert shown[1][1][5] == "1970-01-01 00:10:00Z"  # its as_of
    q = {
        "id": "qr",
        "sql": "SELECT segment, station, AVG(speed) AS a FROM traffic [RANGE 1 HOUR] "
        "GROUP BY ROLLUP(segment, station)",
        "columns": ["segment", "station", "a", "window_start", "window_end"],
    }
    total = {"segment": None, "station": None, "a": 50.0, "window_start": 0, "window_end": 3600}
    shown = await browser.js(
        f"watch({json.dumps(q)}); window.fed.at(-1).feed({json.dumps(total)}); {table}"
    )
    assert [cells[:3] for _, cells in shown] == [["all", "all", "50"]]


async def test_new_endpoints_match_the_document(tmp_path) -> None:
    from tests.gateway.test_openapi import call

    cfg = Config()
    cfg.http.port = 0
    async with Gateway(cfg) as gw:
        host, port = await gw.start_http()
        base = f"http://{host}:{port}"
        async with aiohttp.ClientSession() as http:
            await call(http, base, "POST", "/queries", {"sql": "SELECT station FROM traffic"})
            for path in ("/status", "/", "/docs", "/openapi.yaml"):
                assert (await call(http, base, "GET", path)).status_code == 200, path
