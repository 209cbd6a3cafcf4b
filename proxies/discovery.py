"""Discovery: sensors the gateway hears from before it has their hello.

A mote that booted before the gateway (or kept running while the gateway restarted) said hello
to nobody and now only sends data. Without a hello there is no proxy, no schema and no stream
for its data, so the data is held here (bounded) and the sensor is asked to introduce itself
(`Control.hello_request`) in the receive window its next packet announces. When the hello
comes, the held messages are handed back in order, and nothing it sent meanwhile is lost unless
a bound was hit, which is counted.

Made-up ids cost little here: at most `max_sensors` are held (the one heard from longest ago
is forgotten first), and one not heard from for `forget_after_s` is forgotten (`forget_idle`),
so ids a flood made up are gone in minutes, and never count against the catalog's bound.

Sans-IO: the manager feeds messages in and sends the requests this returns.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict, deque
from dataclasses import dataclass

from proxies.stats import RateLimitedLog
from sensors.protocol import DATA_KINDS, Control, Listen, Message

log = logging.getLogger("proxies.discovery")


@dataclass(slots=True)
class DiscoveryStats:
    held: int = 0  # messages held for a sensor without a hello
    released: int = 0  # handed back when its hello came
    dropped_buffer_full: int = 0  # a sensor sent more than `max_messages` before its hello
    dropped_too_many_unknown: int = 0  # held messages of the sensor evicted for a newer one
    hello_requests: int = 0
    forgotten: int = 0  # sensors forgotten after forget_after_s without a message
    dropped_forgotten: int = 0  # ... and the messages they held


class _Unknown:
    __slots__ = ("messages", "asked_at", "heard_at")

    def __init__(self, now: float) -> None:
        self.messages: deque[Message] = deque()
        self.asked_at = float("-inf")
        self.heard_at = now


class Discovery:
    """Holds the data of sensors without a hello and decides when to ask them for one."""

    def __init__(
        self,
        *,
        max_sensors: int = 1024,
        max_messages: int = 256,
        ask_every_s: float = 1.0,
        forget_after_s: float = math.inf,
    ) -> None:
        self.max_sensors = max_sensors
        self.max_messages = max_messages
        self.ask_every_s = ask_every_s
        self.forget_after_s = forget_after_s
        self.stats = DiscoveryStats()
        self._unknown: OrderedDict[str, _Unknown] = OrderedDict()
        self._logged: set[str] = set()
        self._asking = RateLimitedLog(log, "sensors without a hello asked for one", burst=10)
        self.evicted: list[str] = []  # sensors whose held data was dropped for newer ones

    def __len__(self) -> int:
        return len(self._unknown)

    def __contains__(self, sensor_id: object) -> bool:
        return sensor_id in self._unknown

    def hold(self, sensor_id: str, msg: Message, now: float) -> Control | None:
        """Keep `msg` until `sensor_id` says hello; return a hello request to send now, if the
        message announces a receive window and we have not just asked (`now`: wall seconds)."""
        entry = self._unknown.get(sensor_id)
        if entry is None:
            if len(self._unknown) >= self.max_sensors:
                gone, evicted = self._unknown.popitem(last=False)  # the longest-unknown sensor
                self.evicted.append(gone)
                self.stats.dropped_too_many_unknown += len(evicted.messages)
                self._first(
                    "too_many",
                    "more than %d sensors without a hello: dropping the held data of the oldest",
                    self.max_sensors,
                )
            entry = self._unknown[sensor_id] = _Unknown(now)
            self._asking.log(
                now, logging.INFO, "sensor %r sends data but has not said hello: asking it to",
                sensor_id,
            )  # fmt: skip
        else:
            self._unknown.move_to_end(sensor_id)
            entry.heard_at = now
        if msg.kind in DATA_KINDS:
            if len(entry.messages) >= self.max_messages:
                entry.messages.popleft()
                self.stats.dropped_buffer_full += 1
                self._first(
                    "buffer_full",
                    "a sensor without a hello sent more than %d messages: dropping its oldest",
                    self.max_messages,
                )
            entry.messages.append(msg)
            self.stats.held += 1
        listening = isinstance(msg, Listen) or getattr(msg, "listen_ms", None)
        if listening and now - entry.asked_at >= self.ask_every_s:
            entry.asked_at = now
            self.stats.hello_requests += 1
            return Control.hello_request(sensor_id)
        return None

    def release(self, sensor_id: str) -> list[Message]:
        """The sensor said hello: what it sent before, in order."""
        entry = self._unknown.pop(sensor_id, None)
        if entry is None:
            return []
        self.stats.released += len(entry.messages)
        return list(entry.messages)

    def forget_idle(self, now: float) -> list[str]:
        """Forget the sensors not heard from for `forget_after_s` (`now`: wall seconds, as
        `hold` was given); returns their ids."""
        gone: list[str] = []
        limit = self.forget_after_s
        unknown = self._unknown
        while unknown:
            sid, entry = next(iter(unknown.items()))  # heard from longest ago first
            if now - entry.heard_at <= limit:
                break
            del unknown[sid]
            gone.append(sid)
            self.stats.dropped_forgotten += len(entry.messages)
        if gone:
            self.stats.forgotten += len(gone)
            log.info(
                "%d sensors without a hello forgotten: not heard from for %g s (the first %r)",
                len(gone), limit, gone[0],
            )  # fmt: skip
        self._asking.flush(now)
        return gone

    def pending(self) -> dict[str, int]:
        """Sensors still unknown and how many messages each has held (for /sensors, /metrics)."""
        return {sid: len(e.messages) for sid, e in self._unknown.items()}

    def _first(self, kind: str, fmt: str, *args: object) -> None:
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning(fmt, *args)
