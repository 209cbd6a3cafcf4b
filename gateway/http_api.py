"""The HTTP API (aiohttp): register continuous queries and receive their results as they arrive.

Documented in gateway/openapi.yaml (tests validate responses against it). JSON everywhere; errors
are `{"error": ...}` with the right status, and no client input can make a 500. Results stream as
Server-Sent Events (default), NDJSON (`?format=ndjson`) or over a WebSocket (`/queries/{id}/ws`);
a client that cannot keep up loses its oldest rows and is told how many (`missed`), and never
slows the Fjord or other clients.

Security: with `[http] token`, every endpoint but /healthz and the pages (/, /docs,
/openapi.yaml: gateway/status_page.py; they hold no data, and the page's own calls need the
token) needs `Authorization: Bearer <token>` (or `read_token` for reads; `?token=` for browser streams, which cannot set headers). A request
from another web origin is refused unless listed in `allowed_origins`, and writes must be
`application/json`, which a web page cannot send cross-origin without a preflight: no CSRF.
Before any of that, gateway/http_guard.py bounds what a client may hold: connections, the time
its headers and body take, and its rate of writes.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from aiohttp import WSMsgType, web

from fjords.errors import (
    EngineFailed,
    QueryError,
    QueryPlanError,
    QuerySyntaxError,
    QueryTypeError,
)
from gateway import metrics
from gateway.http_guard import GuardSettings, HttpGuard
from gateway.request_bodies import (
    BadRequest,
    QueryRequest,
    SnapshotRequest,
    decode_body,
    epoch_seconds,
)
from gateway.results import Subscription, encode_row
from gateway.sinks.spec import to_builtins
from gateway.status_page import PAGE_PATHS
from gateway.status_page import add_routes as add_page_routes

if TYPE_CHECKING:
    from gateway.config import HttpConfig
    from gateway.daemon import Gateway

log = logging.getLogger(__name__)

GATEWAY_KEY = web.AppKey("gateway", object)
MAX_BODY_KEY = web.AppKey("max_body", int)
SECURITY_KEY = web.AppKey("security", object)
GUARD_KEY = web.AppKey("guard", HttpGuard)
MAX_BODY = 64 * 1024
MAX_CLIENT_BUFFER = 100_000
KEEPALIVE_SECONDS = 15.0
READ_METHODS = frozenset({"GET", "HEAD"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
#: POSTs that only read (a read-only token may send them)
READ_POSTS = frozenset({"/snapshot"})
STREAM_ROUTES = frozenset({"results", "results_ws"})  # may take ?token= (EventSource, WebSocket)
OPEN_PATHS = frozenset({"/healthz"}) | PAGE_PATHS  # the page and the spec hold no data


@dataclass(frozen=True)
class Security:
    """Who may call the API: tokens (bytes, compared in constant time) and browser origins."""

    token: bytes | None = None
    read_token: bytes | None = None
    allowed_origins: frozenset[str] = frozenset()

    @classmethod
    def from_config(cls, http: HttpConfig | None) -> Security:
        if http is None:
            return cls()
        return cls(
            token=http.token.encode() if http.token else None,
            read_token=http.read_token.encode() if http.read_token else None,
            allowed_origins=frozenset(_origin(o) for o in http.allowed_origins),
        )

    def role(self, given: bytes | None) -> Literal["write", "read"] | None:
        """What a presented token may do (both compared, in constant time)."""
        if given is None or self.token is None:
            return None
        write = hmac.compare_digest(given, self.token)
        read = self.read_token is not None and hmac.compare_digest(given, self.read_token)
        return "write" if write else "read" if read else None

    def origin_allowed(self, request: web.Request, origin: str) -> bool:
        """Listed (`*` lists every origin), or the request's own origin. Without a token, "own"
        needs a Host that is an address or localhost: a page on a name its attacker re-pointed
        at this gateway (DNS rebinding) is same-origin in name only."""
        o = _origin(origin)
        if o in self.allowed_origins or "*" in self.allowed_origins:
            return True
        if o != _origin(f"{request.scheme}://{request.host}"):
            return False
        return self.token is not None or _is_address(request.url.host or "")

    def listed(self, origin: str) -> bool:
        return _origin(origin) in self.allowed_origins or "*" in self.allowed_origins


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host.lower() in ("localhost", "localhost.")
    return True


def _origin(text: str) -> str:
    return text.strip().rstrip("/").lower()


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


def _security(request: web.Request) -> Security:
    return request.app[SECURITY_KEY]  # type: ignore[return-value]


@web.middleware
async def errors_and_auth(request: web.Request, handler: Any) -> web.StreamResponse:
    """Origin, token and content type first; then any failure becomes a JSON error, and an
    unexpected one is logged and a JSON 500 without internals."""
    try:
        if request.path not in OPEN_PATHS:
            refused = _guard(request)
            if refused is not None:
                return refused
        timed_out = await request.app[GUARD_KEY].read_body(request)
        if timed_out is not None:
            return timed_out
        return await handler(request)
    except BadRequest as e:
        return _error(e.status, str(e))
    except web.HTTPRequestEntityTooLarge:
        return _error(413, f"request body too large (limit {request.app[MAX_BODY_KEY]} bytes)")
    except web.HTTPException as e:
        if e.status >= 400 and e.content_type != "application/json":
            return _error(e.status, e.reason)
        raise
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception:
        log.exception("unexpected error answering %s %s", request.method, request.path)
        return _error(500, "internal error (logged by the gateway)")


def _guard(request: web.Request) -> web.StreamResponse | None:
    """The refusal of a request that may not go on, or None."""
    sec = _security(request)
    origin = request.headers.get("Origin")
    if origin is not None and not sec.origin_allowed(request, origin):
        return _error(403, f"origin {origin!r} is not allowed (see [http] allowed_origins)")
    if request.method == "OPTIONS" and origin is not None:
        return _preflight()
    if sec.token is not None:
        role = sec.role(_presented(request))
        if role == "read" and request.method not in READ_METHODS and request.path not in READ_POSTS:
            return _error(403, "this token is read-only; changes need the gateway's token")
        if role is None:
            resp = _error(
                401,
                "this gateway needs 'Authorization: Bearer <token>'"
                + (" (or ?token= on a result stream)" if _is_stream(request) else ""),
            )
            resp.headers["WWW-Authenticate"] = 'Bearer realm="fjords-gateway"'
            return resp
    if request.method in BODY_METHODS and request.content_type != "application/json":
        return _error(
            415, f"the body must be application/json, not {request.content_type or 'nothing'}"
        )
    return None


def _is_stream(request: web.Request) -> bool:
    route = request.match_info.route
    return route.name in STREAM_ROUTES and request.method in READ_METHODS


def _presented(request: web.Request) -> bytes | None:
    """The token the request carries: the Authorization header, or ?token= on a stream."""
    auth = request.headers.get("Authorization")
    if auth is not None:
        scheme, _, credentials = auth.strip().partition(" ")
        return _bytes(credentials.strip()) if scheme.lower() == "bearer" else b""
    if _is_stream(request) and "token" in request.query:
        return _bytes(request.query["token"])
    return None


def _bytes(text: str) -> bytes:
    """A header or parameter as bytes; undecodable input (kept as surrogates) cannot raise."""
    return text.encode("utf-8", "surrogateescape")


def _preflight() -> web.Response:
    """A CORS preflight from an allowed origin (answered before auth: browsers send none)."""
    return web.Response(
        status=204,
        headers={
            "Access-Control-Allow-Methods": "GET, POST, DELETE",
            "Access-Control-Allow-Headers": "Authorization, Content-Type",
            "Access-Control-Max-Age": "600",
        },
    )


async def _cors(request: web.Request, response: web.StreamResponse) -> None:
    """Lets a listed browser origin read the answer (streams included: set before prepare)."""
    origin = request.headers.get("Origin")
    if origin is not None and _security(request).listed(origin):
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Vary"] = "Origin"


async def post_query(request: web.Request) -> web.Response:
    gw = _gw(request)
    body = await decode_body(request, QueryRequest)
    sql = body.sql
    if not sql.strip():
        return _error(400, "'sql' (a query text) is required")
    if body.publish == "mqtt" and getattr(gw, "mqtt", None) is None:
        return _error(
            400, "publish: 'mqtt' needs a broker: this gateway has no [mqtt] section configured"
        )
    options = {k: v for k in ("publish", "engine") if (v := getattr(body, k)) is not None}
    try:
        if body.sinks:
            specs = gw.sinks.validate(body.sinks)
            await gw.sinks.check_resolved(specs)
            options["sinks"] = to_builtins(specs)
        if body.dry_run:
            return _json(await gw.explain_async(sql), status=200)
        qid = await gw.register(sql, options, since=epoch_seconds(body.since))
    except (QuerySyntaxError, QueryTypeError, QueryPlanError) as e:  # with line and column
        return _json(e.to_dict(), status=400)
    except QueryError as e:
        return _error(400, str(e))
    except RecursionError:
        return _error(400, "the query is nested too deeply")
    except (ValueError, OverflowError, ArithmeticError) as e:  # a planner bug's message: still 400
        log.info("query refused by a planning error: %r: %s", sql[:200], e)
        return _error(400, f"cannot plan this query: {e}")
    described = gw.describe_query(qid)
    # A Spark job starts in the background: 202, `state: starting`, GET /queries/{id} follows it.
    return _json(described, status=202 if described.get("state") == "starting" else 201)


async def post_snapshot(request: web.Request) -> web.Response:
    """A snapshot's answer at once (fjords.snapshot); a read, allowed to a read-only token."""
    body = await decode_body(request, SnapshotRequest)
    if not body.sql.strip():
        return _error(400, "'sql' (a query text) is required")
    try:
        gw = _gw(request)
        return _json(await gw.snapshot_async(body.sql, partial=body.partial, engine=body.engine))
    except (QuerySyntaxError, QueryTypeError, QueryPlanError) as e:
        return _json(e.to_dict(), status=400)
    except QueryError as e:
        return _error(400, str(e))
    except EngineFailed as e:
        return _error(502, str(e))
    except RecursionError:
        return _error(400, "the query is nested too deeply")


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
    fmt = request.query.get("format", "sse")
    if fmt not in ("sse", "ndjson"):
        return _error(400, "format must be 'sse' or 'ndjson'")
    buffer = _buffer(request)
    ids = _flag(request, "ids")
    qid = _query_id(request)
    # Rows come as JSON text, encoded by the hub once per query for all its HTTP clients.
    sub = gw.hub.subscribe(
        qid, buffer, encoded=True, notices=True, **_since(request, sse=fmt == "sse")
    )
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
        if sub.gone is not None:  # rows it asked for (?since=, Last-Event-ID) are not kept
            gone = json.dumps({"gone": sub.gone})
            await resp.write(
                (f"event: gone\ndata: {gone}\n\n" if fmt == "sse" else gone + "\n").encode()
            )
        await _pump(sub, resp, fmt, ids)
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        sub.close()
    return resp


def _buffer(request: web.Request) -> int | None:
    """?buffer=N: rows kept for this client (at most MAX_CLIENT_BUFFER); absent: the default."""
    text = request.query.get("buffer")
    if text is None:
        return None
    if not (text.isascii() and text.isdigit() and len(text) <= 12 and int(text) > 0):
        raise BadRequest(f"buffer must be a whole number of rows >= 1, got {text[:40]!r}")
    return min(int(text), MAX_CLIENT_BUFFER)


def _flag(request: web.Request, name: str) -> bool:
    text = request.query.get(name, "false").lower()
    if text not in ("true", "false", "1", "0"):
        raise BadRequest(f"{name} must be true or false, got {text[:40]!r}")
    return text in ("true", "1")


def _since(request: web.Request, *, sse: bool) -> dict[str, Any]:
    """?since=<row id> (digits) or ?since=<ISO-8601 time>; for SSE, `Last-Event-ID` (what a
    reconnecting EventSource sends) wins over ?since=. As `ResultHub.subscribe` keywords."""
    text = request.headers.get("Last-Event-ID") if sse else None
    if not text:
        text = request.query.get("since")
    if text is None or text == "":
        return {}
    text = text.strip()
    if text.isascii() and text.isdigit() and len(text) <= 18:
        return {"since_id": int(text)}
    try:
        from datetime import UTC, datetime

        t = datetime.fromisoformat(text)
        if t.tzinfo is None:
            t = t.replace(tzinfo=UTC)
        return {"since_time": t.timestamp()}
    except (ValueError, OverflowError, OSError):
        raise BadRequest(
            f"since must be a row id (digits) or an ISO-8601 time, got {text[:40]!r}"
        ) from None


async def _pump(sub: Subscription, resp: web.StreamResponse, fmt: str, ids: bool = False) -> None:
    """Write each batch as soon as the hub has it: the rows the Fjord published in one batch are
    one write, with no timer in between (`asyncio.timeout` runs in this task, where `wait_for`
    would start another and cost a wake-up of each)."""
    while True:
        try:
            async with asyncio.timeout(KEEPALIVE_SECONDS):
                batch = await sub.next_batch()
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
        for notice in batch.notices:
            event, text = _notice(notice)
            parts.append(f"event: {event}\ndata: {text}\n\n" if fmt == "sse" else text + "\n")
        if batch.missed:
            missed = json.dumps({"missed": batch.missed})
            parts.append(f"event: missed\ndata: {missed}\n\n" if fmt == "sse" else missed + "\n")
        first = batch.first_id
        texts = batch.rows if sub.encoded else [encode_row(r) for r in batch.rows]
        for i, text in enumerate(texts):
            if fmt == "sse":
                parts.append(
                    f"id: {first + i}\ndata: {text}\n\n"
                    if first is not None
                    else f"data: {text}\n\n"
                )
            else:
                parts.append(_with_id(text, first, i, ids) + "\n")
        await resp.write("".join(parts).encode())


def _notice(notice: dict[str, Any]) -> tuple[str, str]:
    """A query's notice as its SSE event name and JSON text: `{"error": reason, "restarting":
    true}` when it went down, `{"restarted": {"restarts": n}}` when it runs again (NDJSON and
    WebSocket clients get the same objects as lines and messages)."""
    data = {k: v for k, v in notice.items() if k != "event"}
    event = str(notice["event"])
    return event, json.dumps(data if event == "error" else {event: data}, default=_default)


def _with_id(text: str, first: int | None, i: int, ids: bool) -> str:
    """A row's JSON; with ?ids=true `{"id": n, "row": {...}}` (NDJSON and WebSocket clients
    need the id for ?since=)."""
    return f'{{"id": {first + i}, "row": {text}}}' if ids and first is not None else text


async def results_ws(request: web.Request) -> web.WebSocketResponse:
    gw = _gw(request)
    buffer = _buffer(request)
    ids = _flag(request, "ids")
    since = _since(request, sse=False)
    qid = _query_id(request)
    ws = web.WebSocketResponse(heartbeat=30)
    await ws.prepare(request)
    sub = gw.hub.subscribe(qid, buffer, notices=True, **since)
    if sub.gone is not None:
        await ws.send_json({"gone": sub.gone})

    async def reader() -> None:
        async for msg in ws:  # only to notice the client closing
            if msg.type in (WSMsgType.ERROR, WSMsgType.CLOSE):
                break
        sub.close()

    read_task = asyncio.create_task(reader())
    try:
        async for batch in sub:
            for notice in batch.notices:
                await ws.send_str(_notice(notice)[1])
            if batch.missed:
                await ws.send_json({"missed": batch.missed})
            for i, row in enumerate(batch.rows):
                await ws.send_str(
                    _with_id(json.dumps(row, default=_default), batch.first_id, i, ids)
                )
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


#: what ?status= may ask for on GET /sensors
SENSOR_STATUSES = ("online", "asleep", "stalled", "offline")


async def list_sensors(request: web.Request) -> web.Response:
    """One page of the catalog, by id (`?limit=`, default `DEFAULT_PAGE`; `?offset=`;
    `?status=`), with `total` and `next` (the next page's path, null on the last): a catalog
    of thousands of sensors is never rendered in one answer."""
    from gateway.sensors_view import DEFAULT_PAGE, MAX_PAGE

    gw = _gw(request)
    limit = _whole(request, "limit", DEFAULT_PAGE, low=1, high=MAX_PAGE)
    offset = _whole(request, "offset", 0, low=0, high=10**12)
    status = request.query.get("status") or None
    if status is not None and status not in SENSOR_STATUSES:
        raise BadRequest(f"status must be one of {', '.join(SENSOR_STATUSES)}, got {status[:40]!r}")
    page, total = gw.sensors_page(limit=limit, offset=offset, status=status)
    after = offset + len(page)
    more = f"&status={status}" if status else ""
    return _json(
        {
            "sensors": page,
            "total": total,
            "limit": limit,
            "offset": offset,
            "next": f"/sensors?limit={limit}&offset={after}{more}" if after < total else None,
        }
    )


def _whole(request: web.Request, name: str, default: int, *, low: int, high: int) -> int:
    """?name=N, a whole number from `low` to `high` (a 400 otherwise)."""
    text = request.query.get(name)
    if text is None or text == "":
        return default
    if not (text.isascii() and text.isdigit() and len(text) <= 13 and low <= int(text) <= high):
        raise BadRequest(f"{name} must be a whole number from {low} to {high}, got {text[:40]!r}")
    return int(text)


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
    archive = getattr(gw, "archive_history", None)
    body = metrics.render(
        gw.fjord,
        gw.sensors,
        gw.hub_stats,
        gw.drop_watch.counts,
        getattr(gw, "histories", None),
        unreadable=None if archive is None else archive.unreadable_counts(),
        webhook_refused=gw.sinks.refused,
        archives={name: a.status() for name, a in getattr(gw, "archives", {}).items()},
        http=request.app[GUARD_KEY].stats,
        compaction=getattr(gw, "compaction_stats", None),
        spark=gw.registry.spark_statuses() if hasattr(gw, "registry") else None,
    )
    return web.Response(
        body=body, content_type="text/plain", charset="utf-8", headers={"X-Format": "0.0.4"}
    )


async def healthz(request: web.Request) -> web.Response:
    """Liveness: always 200 while the daemon serves; `degraded` with the reasons while a
    transport or background task is down (so probes do not restart a daemon that is healing)."""
    gw = _gw(request)
    return _json(
        {**gw.health(), "queries": len(gw.fjord.queries), "streams": sorted(gw.fjord.streams)}
    )


def make_app(
    gateway: Gateway, max_body: int = MAX_BODY, http: HttpConfig | None = None
) -> web.Application:
    """The API of `gateway`; tokens and origins from `http` (default: the gateway's [http])."""
    if http is None:
        config = getattr(gateway, "config", None)
        http = getattr(config, "http", None)
    guard = HttpGuard(GuardSettings.from_config(http))
    # The guard first: a write over its client's rate is refused before anything else runs.
    app = web.Application(middlewares=[guard.middleware, errors_and_auth], client_max_size=max_body)
    app[GATEWAY_KEY] = gateway
    app[GUARD_KEY] = guard
    app[MAX_BODY_KEY] = max_body
    app[SECURITY_KEY] = Security.from_config(http)
    app.on_response_prepare.append(_cors)
    app.router.add_post("/queries", post_query)
    app.router.add_post("/snapshot", post_snapshot)
    app.router.add_get("/queries", list_queries)
    app.router.add_get("/queries/{id}", get_query)
    app.router.add_delete("/queries/{id}", delete_query)
    app.router.add_get("/queries/{id}/results", results, name="results")
    app.router.add_get("/queries/{id}/ws", results_ws, name="results_ws")
    app.router.add_get("/sensors", list_sensors)
    app.router.add_get("/sensors/{id}", get_sensor)
    app.router.add_get("/tables", list_tables)
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/healthz", healthz)
    add_page_routes(app, GATEWAY_KEY)
    return app
