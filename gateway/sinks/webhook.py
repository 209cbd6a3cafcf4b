"""HTTP webhook sink: result rows POSTed as JSON batches, retried with backoff.

Body: `{"query": id, "batch": n, "rows": [...], "dropped": k}`:
`batch` numbers the batches of this run (a retried batch keeps its number, so a receiver can
tell a repeat), `dropped` counts rows lost since the previous batch. A 2xx is delivered; a 4xx
other than 408 and 429 is a permanent refusal (the batch is dropped, `rejected`); anything else
(5xx, a timeout, a refused connection) is retried with capped exponential backoff (a
Retry-After is honoured within the cap), up to `max_attempts` (then `retries_exhausted`). While
it retries, rows wait in the sink's bounded queue (`queue_rows`; the oldest go first,
`queue_full`): the webhook never holds the Fjord back.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp

from gateway.results import Subscription
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


class WebhookSink(ResultSink):
    kind = "webhook"

    def __init__(
        self,
        query_id: str,
        spec: WebhookSinkSpec,
        sub: Subscription,
        settings: SinkSettings,
    ) -> None:
        super().__init__(query_id, spec, sub)
        self.spec: WebhookSinkSpec = spec
        self.settings = settings
        self.batches = 0
        self.attempts_failed = 0
        self._pending: tuple[list[dict[str, Any]], int] | None = None
        self._reported_dropped = 0

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.settings.webhook_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as http:
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
                async with http.post(
                    self.spec.url, data=body, headers={"Content-Type": "application/json"}
                ) as resp:
                    status = resp.status
                    retry_after = _seconds(resp.headers.get("Retry-After"))
                    await resp.read()
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                retry_after = None
                self.error(f"{type(e).__name__}: {e}"[:300])
            else:
                if 200 <= status < 300:
                    self.sent(len(rows))
                    self._reported_dropped = dropped_now
                    return True
                self.error(f"HTTP {status}")
                if 400 <= status < 500 and status not in RETRY_STATUSES:
                    level = logging.DEBUG if "rejected" in self.dropped else logging.WARNING
                    log.log(
                        level,
                        "webhook %s of query %s refused a batch (HTTP %d): %d rows dropped",
                        self.spec.url, self.query_id, status, len(rows),
                    )  # fmt: skip
                    self.drop("rejected", len(rows))
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
            async with aiohttp.ClientSession(timeout=timeout) as http:
                body = self._body(rows, self.batches + 1, 0)
                async with http.post(
                    self.spec.url, data=body, headers={"Content-Type": "application/json"}
                ) as resp:
                    if 200 <= resp.status < 300:
                        self.sent(len(rows))
                        return
                    self.error(f"HTTP {resp.status}")
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            self.error(f"{type(e).__name__}: {e}"[:300])
        self.drop("shutdown", len(rows))
