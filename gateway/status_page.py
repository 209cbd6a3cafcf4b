"""What an operator looks at: the status page (`/`), the API reference (`/docs`, rendered on the
server from gateway/openapi.yaml, no CDN) and the spec itself (`/openapi.yaml`).

These three are open (no token): they hold no data, only the page and the spec. Everything the
page shows comes from the JSON API (`/sensors`, `/queries`, `/status`, result streams), which
needs the token when `[http] token` is set: the page asks for it and keeps it in the browser's
sessionStorage.
"""

from __future__ import annotations

import html
import math
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

import yaml
from aiohttp import web

if TYPE_CHECKING:
    from gateway.daemon import Gateway

#: Served without a token (see the module docstring); http_api adds them to its open paths.
PAGE_PATHS = frozenset({"/", "/docs", "/openapi.yaml"})
METHODS = ("get", "post", "put", "patch", "delete")


def _text(name: str) -> str:
    return resources.files("gateway").joinpath(name).read_text(encoding="utf-8")


@cache
def _spec_text() -> str:
    return _text("openapi.yaml")


@cache
def _docs_html() -> str:
    return render_docs(yaml.safe_load(_spec_text()))


async def index(request: web.Request) -> web.Response:
    return web.Response(
        text=_text("static/status.html"),
        content_type="text/html",
        headers={"Cache-Control": "no-cache"},
    )


async def openapi_yaml(request: web.Request) -> web.Response:
    # YAML, as text/plain: browsers show it instead of downloading it
    return web.Response(text=_spec_text(), content_type="text/plain")


async def docs(request: web.Request) -> web.Response:
    return web.Response(text=_docs_html(), content_type="text/html")


def status(gateway: Gateway) -> dict[str, Any]:
    """Counters the status page needs beside /sensors and /queries: per-query drops (full
    queues, results the sink dropped, rows slow clients missed), per-stream intake, and each
    archive's writer (errors by reason, and why it cannot write now), and the gateway's id."""
    stats = gateway.fjord.stats()
    missed = gateway.hub.missed()
    queries = {
        qid: {**q, "client_missed": missed.get(qid, 0)} for qid, q in stats["queries"].items()
    }
    streams = {
        name: {
            k: (v if not isinstance(v, float) or math.isfinite(v) else None) for k, v in s.items()
        }
        for name, s in stats["streams"].items()
    }
    history = {name: h.stats() for name, h in getattr(gateway, "histories", {}).items()}
    archive = {name: a.status() for name, a in getattr(gateway, "archives", {}).items()}
    return {
        "gateway": getattr(gateway, "gateway_id", None),  # which gateway answers
        "health": gateway.health(),
        "queries": queries,
        "streams": streams,
        "history": history,
        "archive": archive,
    }


def render_docs(spec: dict[str, Any]) -> str:
    """The endpoints of an OpenAPI document as one plain HTML page (escaped throughout)."""
    e = html.escape
    info = spec.get("info", {})
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f"<title>{e(str(info.get('title', 'API')))} API</title>",
        "<style>body{font:14px system-ui,sans-serif;max-width:60em;margin:1em auto;padding:0 1em}"
        "code,pre{background:#f4f4f4;padding:0 .2em}pre{padding:.5em;white-space:pre-wrap}"
        ".m{display:inline-block;min-width:4.5em;font-weight:bold}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .5em;"
        "text-align:left}</style></head><body>",
        f"<h1>{e(str(info.get('title', 'API')))} <small>{e(str(info.get('version', '')))}</small>"
        "</h1><p><a href='/'>status page</a> · <a href='/openapi.yaml'>openapi.yaml</a></p>",
        f"<pre>{e(str(info.get('description', '')).strip())}</pre>",
        "<h2>Endpoints</h2><ul>",
    ]
    paths = spec.get("paths", {}) or {}
    for path, ops in paths.items():
        for method in METHODS:
            if method in (ops or {}):
                anchor = e(f"{method}-{path}", quote=True)
                summary = e(str(ops[method].get("summary", "")))
                parts.append(
                    f"<li><a href='#{anchor}'><span class=m>{method.upper()}</span>"
                    f"<code>{e(path)}</code></a> {summary}</li>"
                )
    parts.append("</ul>")
    for path, ops in paths.items():
        for method in METHODS:
            op = (ops or {}).get(method)
            if op is None:
                continue
            parts.append(
                f"<h3 id='{e(f'{method}-{path}', quote=True)}'><span class=m>{method.upper()}"
                f"</span><code>{e(path)}</code></h3>"
            )
            if op.get("summary"):
                parts.append(f"<p><b>{e(str(op['summary']))}</b></p>")
            if op.get("description"):
                parts.append(f"<pre>{e(str(op['description']).strip())}</pre>")
            params = [*(ops.get("parameters") or []), *(op.get("parameters") or [])]
            if params:
                parts.append("<table><tr><th>parameter</th><th>in</th><th>meaning</th></tr>")
                for p in params:
                    if "$ref" in p:
                        p = _ref(spec, p["$ref"])
                    parts.append(
                        f"<tr><td><code>{e(str(p.get('name', '')))}</code></td>"
                        f"<td>{e(str(p.get('in', '')))}</td>"
                        f"<td>{e(str(p.get('description', '')))}</td></tr>"
                    )
                parts.append("</table>")
            responses = op.get("responses") or {}
            if responses:
                parts.append("<table><tr><th>status</th><th>meaning</th></tr>")
                for code, r in responses.items():
                    if "$ref" in (r or {}):
                        r = _ref(spec, r["$ref"])
                    parts.append(
                        f"<tr><td>{e(str(code))}</td>"
                        f"<td>{e(str((r or {}).get('description', '')))}</td></tr>"
                    )
                parts.append("</table>")
    parts.append("</body></html>")
    return "".join(parts)


def _ref(spec: dict[str, Any], ref: str) -> dict[str, Any]:
    """A local `#/components/...` reference, or {} when it cannot be followed."""
    node: Any = spec
    for key in ref.removeprefix("#/").split("/"):
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}


def add_routes(app: web.Application, gateway_key: web.AppKey) -> None:
    """The page, the reference, the spec and `/status` (the last needs the token)."""

    async def get_status(request: web.Request) -> web.Response:
        return web.json_response(status(request.app[gateway_key]))

    app.router.add_get("/", index)
    app.router.add_get("/docs", docs)
    app.router.add_get("/openapi.yaml", openapi_yaml)
    app.router.add_get("/status", get_status)
