"""What a client may hold of the HTTP API before it has said anything: sockets and time.

aiohttp's server has no header or body timeout and no connection cap (only an idle keep-alive
timer, an hour by default), so without this a client that opens connections and sends nothing,
or a byte now and then (slowloris), holds a file descriptor each until the daemon runs out and
`/healthz`, POSTs and the archive fail with EMFILE. `HttpGuard` bounds that, from `[http]`:

- each connection is admitted against `max_connections` overall and
  `max_connections_per_client` per client address; past a cap it gets a plain 503 and is
  closed (counted). At the overall cap a connection idle without a request (a half-open one,
  say: of the client holding the most connections, the oldest) is closed to make room rather
  than refusing a newcomer, so holding sockets without sending requests cannot lock out a real
  client. Result streams count against the caps but are never closed to make room;
- a request's headers must arrive within `header_timeout_s` of the connection opening or of the
  first byte after the previous response, and its body within `body_timeout_s` (408, closed);
  an idle keep-alive connection is closed after `keepalive_timeout_s` (aiohttp's own timer), and
  after `max_requests_per_connection` requests the answer says `Connection: close`;
- writes (every method but GET, HEAD and OPTIONS) take a token from their client address's
  bucket (`write_rate_per_s`, `write_burst`); without one the answer is 429 with Retry-After.
  Reads and result streams are not limited.

The connection side wraps aiohttp's protocol (`protocol_factory`), the request side is a
middleware (`middleware`); the counting and the buckets are plain state (`ConnectionCounts`,
`TokenBuckets`). Behind a reverse proxy every client has the proxy's address: set the caps for
the proxy, or let it do this.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import json
import logging
import math
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from gateway.config import Config, HttpConfig

log = logging.getLogger("gateway.http")

#: refused connections kept open at once to deliver their 503 (the rest are closed at once)
MAX_REFUSING = 32
#: how long a refused connection waits for its request before it is closed (reading the request
#: first makes the close a FIN the client reads the 503 before, not a reset that loses it)
REFUSE_LINGER_S = 1.0
#: client addresses whose buckets are remembered; past it the full (idle) ones are forgotten
MAX_BUCKETS = 10_000
#: connections the kernel may hand over at once (the listen backlog). asyncio accepts up to this
#: many in one turn of the event loop, sets them up in the next, admits or refuses them in the
#: one after, and a closed one releases its descriptor a turn later: at most three times this
#: many are in transit
BACKLOG = 128
#: file descriptors the daemon needs besides the HTTP connections (archive segments, the query
#: store, MQTT, serial ports, Spark, logs): the start-up check wants this much headroom
FD_HEADROOM = 256

WRITE_EXEMPT = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True)
class GuardSettings:
    """`[http]`'s limits on connections and writes (HttpConfig, key for key)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keepalive_timeout_s: float = 75.0
    max_requests_per_connection: int = 1000
    max_connections: int = 256
    max_connections_per_client: int = 32
    write_rate_per_s: float = 20.0  # 0: writes are not limited
    write_burst: int = 100

    @classmethod
    def from_config(cls, http: HttpConfig | None) -> GuardSettings:
        if http is None:
            return cls()
        return cls(
            header_timeout_s=http.header_timeout_s,
            body_timeout_s=http.body_timeout_s,
            keepalive_timeout_s=http.keepalive_timeout_s,
            max_requests_per_connection=http.max_requests_per_connection,
            max_connections=http.max_connections,
            max_connections_per_client=http.max_connections_per_client,
            write_rate_per_s=http.write_rate_per_s,
            write_burst=http.write_burst,
        )

    def server_args(self) -> dict[str, Any]:
        """aiohttp's own settings (`web.AppRunner` keywords): the idle keep-alive timer."""
        return {"keepalive_timeout": self.keepalive_timeout_s}


class TokenBuckets:
    """One token bucket per key: `rate` tokens a second up to `burst`; a write takes one.
    Buckets that have filled up again are forgotten when there are more than `max_keys`."""

    def __init__(self, rate: float, burst: int, max_keys: int = MAX_BUCKETS) -> None:
        self.rate, self.burst, self.max_keys = rate, burst, max_keys
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, when)

    def take(self, key: str, now: float) -> float:
        """0.0 when `key` may write now (a token is taken), else the seconds until it may."""
        if self.rate <= 0:
            return 0.0
        tokens, when = self._buckets.get(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - when) * self.rate)
        if tokens >= 1.0:
            self._buckets[key] = (tokens - 1.0, now)
            if len(self._buckets) > self.max_keys:
                self._forget_full(now)
            return 0.0
        self._buckets[key] = (tokens, now)
        return (1.0 - tokens) / self.rate

    def _forget_full(self, now: float) -> None:
        """Forget the buckets that are full again (their clients went quiet); if that is not
        enough (a flood from many addresses), the oldest down to half of `max_keys`: those
        clients start again with a full burst, which is what forgetting costs."""
        full = self.burst / self.rate
        for key, (tokens, when) in list(self._buckets.items()):
            if tokens + (now - when) * self.rate >= self.burst or now - when >= full:
                del self._buckets[key]
        excess = len(self._buckets) - self.max_keys // 2
        if len(self._buckets) > self.max_keys and excess > 0:
            for key in list(itertools.islice(self._buckets, excess)):
                del self._buckets[key]

    def __len__(self) -> int:
        return len(self._buckets)


class ConnectionCounts:
    """Open connections overall and per client address, against their caps."""

    def __init__(self, total_cap: int, per_client_cap: int) -> None:
        self.total_cap, self.per_client_cap = total_cap, per_client_cap
        self.total = 0
        self.by_client: dict[str, int] = {}

    def refusal(self, client: str) -> str | None:
        """Why a new connection from `client` may not open now (a cap's key), or None."""
        if self.by_client.get(client, 0) >= self.per_client_cap:
            return "max_connections_per_client"
        if self.total >= self.total_cap:
            return "max_connections"
        return None

    def open(self, client: str) -> None:
        self.total += 1
        self.by_client[client] = self.by_client.get(client, 0) + 1

    def close(self, client: str) -> None:
        self.total -= 1
        n = self.by_client[client] - 1
        if n:
            self.by_client[client] = n
        else:
            del self.by_client[client]


@dataclass
class HttpStats:
    """What `/metrics` shows of the guard (gateway/metrics.py)."""

    connections: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # connections, by the cap's key
    closed: dict[str, int] = field(default_factory=dict)  # connections the guard closed, by why
    requests_refused: dict[str, int] = field(default_factory=dict)  # requests, by why


class _Notices:
    """A WARNING the first time something is refused, then at most one a minute per kind."""

    def __init__(self, every_s: float = 60.0) -> None:
        self.every_s = every_s
        self._last: dict[str, float] = {}

    def __call__(self, kind: str, message: str, *args: object) -> None:
        now = time.monotonic()
        last = self._last.get(kind)
        if last is None or now - last >= self.every_s:
            self._last[kind] = now
            log.warning(message + " (logged at most once a minute)", *args)


def client_key(peername: Any) -> str:
    """A connection's client address as the caps and buckets count it: an IPv4 address (also
    mapped into IPv6), or an IPv6 /64 (one host or site has a whole /64 to pick from); a Unix
    socket has none: all its clients are one."""
    if not isinstance(peername, tuple) or not peername:
        return "local"
    host = str(peername[0])
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return str(addr.ipv4_mapped)
        return str(ipaddress.IPv6Network((addr, 64), strict=False))
    return str(addr)


class HttpGuard:
    """The caps, timeouts and buckets of one HTTP server; see the module docstring."""

    def __init__(
        self, settings: GuardSettings | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = s = settings or GuardSettings()
        self.clock = clock
        self.counts = ConnectionCounts(s.max_connections, s.max_connections_per_client)
        self.buckets = TokenBuckets(s.write_rate_per_s, s.write_burst)
        self.stats = HttpStats()
        #: admitted connections not in a request, oldest first: the ones closed to make room
        self.idle: dict[GuardedConnection, float] = {}
        #: aiohttp's protocol of each admitted connection -> its guard (what a request finds)
        self.by_handler: dict[object, GuardedConnection] = {}
        self.refusing = 0
        self.notice = _Notices()

    # -- connections -------------------------------------------------------------------------
    def protocol_factory(self, server: Callable[[], asyncio.Protocol]) -> Callable[[], Any]:
        """What `loop.create_server` takes: aiohttp's `server` behind the guard."""
        return lambda: GuardedConnection(self, server)

    def admit(self, client: str) -> str | None:
        """Count a new connection from `client` in, or return why it is refused. At the overall
        cap an idle connection (`_victim`) is closed to make room."""
        reason = self.counts.refusal(client)
        victim = self._victim() if reason == "max_connections" else None
        if victim is not None:
            victim.close("evicted")
            reason = self.counts.refusal(client)
        if reason is not None:
            self.stats.refused[reason] = self.stats.refused.get(reason, 0) + 1
            self.notice(
                reason,
                "HTTP connection from %s refused: [http] %s reached; counted in "
                "fjords_http_connections_refused_total{reason=%r}",
                client,
                reason,
                reason,
            )
            return reason
        self.counts.open(client)
        self.stats.connections = self.counts.total
        return None

    def _victim(self) -> GuardedConnection | None:
        """The idle connection to close for a new one: of the client holding the most
        connections (a flood's, not a real client's one or two), the one idle longest; not one
        whose last answer is still being sent."""
        held = self.counts.by_client
        best, most = None, 0
        for conn in self.idle:  # oldest first: a tie keeps the oldest
            n = held.get(conn.client, 0)
            if n > most and not conn.sending():
                best, most = conn, n
        return best

    def closed(self, conn: GuardedConnection, reason: str | None) -> None:
        """An admitted connection is gone (`reason`: why the guard closed it, if it did)."""
        self.counts.close(conn.client)
        self.stats.connections = self.counts.total
        self.idle.pop(conn, None)
        if conn.handler is not None:
            self.by_handler.pop(conn.handler, None)
        if reason is not None:
            self.stats.closed[reason] = self.stats.closed.get(reason, 0) + 1
            self.notice(
                reason,
                "HTTP connection from %s closed: %s; counted in "
                "fjords_http_connections_closed_total{reason=%r}",
                conn.client,
                _CLOSED_WHY.get(reason, reason),
                reason,
            )

    # -- requests ----------------------------------------------------------------------------
    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Marks the connection busy (no header timer, not closed to make room), rate-limits
        writes, and ends keep-alive after `max_requests_per_connection`. The outermost
        middleware: a refused write costs no more than this."""
        conn = self.by_handler.get(request.protocol)
        if conn is not None:
            conn.request_started()
        try:
            if request.method not in WRITE_EXEMPT:
                client = conn.client if conn is not None else client_key((request.remote,))
                wait = self.buckets.take(client, self.clock())
                if wait > 0:
                    return self._rate_limited(client, wait)
            response = await handler(request)
            if conn is not None and conn.requests >= self.settings.max_requests_per_connection:
                response.force_close()
            return response
        finally:
            if conn is not None:
                conn.request_done()

    def _rate_limited(self, client: str, wait: float) -> web.Response:
        n = self.stats.requests_refused.get("rate_limited", 0) + 1
        self.stats.requests_refused["rate_limited"] = n
        s = self.settings
        self.notice(
            "rate_limited",
            "HTTP writes from %s refused (429): more than [http] write_rate_per_s = %g "
            "(write_burst = %d); counted in fjords_http_requests_refused_total"
            "{reason='rate_limited'}",
            client,
            s.write_rate_per_s,
            s.write_burst,
        )
        retry = max(1, math.ceil(wait))
        return web.json_response(
            {
                "error": f"too many writes from {client}: at most {s.write_rate_per_s:g} a second "
                f"(bursts of {s.write_burst}); retry after {retry} s"
            },
            status=429,
            headers={"Retry-After": str(retry)},
        )

    async def read_body(self, request: web.Request) -> web.StreamResponse | None:
        """Read the body now (handlers get it from aiohttp's cache), within body_timeout_s; a
        body that takes longer is answered here (408, returned) and its connection closed.
        Called once the request may go on (the API's auth passed): a body too large raises
        aiohttp's 413 as a handler's read would."""
        if not request.body_exists:
            return None
        try:
            async with asyncio.timeout(self.settings.body_timeout_s):
                await request.read()
        except TimeoutError:
            pass
        else:
            return None
        conn = self.by_handler.get(request.protocol)
        if conn is not None:
            conn.reason = "body_timeout"
        else:
            self.stats.closed["body_timeout"] = self.stats.closed.get("body_timeout", 0) + 1
        response = web.json_response(
            {"error": f"the request body took longer than {self.settings.body_timeout_s:g} s"},
            status=408,
        )
        response.force_close()
        # Answered here, then closed: aiohttp would otherwise keep reading the slow body.
        await response.prepare(request)
        await response.write_eof()
        if request.transport is not None:
            request.transport.close()
        return response


_CLOSED_WHY = {
    "header_timeout": "no complete request headers within [http] header_timeout_s",
    "body_timeout": "the request body did not arrive within [http] body_timeout_s",
    "evicted": "idle at [http] max_connections, closed to make room for a new connection",
}

_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
)
_TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
)


def _answer(template: bytes, message: str) -> bytes:
    body = json.dumps({"error": message}).encode()
    return template % (len(body), body)


class GuardedConnection(asyncio.Protocol):
    """One TCP connection: admitted (then aiohttp's protocol does the HTTP, with a header
    timer around it), or refused with a 503 written before any of it is read."""

    def __init__(self, guard: HttpGuard, server: Callable[[], asyncio.Protocol]) -> None:
        self.guard = guard
        self.server = server
        self.handler: asyncio.Protocol | None = None  # aiohttp's, once admitted
        self.transport: asyncio.Transport | None = None
        self.client = ""
        self.requests = 0
        self.busy = False
        self.reason: str | None = None  # why the guard closed it, if it did
        self._timer: asyncio.TimerHandle | None = None
        self._refused = False
        self._lingering = False  # refused, and counted in `guard.refusing` until closed
        self._gone = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.client = client_key(transport.get_extra_info("peername"))
        g = self.guard
        reason = g.admit(self.client)
        if reason is not None:
            self._refuse(transport, reason)
            return
        self.handler = self.server()
        g.by_handler[self.handler] = self
        g.idle[self] = g.clock()
        self._arm()
        self.handler.connection_made(transport)

    def _refuse(self, transport: asyncio.Transport, reason: str) -> None:
        self._refused = True
        transport.write(_answer(_REFUSED, f"too many connections ([http] {reason})"))
        g = self.guard
        if g.refusing >= MAX_REFUSING:  # a flood: closed at once, its request unread
            transport.close()
            return
        g.refusing += 1
        self._lingering = True
        self._timer = asyncio.get_running_loop().call_later(REFUSE_LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            if self.transport is not None:
                self.transport.close()
            return
        if not self.busy and self._timer is None:  # the first byte of the next request
            self._arm()
        assert self.handler is not None
        self.handler.data_received(data)

    def eof_received(self) -> bool | None:
        if self.handler is None:
            return None
        return self.handler.eof_received()

    def pause_writing(self) -> None:
        if self.handler is not None:
            self.handler.pause_writing()

    def resume_writing(self) -> None:
        if self.handler is not None:
            self.handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._refused:
            if self._lingering:
                self._lingering = False
                self.guard.refusing -= 1
            return
        if not self._gone:
            self._gone = True
            self.guard.closed(self, self.reason)
        if self.handler is not None:
            self.handler.connection_lost(exc)

    # -- the header timer, and the requests (called by HttpGuard.middleware) -----------------
    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.guard.settings.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _headers_late(self) -> None:
        self._timer = None
        if self.busy or self.transport is None:
            return
        timeout = self.guard.settings.header_timeout_s
        self.transport.write(
            _answer(
                _TIMED_OUT, f"no complete request within {timeout:g} s ([http] header_timeout_s)"
            )
        )
        self.close("header_timeout")

    def close(self, reason: str) -> None:
        """Closed by the guard (counted now: its slot is free at once)."""
        if self._gone or self.transport is None:
            return
        self._gone = True
        self._disarm()
        self.guard.closed(self, reason)
        self.transport.close()

    def sending(self) -> bool:
        """Whether an answer is still on its way out (a large one, to a slow reader)."""
        return self.transport is not None and self.transport.get_write_buffer_size() > 0

    def request_started(self) -> None:
        self.busy = True
        self.requests += 1
        self._disarm()
        self.guard.idle.pop(self, None)

    def request_done(self) -> None:
        self.busy = False
        if not self._gone:
            self.guard.idle[self] = self.guard.clock()


def check_fd_limit(config: Config) -> tuple[int, int]:
    """Raise this process's soft RLIMIT_NOFILE towards what `[http]`'s caps need (up to the
    hard limit) and warn when even that is too low. Returns (soft limit, needed)."""
    h = config.http
    needed = h.max_connections + MAX_REFUSING + 3 * BACKLOG + FD_HEADROOM + 2 * len(config.serial)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
        if target > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
            except (ValueError, OSError) as e:
                log.warning("could not raise the open-files limit to %d: %s", target, e)
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning(
            "the open-files limit is %d, lower than [http] max_connections = %d plus %d for "
            "connections being refused or accepted, the archive, MQTT and serial ports: under a connection flood the daemon "
            "may fail with EMFILE. Raise LimitNOFILE= in its systemd unit (or ulimit -n) to at "
            "least %d, or lower max_connections",
            soft,
            h.max_connections,
            needed - h.max_connections,
            needed,
        )
    return soft, needed


class GuardedSite(web.TCPSite):
    """aiohttp's TCP site with every connection behind `guard` (TCPSite.start, the server
    wrapped in `HttpGuard.protocol_factory`)."""

    __slots__ = ("_guard",)

    def __init__(self, guard: HttpGuard, runner: web.BaseRunner, host: str, port: int) -> None:
        super().__init__(runner, host, port, backlog=BACKLOG)
        self._guard = guard

    async def start(self) -> None:
        await super(web.TCPSite, self).start()  # BaseSite's: registers the site
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self._guard.protocol_factory(server),
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
