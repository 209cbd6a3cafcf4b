"""MQTT sink: the latest row of every result group, retained, so a subscriber that connects at
any time gets the current value of each group at once.

Topics are `{prefix}/results/{query id}/{group value}/...` (one level per GROUP BY column, each
value percent-encoded but for letters, digits and `-_.~`, so `/`, `+` and `#` can make neither
levels nor wildcards; null is `%00`), or `{prefix}/results/{query id}/last` for a query without
groups. Only the latest value of a group
matters to a retained topic, so rows waiting for the broker are coalesced per group (a superseded
row is counted in `superseded`, not lost): a broker that is down costs memory bounded by the
number of groups (`mqtt_max_groups`; rows of groups beyond it are dropped, `too_many_groups`).
Deleting the query clears the retained topics of its groups, those an earlier run published
included (the sink subscribes to its topics once to find them).

All MQTT sinks share one supervised connection (`MqttSinks`), like the results bridge's.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import aiomqtt

from fjords.supervision import Supervised
from gateway.results import Subscription
from gateway.sinks.base import ResultSink
from gateway.sinks.spec import MqttSinkSpec

if TYPE_CHECKING:
    from gateway.config import MqttConfig

log = logging.getLogger("gateway.sinks")


def topic_level(value: object) -> str:
    """A group value as one topic level (RFC 3986 percent-encoding; null as %00)."""
    if value is None:
        return "%00"
    return quote(str(value), safe="")


def _default(o: object) -> object:
    if isinstance(o, float | int):
        return o
    return str(o)


class MqttSink(ResultSink):
    """One query's retained groups (sans-IO: rows in, publications out; the link sends)."""

    kind = "mqtt"

    def __init__(
        self,
        query_id: str,
        spec: MqttSinkSpec,
        sub: Subscription,
        link: MqttSinks,
        group_columns: tuple[str, ...],
        *,
        max_groups: int,
    ) -> None:
        super().__init__(query_id, spec, sub)
        self.spec: MqttSinkSpec = spec
        self.link = link
        self.base = f"{link.prefix}/results/{query_id}"
        self.group_columns = group_columns
        self.max_groups = max_groups
        self.latest: dict[str, bytes] = {}  # topic -> payload, waiting for the broker
        self.topics: set[str] = set()  # every group topic published (cleared on delete)
        self.superseded = 0

    def topic(self, row: dict[str, Any]) -> str:
        if not self.group_columns:
            return f"{self.base}/last"
        return "/".join([self.base, *(topic_level(row.get(c)) for c in self.group_columns)])

    def offer(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            topic = self.topic(row)
            if topic not in self.topics and topic not in self.latest:
                if len(self.topics | self.latest.keys()) >= self.max_groups:
                    self.drop("too_many_groups", 1)
                    continue
            elif topic in self.latest:
                self.superseded += 1
            self.latest[topic] = json.dumps(row, default=_default).encode()

    def retractions(self) -> list[tuple[str, bytes]]:
        """Empty retained messages for every group topic: the query is gone."""
        if not self.spec.retain:
            return []
        return [(t, b"") for t in sorted(self.topics | self.latest.keys())]

    async def run(self) -> None:
        while True:
            rows = await self.collect(10_000, 0.0)
            if rows is None:
                return
            self.offer(rows)
            self.link.wake()

    async def close(self) -> None:
        self.offer(self.take_pending())  # the link sends what it can before it closes

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out.update(
            topic=f"{self.base}/#",
            groups=len(self.topics | self.latest.keys()),
            superseded=self.superseded,
            queued=len(self.latest) + (self.sub.pending() if self.sub else 0),
            connected=self.link.stats.connected,
        )
        return out


class MqttSinks(Supervised):
    """The connection every MQTT sink publishes through (supervised: reconnects with backoff)."""

    expected = (aiomqtt.MqttError, OSError, TimeoutError)

    def __init__(self, config: MqttConfig, prefix: str | None = None) -> None:
        self.config = config
        self.prefix = (prefix or config.topic_prefix).rstrip("/")
        self.broker = config.publisher_broker()
        super().__init__(f"mqtt-sinks {self.broker.address}", backoff=self.broker.backoff())
        self.sinks: dict[int, MqttSink] = {}
        self._retractions: list[tuple[str, bytes]] = []
        self._sweeps: list[str] = []  # bases of deleted queries, swept for older retained values
        self._wake = asyncio.Event()
        self._passed = asyncio.Event()  # a publishing pass ended, or the session did

    def explain_failure(self, exc: BaseException) -> str:
        return self.broker.explain(exc)

    def add(self, sink: MqttSink) -> None:
        self.sinks[id(sink)] = sink
        self.wake()

    def remove(self, sink: MqttSink) -> None:
        if self.sinks.pop(id(sink), None) is not None:
            self._retractions += sink.retractions()
            if sink.spec.retain:  # and what an earlier run retained, this run never saw
                self._sweeps.append(sink.base)
            sink.latest.clear()
            self.wake()

    def wake(self) -> None:
        self._wake.set()

    def idle(self) -> bool:
        """Nothing waits for the broker: no value, no retraction, no sweep."""
        return not (self._retractions or self._sweeps or any(s.latest for s in self.sinks.values()))

    async def flushed(self) -> None:
        """Return once nothing waits for the broker, or the connection is down."""
        while self.stats.connected and not self.idle():
            self._passed.clear()
            await self._passed.wait()

    def _client(self) -> aiomqtt.Client:
        return self.broker.client(f"{self.prefix}-gateway-sinks")

    async def session(self) -> None:
        try:
            async with self._client() as client:
                self.mark_connected()
                log.info("MQTT sinks connected to %s", self.broker.address)
                while True:
                    self._wake.clear()
                    await self._publish_pending(client)
                    self._passed.set()
                    await self._wake.wait()
        finally:
            self._passed.set()  # `flushed()` sees the link down (marked so before it runs)

    async def _sweep(self, client: aiomqtt.Client, base: str) -> None:
        """Clear every value retained under `base`: subscribing makes the broker send them, and
        a marker published after the SUBACK comes back behind the last of them."""
        marker = f"{base}/$swept"  # no group level starts with `$` (they are percent-encoded)
        found: list[str] = []
        await client.subscribe(f"{base}/#", qos=1)
        try:
            await client.publish(marker, b"", qos=1)
            try:
                async with asyncio.timeout(10):
                    async for msg in client.messages:
                        topic = msg.topic.value
                        if topic == marker:
                            break
                        if msg.retain and msg.payload and topic.startswith(base + "/"):
                            found.append(topic)
            except TimeoutError:
                log.warning("MQTT sinks: no end of the retained values under %s; cleared %d",
                            base, len(found))  # fmt: skip
        finally:
            await client.unsubscribe(f"{base}/#")
        for topic in found:
            await client.publish(topic, b"", qos=1, retain=True)
        if found:
            log.info("MQTT sinks: cleared %d retained values under %s", len(found), base)

    async def _publish_pending(self, client: aiomqtt.Client) -> None:
        while self._sweeps:
            await self._sweep(client, self._sweeps[0])
            self._sweeps.pop(0)
        while self._retractions:
            topic, payload = self._retractions[0]
            await client.publish(topic, payload, qos=1, retain=True)
            self._retractions.pop(0)
        for sink in list(self.sinks.values()):
            latest = sink.latest
            while latest:
                topic = next(iter(latest))
                payload = latest[topic]
                # A failure leaves it in `latest`: it is sent again after the reconnect.
                await client.publish(topic, payload, qos=sink.spec.qos, retain=sink.spec.retain)
                if latest.get(topic) is payload:  # not replaced by a newer row meanwhile
                    del latest[topic]
                sink.topics.add(topic)
                sink.sent(1)
