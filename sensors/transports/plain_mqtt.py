"""Gateway side of plain MQTT devices: JSON or msgpack documents on the devices' own topics.

One supervised aiomqtt session (its own client id, `{prefix}-gateway-plain`) subscribes to every
declared stream's topic; each message goes through :class:`sensors.plain_decoder.PlainIngest`
(sans-IO) and each reading is queued for the proxies as a one-row `Samples` message. Such
devices say no hello: the proxy manager asks `implied_hello(sensor_id)` for the hello a sensor
implies (its stream's columns) when it first publishes, and makes it a proxy that is not
programmable (no controls are ever sent; `send` refuses).

Retained messages are skipped (counted in `retained_skipped`, not as dropped data): they
are a device's last state as the broker kept it, re-delivered at every (re)subscription, and
would come back as new readings each time. Payloads that do not match their stream are counted
by reason in `ingest.drops` (reported as `fjords_dropped_total{stage="mqtt_json", reason}`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

import aiomqtt

from sensors.plain_decoder import PlainIngest, PlainStreamSpec, Reading
from sensors.protocol import Control, Hello, Samples
from sensors.transports.base import DEFAULT_QUEUE_BOUND, TransportUnavailable, log
from sensors.transports.broker import BrokerSettings
from sensors.transports.mqtt_reads import DRAIN_BATCH, bounded_client
from sensors.transports.supervisor import SupervisedTransport

__all__ = ["PlainMqttTransport"]

#: The stage of fjords_dropped_total these drops are counted under.
DROP_STAGE = "mqtt_json"


class PlainMqttTransport(SupervisedTransport):
    """Plain devices' readings from one broker, for the streams `specs` declare."""

    expected = (aiomqtt.MqttError, OSError, TimeoutError)
    #: the proxy manager makes proxies of these sensors that never send controls
    programmable = False

    def __init__(
        self,
        specs: Sequence[PlainStreamSpec],
        broker: BrokerSettings | None = None,
        *,
        prefix: str = "fjords",
        identifier: str | None = None,
        qos: int = 1,
        clean_session: bool = False,
        queue_bound: int = DEFAULT_QUEUE_BOUND,
        max_sensors: int = 10_000,
        forget_after_s: float = 86_400.0,
    ) -> None:
        """`broker` None: one on this host's port 1883."""
        if qos not in (0, 1, 2):
            raise ValueError(f"MQTT qos must be 0, 1 or 2, not {qos!r}")
        if not specs:
            raise ValueError("no plain MQTT streams declared")
        self.broker = broker = broker if broker is not None else BrokerSettings()
        super().__init__(
            f"mqtt-plain {broker.address}", queue_bound=queue_bound, backoff=broker.backoff()
        )
        self.ingest = PlainIngest(specs, max_sensors=max_sensors, forget_after_s=forget_after_s)
        default_id = (
            f"fjords-gateway-plain-{uuid.uuid4().hex[:8]}"
            if clean_session
            else f"{prefix}-gateway-plain"
        )
        self.identifier = identifier or broker.identifier("plain", default_id)
        self.qos = qos
        self.clean_session = clean_session
        self.retained_skipped = 0

    # -- what the proxy manager asks ------------------------------------------------------------
    def explain_failure(self, exc: BaseException) -> str:
        return self.broker.explain(exc)

    def implied_hello(self, sensor_id: str) -> tuple[Hello, str] | None:
        """The hello a sensor that published implies, and its stream (None: not one of ours)."""
        return self.ingest.hello(sensor_id)

    def drop_counts(self) -> dict[tuple[str, str], int]:
        """Payloads dropped, as (stage, reason) -> count, for fjords_dropped_total."""
        return {(DROP_STAGE, reason): n for reason, n in self.ingest.drops.items()}

    async def _send(self, sensor_id: str, msg: Control) -> None:
        raise TransportUnavailable(f"{sensor_id!r} is a plain MQTT device: it takes no controls")

    # -- the session ----------------------------------------------------------------------------
    async def session(self) -> None:
        client, queue, _ = bounded_client(
            self.broker,
            self.identifier,
            clean_session=self.clean_session,
            queue_bound=self._queue_bound,
            on_overflow=lambda: self.overflow("aiomqtt's inbound queue"),
        )
        async with client:
            for topic in self.ingest.subscriptions():
                await client.subscribe(topic, qos=self.qos)
            self.mark_connected()
            log.info(
                "mqtt plain devices: connected to %s as %s, topics %s",
                self.broker.address,
                self.identifier,
                ", ".join(self.ingest.subscriptions()),
            )
            async for first in client.messages:
                for m in (first, *queue.take(DRAIN_BATCH)):
                    try:
                        self.on_message(m.topic.value, m.payload, retain=bool(m.retain))
                    except Exception as exc:  # noqa: BLE001 - a bad message is counted and logged, not the session's end
                        self.failed(m.topic.value, exc)
        raise aiomqtt.MqttError("message iteration ended")

    def on_message(self, topic: str, payload: Any, *, retain: bool = False) -> None:
        """One message from the broker (public for tests: no broker needed)."""
        if retain:
            self.retained_skipped += 1
            return
        if not isinstance(payload, bytes | bytearray):
            self.bad("payload", topic, f"payload is {type(payload).__name__}, not bytes")
            return
        for out in self.ingest.feed(topic, bytes(payload), wall=time.time(), mono=time.monotonic()):
            if isinstance(out, Reading):
                msg = Samples(sensor_id=out.sensor_id, times=(out.time,), rows=(out.values,))
                self._inbound.deliver(out.sensor_id, msg)
