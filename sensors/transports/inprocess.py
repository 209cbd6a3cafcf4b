"""In-process transport: simulated motes attached directly to the gateway (demos and tests).

Messages still go through encode/decode so that what the proxies see is exactly what a real
link would deliver, and corrupted packets fail the same way.
"""

from __future__ import annotations

import asyncio
from typing import Self

from sensors.auth import Keyring
from sensors.protocol import Control, Message, encode_message
from sensors.sealing import MoteAuth
from sensors.transports.base import (
    DEFAULT_QUEUE_BOUND,
    ControlInbox,
    Corrupt,
    TransportUnavailable,
)
from sensors.transports.supervisor import SupervisedTransport

__all__ = ["InProcessHub", "InProcessLink"]


class InProcessHub(SupervisedTransport):
    """Gateway side; `link(sensor_id)` gives the device side for each mote.

    Its session has nothing to connect to: it is up while the hub is entered. It shares the
    supervised base so that it decodes, validates, counts and reports health like the others.
    """

    def __init__(self, *, queue_bound: int = DEFAULT_QUEUE_BOUND) -> None:
        super().__init__("in-process", queue_bound=queue_bound)
        self._links: dict[str, InProcessLink] = {}
        #: where simulated motes attached here find their keys (the gateway's own keys file)
        self.mote_keys: Keyring | None = None

    async def __aenter__(self) -> Self:
        await super().__aenter__()
        self.mark_connected()  # usable at once, before the session task first runs
        return self

    async def session(self) -> None:
        if not self.stats.connected:
            self.mark_connected()
        await asyncio.Event().wait()  # until the hub is left

    def link(self, sensor_id: str, key: bytes | None = None) -> InProcessLink:
        """The mote's side; `key` (the first time): it seals what it sends and takes only
        authentic controls. With a `keys` ring set on the hub, a mote gets its key from it."""
        link = self._links.get(sensor_id)
        if link is None:
            if key is None and self.mote_keys is not None:
                key = self.mote_keys.key_for(sensor_id)
            link = self._links[sensor_id] = InProcessLink(self, sensor_id, key)
        return link

    async def _send(self, sensor_id: str, msg: Control) -> None:
        link = self._links.get(sensor_id)
        if link is None or not link.online:
            raise TransportUnavailable(f"no mote {sensor_id!r} attached")
        link.inbox.receive(self.encode_control(msg))  # exactly what a real link delivers

    def _receive(self, sensor_id: str, data: bytes) -> None:
        if not self.running:
            return
        try:
            self.accept(data, where=sensor_id, sensor_id=sensor_id)
        except Exception as exc:  # noqa: BLE001 - a bad message is counted and logged, not the link's end
            self.failed(sensor_id, exc)


class InProcessLink:
    """Device side of the in-process hub for one mote."""

    def __init__(self, hub: InProcessHub, sensor_id: str, key: bytes | None = None) -> None:
        self.hub = hub
        self.sensor_id = sensor_id
        self.auth = MoteAuth(sensor_id, key) if key is not None else None
        self.inbox = ControlInbox(sensor_id=sensor_id, auth=self.auth)
        self.online = True
        self.sent = 0

    async def send(self, msg: Message, *, corrupt: Corrupt | None = None) -> None:
        if not self.online:
            return
        data = encode_message(msg)
        if self.auth is not None:
            data = self.auth.seal_bytes(data)
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
