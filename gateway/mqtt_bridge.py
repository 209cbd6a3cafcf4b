"""The MQTT bridge: results of queries registered with `"publish": "mqtt"` go to
`{prefix}/results/{query_id}` as JSON rows, and (optionally) Home Assistant discovers them.

The bridge is one more subscriber of the result hub, with its own bounded buffer: a broker that is
down or slow loses the oldest rows (counted), never blocks the Fjord. It keeps one session open,
reconnecting with exponential backoff. The gateway's availability is a retained
`{prefix}/gateway/status` (`online`, and `offline` as the session's last will), which Home
Assistant's discovery configs point at, so entities go unavailable when the gateway dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import aiomqtt

from gateway.config import MqttConfig
from gateway.results import Subscription

if TYPE_CHECKING:
    from gateway.daemon import Gateway

log = logging.getLogger("gateway.mqtt")


def broker_address(url: str) -> tuple[str, int, bool]:
    """host, port, tls from mqtt://host:port or mqtts://host:port."""
    u = urlparse(url if "://" in url else f"mqtt://{url}")
    if u.scheme not in ("mqtt", "mqtts", "tcp", "ssl"):
        raise ValueError(f"unsupported MQTT URL scheme {u.scheme!r} (use mqtt:// or mqtts://)")
    tls = u.scheme in ("mqtts", "ssl")
    return u.hostname or "127.0.0.1", u.port or (8883 if tls else 1883), tls


class MqttBridge:
    def __init__(self, gateway: Gateway, config: MqttConfig, *, buffer: int = 10_000) -> None:
        self.gw = gateway
        self.config = config
        self.prefix = config.topic_prefix.rstrip("/")
        self.host, self.port, tls = broker_address(config.url)
        self.tls = tls or config.tls
        self.buffer = buffer
        self.status_topic = f"{self.prefix}/gateway/status"
        self._subs: dict[str, Subscription] = {}
        self._wake = asyncio.Event()
        self.published = 0
        self.connects = 0
        self.missed = 0
        self._failures: list[tuple[str, str]] = []  # (query id, error) to publish once

    def query_failed(self, query_id: str, error: str) -> None:
        """A published query failed: its result topic gets `{"error": ...}` (then no more rows)."""
        self._failures.append((query_id, error))
        self._wake.set()

    def results_topic(self, query_id: str) -> str:
        return f"{self.prefix}/results/{query_id}"

    def sync_queries(self) -> None:
        """Follow the gateway's queries: subscribe to those that publish to MQTT, drop the rest."""
        wanted = {qid for qid, opts in self.gw.options.items() if opts.get("publish") == "mqtt"}
        for qid in list(self._subs):
            if qid not in wanted:
                self._subs.pop(qid).close()
        for qid in wanted - set(self._subs):
            self._subs[qid] = self.gw.hub.subscribe(qid, self.buffer)
        self._wake.set()

    async def run(self) -> None:
        backoff = 0.5
        while True:
            try:
                async with self._client() as client:
                    self.connects += 1
                    backoff = 0.5
                    await client.publish(self.status_topic, b"online", qos=1, retain=True)
                    log.info("MQTT bridge connected to %s:%d", self.host, self.port)
                    await self._announce(client)
                    try:
                        await self._pump(client)
                    except asyncio.CancelledError:
                        # A clean shutdown sends no last will: say "offline" ourselves.
                        with contextlib.suppress(Exception):
                            await asyncio.wait_for(
                                client.publish(self.status_topic, b"offline", qos=1, retain=True), 2
                            )
                        raise
            except aiomqtt.MqttError as e:
                log.warning("MQTT bridge lost the broker (%s); retrying in %.1f s", e, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 30.0)

    def _client(self) -> aiomqtt.Client:
        tls_context = None
        if self.tls:
            tls_context = ssl.create_default_context(cafile=self.config.ca_file)
        return aiomqtt.Client(
            self.host,
            self.port,
            username=self.config.username,
            password=self.config.password,
            identifier=f"{self.prefix}-gateway",
            tls_context=tls_context,
            will=aiomqtt.Will(self.status_topic, b"offline", qos=1, retain=True),
        )

    async def _pump(self, client: aiomqtt.Client) -> None:
        announced = set(self._subs)
        while True:
            self._wake.clear()
            if set(self._subs) != announced:
                await self._announce(client)
                announced = set(self._subs)
            sent = 0
            while self._failures:
                qid, error = self._failures[0]
                await client.publish(self.results_topic(qid), json.dumps({"error": error}), qos=1)
                self._failures.pop(0)
                sent += 1
            for qid, sub in list(self._subs.items()):
                while sub.pending():
                    batch = await sub.next_batch()
                    if batch is None:
                        break
                    self.missed += batch.missed
                    for row in batch.rows:
                        await client.publish(
                            self.results_topic(qid), json.dumps(row, default=str), qos=0
                        )
                        sent += 1
            self.published += sent
            if not sent:
                waiters = [asyncio.ensure_future(self._wake.wait())]
                waiters += [asyncio.ensure_future(s._event.wait()) for s in self._subs.values()]
                try:
                    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waiters:
                        w.cancel()

    async def _announce(self, client: aiomqtt.Client) -> None:
        """Home Assistant MQTT discovery: one retained config per published query."""
        if not self.config.home_assistant_discovery:
            return
        for qid in self._subs:
            rq = self.gw.fjord.queries.get(qid)
            if rq is None:
                continue
            value = next(
                (c for c in rq.columns if c not in ("window_start", "window_end")), rq.columns[0]
            )
            config: dict[str, Any] = {
                "name": f"Fjords query {qid}",
                "unique_id": f"fjords_{qid}",
                "state_topic": self.results_topic(qid),
                "value_template": f"{{{{ value_json.{value} }}}}",
                "json_attributes_topic": self.results_topic(qid),
                "availability_topic": self.status_topic,
                "device": {"identifiers": [f"{self.prefix}-gateway"], "name": "Fjords gateway"},
            }
            await client.publish(
                f"homeassistant/sensor/fjords_{qid}/config", json.dumps(config), qos=1, retain=True
            )
