"""In-process transport: simulated motes attached directly to the gateway (demos and tests).

Messages still go through encode/decode so that what the proxies see is exactly what a real
link would deliver, and corrupted packets fail the same way.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Self

from sensors.protocol import Control, Message, ProtocolError, decode_message, encode_message
from sensors.transports.base import (
    DEFAULT_QUEUE_BOUND,
    ControlInbox,
    Corrupt,
    Inbound,
    InboundBuffer,
    TransportClosed,
    TransportStats,
    TransportUnavailable,
)

__all__ = ["InProcessHub", "InProcessLink"]


class InProcessHub:
    """Gateway side; `link(sensor_id)` gives the device side for each mote."""

    def __init__(self, *, queue_bound: int = DEFAULT_QUEUE_BOUND) -> None:
        self.stats = TransportStats()
        self._inbound = InboundBuffer(self.stats, queue_bound)
        self._links: dict[str, InProcessLink] = {}
        self._open = False

    async def __aenter__(self) -> Self:
        self._open = True
        self.stats.connected = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._open = False
        self.stats.connected = False
        self._inbound.queue.close()

    def link(self, sensor_id: str) -> InProcessLink:
        link = self._links.get(sensor_id)
        if link is None:
            link = self._links[sensor_id] = InProcessLink(self, sensor_id)
        return link

    def messages(self) -> AsyncIterator[Inbound]:
        return self._inbound.messages()

    async def send(self, sensor_id: str, msg: Control) -> None:
        if not self._open:
            raise TransportClosed("send() outside `async with InProcessHub()`")
        link = self._links.get(sensor_id)
        if link is None or not link.online:
            raise TransportUnavailable(f"no mote {sensor_id!r} attached")
        if msg.sensor_id != sensor_id:
            raise ValueError(f"control for {msg.sensor_id!r} sent to {sensor_id!r}")
        link.inbox.put(decode_message(encode_message(msg)))
        self.stats.sent += 1

    def _receive(self, sensor_id: str, data: bytes) -> None:
        if not self._open:
            return
        try:
            msg = decode_message(data)
        except ProtocolError as exc:
            self._inbound.bad(sensor_id, str(exc))
            return
        if msg.sensor_id != sensor_id:
            self._inbound.bad(sensor_id, f"message claims to be from {msg.sensor_id!r}")
            return
        self._inbound.deliver(sensor_id, msg)


class InProcessLink:
    """Device side of the in-process hub for one mote."""

    def __init__(self, hub: InProcessHub, sensor_id: str) -> None:
        self.hub = hub
        self.sensor_id = sensor_id
        self.inbox = ControlInbox()
        self.online = True
        self.sent = 0

    async def send(self, msg: Message, *, corrupt: Corrupt | None = None) -> None:
        if not self.online:
            return
        data = encode_message(msg)
        if corrupt is not None:
            data = corrupt(data)
        self.sent += 1
        self.hub._receive(self.sensor_id, data)

    def set_online(self, online: bool) -> None:
        self.online = online

    async def flow(self) -> None:
        await asyncio.sleep(0)  # nothing to wait for; let the gateway run

    def poll_controls(self) -> list[Control]:
        return self.inbox.poll()

    async def next_control(self) -> Control:
        return await self.inbox.next()
