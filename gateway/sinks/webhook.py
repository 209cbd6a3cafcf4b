"""HTTP webhook sink: result rows POSTed as JSON batches, retried with backoff.

Body: `{"query": id, "batch": n, "rows": [...], "dropped": k}`:
`batch` numbers the batches of this run (a retried batch keeps its number, so a receiver can
tell a repeat), `dropped` counts rows lost since the previous batch. A 2xx is delivered; a 4xx
other than 408 and 429 is a permanent refusal (the batch is dropped, `rejected`); anything else
(5xx, a timeout, a refused connection) is retried with capped exponential backoff (a
Retry-After is honoured within the cap), up to `max_attempts` (then `retries_exhausted`). While
it retries, rows wait in the sink's bounded queue (`queue_rows`; the oldest go first,
`queue_full`): the webhook never holds the Fjord back.

Where it may connect is the address policy's call (gateway/sinks/address_policy.py), asked
again at connect time: the sink's own resolver refuses a name that now resolves to an address
the policy refuses, and its socket factory checks the very address each socket is about to
connect to (a literal, a cached answer), so nothing is connected between check and use. A
refusal drops the batch (`refused_by_policy`); a redirect is never followed (`redirect`).
`last_error` says "refused by policy" or "connection failed", never what a port answered.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import socket
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohappyeyeballs import AddrInfoType
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from gateway.results import Subscription
from gateway.sinks.address_policy import AddressPolicy, Refused, Target, redact_url
from gateway.sinks.base import ResultSink
from gateway.sinks.spec import SinkSettings, WebhookSinkSpec

log = logging.getLogger("gateway.sinks")

RETRY_STATUSES = frozenset({408, 429})


def _default(o: object) -> object:
    return str(o)


def _seconds(text: str | None) -> float | None:
    """A Retry-After in seconds (its HTTP-date form is ignored: the backoff applies)."""
    if text is None or not text.strip().isdigit():
        return None
    return float(text.strip())


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """A resolver's or a socket address's host (an IPv6 zone dropped)."""
    return ipaddress.ip_address(host.split("%", 1)[0])


class ConnectGuard:
    """The policy at connect time for one target: a resolver that passes on only the addresses
    of a name the policy allows (and refuses the name when none is), and a socket factory that
    refuses to create a socket for a refused address. `refused` holds the last refusal, so the
    sink can tell it from a failed connection."""

    def __init__(self, policy: AddressPolicy, target: Target, inner: AbstractResolver) -> None:
        self.policy = policy
        self.target = target
        self.inner = inner
        self.refused: str | None = None

    def check(self, host: str) -> None:
        self.refused = None
        try:
            self.policy.check_address(self.target, _address(host))
        except Refused as e:
            self.refused = str(e)
            raise OSError(self.refused) from None

    def socket(self, addr_info: AddrInfoType) -> socket.socket:
        family, type_, proto, _, address = addr_info
        self.check(str(address[0]))
        return socket.socket(family=family, type=type_, proto=proto)

    def resolver(self) -> AbstractResolver:
        guard = self

        class _Resolver(AbstractResolver):
            async def resolve(
                self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
            ) -> list[ResolveResult]:
                found = await guard.inner.resolve(host, port, family)
                try:  # only the allowed addresses are connected to
                    ok = guard.policy.allowed(guard.target, [_address(r["host"]) for r in found])
                except Refused as e:
                    guard.refused = str(e)
                    raise OSError(guard.refused) from None
                return [r for r in found if _address(r["host"]) in ok]

            async def close(self) -> None:
                await guard.inner.close()

        return _Resolver()


class WebhookSink(ResultSink):
    kind = "webhook"
    #: the resolver under the policy's (tests put a fake one here)
    make_resolver: Callable[[], AbstractResolver] = DefaultResolver

    def __init__(
        self,
        query_id: str,
        spec: WebhookSinkSpec,
        sub: Subscription,
        settings: SinkSettings,
        policy: AddressPolicy | None = None,
        on_refused: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(query_id, spec, sub)
        self.spec: WebhookSinkSpec = spec
        self.settings = settings
        self.policy = policy or AddressPolicy.from_entries(settings.webhook_hosts)
        self.target = self.policy.check_url(spec.url)  # checked before: Refused is a bug here
        self.shown_url = redact_url(spec.url)
        self.on_refused = on_refused
        self.batches = 0
        self.attempts_failed = 0
        self._pending: tuple[list[dict[str, Any]], int] | None = None
        self._reported_dropped = 0
        self._guard: ConnectGuard | None = None

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["url"] = self.shown_url
        return out

    def _session(self, timeout: aiohttp.ClientTimeout) -> aiohttp.ClientSession:
        """A session whose every connection the policy checked (no proxies from the
        environment, no redirects: `_post`)."""
        self._guard = guard = ConnectGuard(self.policy, self.target, type(self).make_resolver())
        connector = aiohttp.TCPConnector(resolver=guard.resolver(), socket_factory=guard.socket)
        return aiohttp.ClientSession(timeout=timeout, connector=connector, trust_env=False)

    def _post(self, http: aiohttp.ClientSession, body: bytes) -> Any:
        if self._guard is not None:
            self._guard.refused = None
        return http.post(
            self.target.url,
            data=body,
            headers={"Content-Type": "application/json"},
            allow_redirects=False,
        )

    def _failed(self, e: BaseException) -> bool:
        """Note why a POST failed; True when the policy refused the connection."""
        refused = self._guard.refused if self._guard is not None else None
        if refused is not None:
            self.error(refused)
            if self.on_refused is not None:
                self.on_refused()
            return True
        log.debug("webhook %s of query %s: %r", self.shown_url, self.query_id, e)
        self.error("connection failed")
        return False

    def _give_up(self, reason: str, n: int, why: str) -> None:
        level = logging.DEBUG if reason in self.dropped else logging.WARNING
        log.log(level, "webhook %s of query %s: %s: %d rows dropped", self.shown_url,
                self.query_id, why, n)  # fmt: skip
        self.drop(reason, n)

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.settings.webhook_timeout_s)
        async with self._session(timeout) as http:
            while True:
                if self._pending is None:
                    rows = await self.collect(self.spec.batch_rows, self.spec.batch_ms / 1000)
                    if rows is None:
                        return
                    self.batches += 1
                    self._pending = (rows, self.batches)
                await self._deliver(http, *self._pending)
                self._pending = None

    def _body(self, rows: list[dict[str, Any]], number: int, dropped: int) -> bytes:
        doc = {"query": self.query_id, "batch": number, "rows": rows, "dropped": dropped}
        return json.dumps(doc, default=_default).encode()

    async def _deliver(
        self, http: aiohttp.ClientSession, rows: list[dict[str, Any]], number: int
    ) -> bool:
        """POST one batch, retrying; True once delivered, False when it was dropped."""
        s = self.settings
        delay = s.webhook_backoff_initial_s
        dropped_now = sum(self.dropped.values())
        body = self._body(rows, number, dropped_now - self._reported_dropped)
        for attempt in range(1, s.webhook_max_attempts + 1):
            try:
                async with self._post(http, body) as resp:
                    status = resp.status
                    retry_after = _seconds(resp.headers.get("Retry-After"))
                    await resp.read()
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                retry_after = None
                if self._failed(e):
                    self._give_up("refused_by_policy", len(rows), self.last_error or "refused")
                    return False
            else:
                if 200 <= status < 300:
                    self.sent(len(rows))
                    self._reported_dropped = dropped_now
                    return True
                if 300 <= status < 400:
                    self.error(f"HTTP {status}: redirect not followed")
                    self._give_up("redirect", len(rows), f"HTTP {status}: redirect not followed")
                    return False
                self.error(f"HTTP {status}")
                if 400 <= status < 500 and status not in RETRY_STATUSES:
                    self._give_up("rejected", len(rows), f"refused a batch (HTTP {status})")
                    return False
            self.attempts_failed += 1
            if attempt < s.webhook_max_attempts:
                # A receiver's Retry-After (429, 503) is honoured, within the backoff's cap.
                await asyncio.sleep(min(max(delay, retry_after or 0.0), s.webhook_backoff_max_s))
                delay = min(delay * 2, s.webhook_backoff_max_s)
        self.drop("retries_exhausted", len(rows))
        return False

    async def close(self) -> None:
        """One last try for what is queued (bounded by the timeout); the rest is counted."""
        rows = (self._pending[0] if self._pending else []) + self.take_pending()
        self._pending = None
        if not rows:
            return
        timeout = aiohttp.ClientTimeout(total=min(2.0, self.settings.webhook_timeout_s))
        try:
            async with self._session(timeout) as http:
                body = self._body(rows, self.batches + 1, 0)
                async with self._post(http, body) as resp:
                    if 200 <= resp.status < 300:
                        self.sent(len(rows))
                        return
                    self.error(f"HTTP {resp.status}")
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            if self._failed(e):
                self.drop("refused_by_policy", len(rows))
                return
        self.drop("shutdown", len(rows))
