"""The HTTP API (aiohttp): register continuous queries and receive their results as they arrive.

Documented in gateway/openapi.yaml (tests validate responses against it). JSON everywhere; errors
are `{"error": ...}` with the right status. Results stream as Server-Sent Events (default), NDJSON
(`?format=ndjson`) or over a WebSocket (`/queries/{id}/ws`); a client that cannot keep up loses
its oldest rows and is told how many (`missed`), and never slows the Fjord or other clients.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any

from aiohttp import WSMsgType, web

from fjords.errors import QueryError, QuerySyntaxError, QueryTypeError
from gateway import metrics
from gateway.results import Subscription

if TYPE_CHECKING:
    from gateway.daemon import Gateway

log = logging.getLogger(__name__)

GATEWAY_KEY = web.AppKey("gateway", object)
MAX_BODY_KEY = web.AppKey("max_body", int)
MAX_BODY = 64 * 1024
KEEPALIVE_SECONDS = 15.0


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=lambda o: json.dumps(o, default=_default))


def _default(o: object) -> object:
    if isinstance(o, float | int):
        return o
    return str(o)


def _error(status: int, message: str, **extra: Any) -> web.Response:
    return _json({"error": message, **extra}, status=status)


def _gw(request: web.Request) -> Gateway:
    return request.app[GATEWAY_KEY]  # type: ignore[return-value]


@web.middleware
async def errors_and_auth(request: web.Request, handler: Any) -> web.StreamResponse:
    gw = _gw(request)
    if request.method in ("POST", "PUT", "PATCH", "DELETE") and gw.token:
        if request.headers.get("Authorization", "") != f"Bearer {gw.token}":
            return _error(401, "this gateway needs 'Authorization: Bearer <token>' for changes")
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge:
        return _error(413, f"request body too large (limit {request.app[MAX_BODY_KEY]} bytes)")
    except web.HTTPException as e:
        if e.status >= 400 and e.content_type != "application/json":
            return _error(e.status, e.reason)
        raise


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        data = await request.json()
    except json.JSONDecodeError as e:
        raise web.HTTPBadRequest(
            text=json.dumps(
                {"error": f"malformed JSON: {e.msg} at line {e.lineno}, column {e.colno}"}
            ),
            content_type="application/json",
        ) from None
    if not isinstance(data, dict):
        raise web.HTTPBadRequest(
            text=json.dumps({"error": "the body must be a JSON object"}),
            content_type="application/json",
        )
    return data


async def post_query(request: web.Request) -> web.Response:
    gw = _gw(request)
    body = await _body(request)
    sql = body.get("sql")
    if not isinstance(sql, str) or not sql.strip():
        return _error(400, "'sql' (a query text) is required")
    options = {k: body[k] for k in ("publish", "engine") if k in body}
    if options.get("publish") not in (None, "mqtt"):
        return _error(400, "'publish' may only be \"mqtt\"")
    if options.get("engine") not in (None, "fjords", "spark"):
        return _error(400, '\'engine\' must be "fjords" or "spark"')
    try:
        if body.get("dry_run"):
            return _json(await gw.explain_async(sql), status=200)
        qid = await gw.register(sql, options)
    except (QuerySyntaxError, QueryTypeError) as e:  # with the expression, line and column
        return _json(e.to_dict(), status=400)
    except QueryError as e:
        return _error(400, str(e))
    return _json(gw.describe_query(qid), status=201)


async def list_queries(request: web.Request) -> web.Response:
    gw = _gw(request)
    return _json({"queries": [gw.describe_query(qid) for qid in gw.query_ids()]})


def _query_id(request: web.Request) -> str:
    qid = request.match_info["id"]
    if not _gw(request).has_query(qid):
        raise web.HTTPNotFound(
            text=json.dumps({"error": f"no query with id {qid!r}"}), content_type="application/json"
        )
    return qid


async def get_query(request: web.Request) -> web.Response:
    return _json(_gw(request).describe_query(_query_id(request)))


async def delete_query(request: web.Request) -> web.Response:
    await _gw(request).end_query(_query_id(request))
    return web.Response(status=204)


async def results(request: web.Request) -> web.StreamResponse:
    gw = _gw(request)
    qid = _query_id(request)
    fmt = request.query.get("format", "sse")
    if fmt not in ("sse", "ndjson"):
        return _error(400, "format must be 'sse' or 'ndjson'")
    sub = gw.hub.subscribe(qid, _buffer(request))
    resp = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream" if fmt == "sse" else "application/x-ndjson",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    await resp.prepare(request)
    try:
        if fmt == "sse":
            await resp.write(b": connected\n\n")
        await _pump(sub, resp, fmt)
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        sub.close()
    return resp


def _buffer(request: web.Request) -> int | None:
    try:
        n = int(request.query.get("buffer", "0"))
    except ValueError:
        return None
    return min(n, 100_000) if n > 0 else None


async def _pump(sub: Subscription, resp: web.StreamResponse, fmt: str) -> None:
    while True:
        try:
            batch = await asyncio.wait_for(sub.next_batch(), KEEPALIVE_SECONDS)
        except TimeoutError:
            await resp.write(b": keep-alive\n\n" if fmt == "sse" else b"\n")
            continue
        if batch is None:  # the query was removed, or failed
            if sub.error is not None:
                error = json.dumps({"error": sub.error})
                await resp.write(
                    (f"event: error\ndata: {error}\n\n" if fmt == "sse" else error + "\n").encode()
                )
            if fmt == "sse":
                await resp.write(b"event: end\ndata: {}\n\n")
            return
        parts = []
        if batch.missed:
            missed = json.dumps({"missed": batch.missed})
            parts.append(f"event: missed\ndata: {missed}\n\n" if fmt == "sse" else missed + "\n")
        for row in batch.rows:
            text = json.dumps(row, default=_default)
            parts.append(f"data: {text}\n\n" if fmt == "sse" else text + "\n")
        await resp.write("".join(parts).encode())


async def results_ws(request: web.Request) -> web.WebSocketResponse:
    gw = _gw(request)
    qid = _query_id(request)
    ws = web.WebSocketResponse(heartbeat=30)
    await ws.prepare(request)
    sub = gw.hub.subscribe(qid, _buffer(request))

    async def reader() -> None:
        async for msg in ws:  # only to notice the client closing
            if msg.type in (WSMsgType.ERROR, WSMsgType.CLOSE):
                break
        sub.close()

    read_task = asyncio.create_task(reader())
    try:
        async for batch in sub:
            if batch.missed:
                await ws.send_json({"missed": batch.missed})
            for row in batch.rows:
                await ws.send_str(json.dumps(row, default=_default))
        if sub.error is not None:  # the query failed: say why before closing
            await ws.send_json({"error": sub.error})
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        sub.close()
        read_task.cancel()
        await asyncio.gather(read_task, return_exceptions=True)
        await ws.close()
    return ws


async def list_sensors(request: web.Request) -> web.Response:
    return _json({"sensors": _gw(request).sensors()})


async def get_sensor(request: web.Request) -> web.Response:
    sensor = _gw(request).sensor(request.match_info["id"])
    if sensor is None:
        return _error(404, f"no sensor with id {request.match_info['id']!r}")
    return _json(sensor)


async def list_tables(request: web.Request) -> web.Response:
    gw = _gw(request)
    tables = [
        {
            "name": t.name,
            "rows": len(t.rows),
            "columns": [{"name": f.name, "type": f.type} for f in t.schema.fields],
            "path": str(t.path) if t.path else None,
        }
        for t in gw.fjord.catalog.tables.values()
    ]
    return _json({"tables": tables})


async def get_metrics(request: web.Request) -> web.Response:
    gw = _gw(request)
    body = metrics.render(gw.fjord, gw.sensors, gw.hub_stats)
    return web.Response(
        body=body, content_type="text/plain", charset="utf-8", headers={"X-Format": "0.0.4"}
    )


async def healthz(request: web.Request) -> web.Response:
    gw = _gw(request)
    return _json(
        {"status": "ok", "queries": len(gw.fjord.queries), "streams": sorted(gw.fjord.streams)}
    )


def make_app(gateway: Gateway, max_body: int = MAX_BODY) -> web.Application:
    app = web.Application(middlewares=[errors_and_auth], client_max_size=max_body)
    app[GATEWAY_KEY] = gateway
    app[MAX_BODY_KEY] = max_body
    app.router.add_post("/queries", post_query)
    app.router.add_get("/queries", list_queries)
    app.router.add_get("/queries/{id}", get_query)
    app.router.add_delete("/queries/{id}", delete_query)
    app.router.add_get("/queries/{id}/results", results)
    app.router.add_get("/queries/{id}/ws", results_ws)
    app.router.add_get("/sensors", list_sensors)
    app.router.add_get("/sensors/{id}", get_sensor)
    app.router.add_get("/tables", list_tables)
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/healthz", healthz)
    return app
