"""The MQTT bridge: results of queries registered with `"publish": "mqtt"` go to
`{prefix}/results/{query_id}` as JSON rows, and (optionally) Home Assistant discovers them.

The bridge is one more subscriber of the result hub, with its own bounded buffer: a broker that is
down or slow loses the oldest rows (counted), never blocks the Fjord. It is a supervised link
(fjords/supervision.py, like the sensor transports): one session open at a time,
reconnecting with capped exponential backoff, an unexpected error logged, counted and restarted,
and `health()` naming the reason while it is down. The gateway's availability is a retained
`{prefix}/gateway/status` (`online`, and `offline` as the session's last will), which Home
Assistant's discovery configs point at, so entities go unavailable when the gateway dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable
from types import TracebackType
from typing import TYPE_CHECKING

import aiomqtt

from fjords.compile.sql.parser import parse
from fjords.supervision import Supervised
from gateway.config import MqttConfig
from gateway.home_assistant import Announcer, Publication, entity_shape
from gateway.results import Subscription

if TYPE_CHECKING:
    from gateway.daemon import Gateway

log = logging.getLogger("gateway.mqtt")


__all__ = ["MqttBridge"]


class MqttBridge(Supervised):
    """Enter it (the gateway does) to keep the session; `sync_queries()` follows the queries."""

    expected = (aiomqtt.MqttError, OSError, TimeoutError)

    def __init__(
        self,
        gateway: Gateway,
        config: MqttConfig,
        *,
        buffer: int = 10_000,
    ) -> None:
        self.gw = gateway
        self.config = config
        self.prefix = config.topic_prefix.rstrip("/")
        self.broker = config.publisher_broker()
        super().__init__(f"mqtt-bridge {self.broker.address}", backoff=self.broker.backoff())
        self.buffer = buffer
        self.status_topic = f"{self.prefix}/gateway/status"
        self._subs: dict[str, Subscription] = {}
        self._wake = asyncio.Event()
        self.published = 0
        self.connects = 0
        self.missed = 0
        self._failures: list[tuple[str, str]] = []  # (query id, error) to publish once
        self._announcers: dict[str, Announcer] = {}  # Home Assistant entities per query
        self._retractions: list[Publication] = []  # entities of removed queries, to delete

    def explain_failure(self, exc: BaseException) -> str:
        return self.broker.explain(exc)

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
                announcer = self._announcers.pop(qid, None)
                if announcer is not None:
                    self._retractions += announcer.retract()
        for qid in wanted - set(self._subs):
            self._subs[qid] = self.gw.hub.subscribe(qid, self.buffer)
            rq = self.gw.fjord.queries.get(qid)
            if self.config.home_assistant_discovery and rq is not None:
                stream = self.gw.fjord.streams.get(rq.plan.stream)
                schema = stream.info.schema if stream is not None else None
                tree = parse(rq.sql or "")  # it parsed when it was added
                shape = entity_shape(tree, list(rq.columns), schema)
                self._announcers[qid] = Announcer(
                    qid, shape, prefix=self.prefix, status_topic=self.status_topic
                )
        self._wake.set()

    async def session(self) -> None:
        async with self._client() as client:
            self.connects += 1
            await client.publish(self.status_topic, b"online", qos=1, retain=True)
            self.mark_connected()
            log.info("MQTT bridge connected to %s", self.broker.address)
            await self._announce(client)
            try:
                # The pump only publishes: watch the connection too, or a broker that went
                # away would be noticed only at the next result row.
                await _first_of(self._pump(client), _until_disconnected(client))
            except asyncio.CancelledError:
                # A clean shutdown sends no last will: say "offline" ourselves.
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(
                        client.publish(self.status_topic, b"offline", qos=1, retain=True), 2
                    )
                raise

    async def run(self) -> None:
        """Keep the session until cancelled (for callers that want a coroutine, not `async with`)."""
        async with self:
            await asyncio.Event().wait()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await super().__aexit__(exc_type, exc, tb)
        finally:
            for sub in self._subs.values():
                sub.close()
            self._subs.clear()

    def _client(self) -> aiomqtt.Client:
        return self.broker.client(
            f"{self.prefix}-gateway",
            will=aiomqtt.Will(self.status_topic, b"offline", qos=1, retain=True),
        )

    async def _pump(self, client: aiomqtt.Client) -> None:
        while True:
            self._wake.clear()
            sent = 0
            while self._retractions:
                topic, payload, retain = self._retractions[0]
                await client.publish(topic, payload, qos=1, retain=retain)
                self._retractions.pop(0)
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
                    announcer = self._announcers.get(qid)
                    if announcer is not None:
                        for topic, payload, retain in announcer.rows(batch.rows):
                            await client.publish(topic, payload, qos=1, retain=retain)
            self.published += sent
            if not sent:
                for s in self._subs.values():
                    if not s.pending():  # drained: its event would wake this loop at once
                        s._event.clear()
                waiters = [asyncio.ensure_future(self._wake.wait())]
                waiters += [asyncio.ensure_future(s._event.wait()) for s in self._subs.values()]
                try:
                    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waiters:
                        w.cancel()

    async def _announce(self, client: aiomqtt.Client) -> None:
        """Home Assistant discovery again on every connection (a broker may have lost the
        retained configs); new groups are announced as their first row arrives."""
        for announcer in self._announcers.values():
            for topic, payload, retain in announcer.configs():
                await client.publish(topic, payload, qos=1, retain=retain)


async def _until_disconnected(client: aiomqtt.Client) -> None:
    """Returns (raising MqttError) when the broker connection is lost."""
    async for _ in client.messages:  # nothing is subscribed: this only waits for the end
        pass
    raise aiomqtt.MqttError("message iteration ended")


async def _first_of(*coros: Awaitable[None]) -> None:
    """Run the coroutines until the first one ends; cancel the rest; raise what it raised."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for t in done:
        t.result()
