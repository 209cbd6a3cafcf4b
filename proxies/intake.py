"""`Intake`: every message from the transports, to its sensor's proxy, its tuples into the Fjord.

A message from a known sensor is handled as it arrives (the transport's listener, `arrived`):
its time passes the stream's clock guard, its proxy runs and the proxy's tuples are pushed into
the Fjord in that same event-loop turn; the controls the proxy asks for go to the outbox's
sender. Per transport a reader task (`read`) handles the rest in arrival order (hellos,
sensors not yet introduced, whatever arrived behind them) the same way. Bad messages are
counted and logged, never raised.

A hello creates the sensor's proxy (`proxies.registry`). Data from a sensor without one is held
(`proxies.discovery`) and the sensor asked to say hello; at start-up such a sensor also holds
every stream's progress until its hello, so that its held data is not late. Plain devices (a
transport with `programmable = False` and `implied_hello(sensor_id)`, e.g.
`sensors.transports.plain_mqtt`) say no hello: their first data creates the proxy from the
hello the transport implies, on the stream it names.

New ids are limited per source (`proxies.admission`: the transport a message came through):
the first message of an id the gateway holds nothing for takes a token, and one past its
source's `max_new_per_minute` is dropped (`stats.new_id_rate`, logged once a minute with a
count), before discovery or the catalog spend anything on it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from fjords.runtime.fjord import Fjord
from proxies.actions import SendControl
from proxies.admission import NewIdLimit
from proxies.clock import ClockGuards, StreamClock, claimed_time
from proxies.discovery import Discovery
from proxies.outbox import Outbox
from proxies.proxy import SensorProxy
from proxies.registry import SensorRegistry
from proxies.stats import DropLog, ManagerStats, RateLimitedLog
from sensors.protocol import Hello, Message
from sensors.transports.base import Transport, TransportClosed, TransportUnavailable

__all__ = ["Intake"]

log = logging.getLogger("proxies")


class Intake:
    """See the module docstring. `tick_s`: sweep the proxies' liveness whenever stream time
    moved that far (0: only the manager's ticker does); `idle_timeout_s`: how long start-up
    lasts, and the longest a sensor without a hello holds the streams."""

    def __init__(
        self,
        fjord: Fjord,
        *,
        registry: SensorRegistry,
        outbox: Outbox,
        guards: ClockGuards,
        clock: StreamClock,
        discovery: Discovery,
        stats: ManagerStats,
        wall_clock: Callable[[], float],
        tick_s: float,
        idle_timeout_s: float,
        new_ids: NewIdLimit | None = None,
    ) -> None:
        self._fjord = fjord
        self._registry = registry
        self._outbox = outbox
        self._guards = guards
        self._clock = clock
        self.discovery = discovery
        self._stats = stats
        self._drops = DropLog(log)
        self._wall_clock = wall_clock
        self._tick_s = tick_s
        self._idle_timeout_s = idle_timeout_s
        # What each message looks up or records (the registry's and the outbox's own dicts).
        self._proxies = registry.proxies
        self._heard_wall = registry.heard_wall
        self._routes = outbox.routes
        self.busy = 0  # messages being handled (the listener leaves the rest to the reader)
        # Sensors first heard before their hello during start-up: each holds every stream's
        # progress until its hello (`_hold_streams`).
        self.holding: set[str] = set()
        self.started = time.monotonic()
        self.new_ids = new_ids
        self._refusals = RateLimitedLog(log, "new sensor ids refused", burst=1)

    # -- arrival -----------------------------------------------------------------------------
    def arrived(self, transport: Transport, sensor_id: str, msg: Message) -> bool:
        """A message as the transport receives it (its listener): a known sensor's data is
        handled now, its tuples pushed into the Fjord before the event loop runs anything
        else. False (the reader handles it, in order) for a hello, a sensor not introduced yet,
        or while the reader is in the middle of a message."""
        if self.busy or isinstance(msg, Hello) or sensor_id not in self._proxies:
            return False
        self.busy += 1
        try:
            controls = self.handle(transport, sensor_id, msg)
            self._outbox.flush()
            self._outbox.send(controls)
        except Exception:  # one bad message must never stop the transport
            self._stats.errors += 1
            log.exception("handling %s from %r failed", msg.kind, sensor_id)
        finally:
            self.busy -= 1
        if self._tick_s and self._clock.now() - self._registry.swept_at >= self._tick_s:
            self._registry.sweep()
        return True

    async def read(self, transport: Transport) -> None:
        """The transport's messages that the listener left, in order, until it closes."""
        try:
            async for sensor_id, msg in transport.messages():
                if self.new_ids is not None and not self._admitted(transport, sensor_id, msg):
                    continue
                self.busy += 1
                try:
                    if (
                        sensor_id not in self._proxies
                        and not isinstance(msg, Hello)
                        and not self._implied(transport, sensor_id)
                    ):
                        await self._introduce(transport, sensor_id, msg)
                        continue
                    controls = self.handle(transport, sensor_id, msg)
                    if isinstance(msg, Hello):  # what it sent before its hello, in order
                        for held in self.discovery.release(sensor_id):
                            controls += self.handle(transport, sensor_id, held)
                    self._outbox.flush()  # into the Fjord now
                    if isinstance(msg, Hello):
                        self._unhold_streams(sensor_id)  # behind its held data, in the queues
                    self._outbox.send(controls)
                except Exception:  # one bad message must never stop the reader
                    self._stats.errors += 1
                    log.exception("handling %s from %r failed", msg.kind, sensor_id)
                finally:
                    self.busy -= 1
                if self._tick_s and self._clock.now() - self._registry.swept_at >= self._tick_s:
                    self._registry.sweep()  # stream time moved: liveness (wall-clock work waits)
        except TransportClosed:
            return

    def _admitted(self, transport: Transport, sensor_id: str, msg: Message) -> bool:
        """A known id, or a new one its source may still introduce (else counted, logged)."""
        if sensor_id in self._proxies or sensor_id in self.discovery:
            return True
        assert self.new_ids is not None
        source = str(getattr(transport, "name", "") or type(transport).__name__)
        now = self._wall_clock()
        if self.new_ids.admit(source, now, hello=isinstance(msg, Hello)):
            return True
        self._stats.new_id_rate += 1
        self._refusals.log(
            now, logging.WARNING,
            "new sensor id %r from %s refused: more than max_new_per_minute=%g new ids a "
            "minute from it (counted in fjords_sensors_refused_total{reason=\"new_id_rate\"})",
            sensor_id[:64], source, self.new_ids.per_minute,
        )  # fmt: skip
        return False

    def forget_unknown(self) -> None:
        """Forget the sensors without a hello not heard from for discovery's `forget_after_s`
        (and let go of the streams they held); say how many ids were refused lately."""
        for sid in self.discovery.forget_idle(time.monotonic()):
            self._stats.forgotten_unknown += 1
            self._unhold_streams(sid)
        self._refusals.flush(self._wall_clock())

    def handle(
        self, transport: Transport, sensor_id: str, msg: Message
    ) -> list[tuple[SensorProxy, SendControl]]:
        """One message to its proxy (a hello of a new sensor: its proxy made); its pushes are
        queued in the outbox, its controls returned, for the caller to send after the flush."""
        self._stats.messages += 1
        clock = self._clock
        now = clock.now()
        proxy = self._proxies.get(sensor_id)
        if proxy is None:
            if not isinstance(msg, Hello):
                self._stats.no_proxy += 1
                self._drops.once(
                    "no_proxy", "data from %r dropped: its hello was refused", sensor_id
                )
                return []
            if self._registry.create(msg, now) is not None:
                self._routes[sensor_id] = transport
                self._heard_wall[sensor_id] = self._wall_clock()
            return []
        self._routes[sensor_id] = transport
        self._heard_wall[sensor_id] = self._wall_clock()
        t = self._guards.screen(proxy.stream, proxy.progress_key, claimed_time(msg))
        if t is not None and t > clock.stream_time and clock.advance(t):
            for p in self._proxies.values():  # heard "at 0" before stream time began
                p.last_heard = max(p.last_heard, t)
        stalled = proxy.stall.stalled
        actions = proxy.on_message(msg, clock.now(), wall=self._wall_clock())
        if proxy.stall.stalled != stalled:
            self._registry.stall_changed(proxy, stalled)
        return self._outbox.put(actions, proxy)

    def _implied(self, transport: Transport, sensor_id: str) -> bool:
        """A plain device's first data: make its proxy from the hello its transport implies.
        True when the transport speaks for its sensors (the data then goes to the proxy, or is
        counted as `no_proxy` when the hello was refused); False: ask the sensor (discovery)."""
        implied = getattr(transport, "implied_hello", None)
        if implied is None:
            return False
        found = implied(sensor_id)
        if found is None:
            return False
        hello, stream = found
        programmable = bool(getattr(transport, "programmable", True))
        proxy = self._registry.create(
            hello, self._clock.now(), stream=stream, programmable=programmable
        )
        if proxy is not None:
            self._routes[sensor_id] = transport
            self._heard_wall[sensor_id] = self._wall_clock()
        return True

    # -- sensors without a hello ---------------------------------------------------------------
    async def _introduce(self, transport: Transport, sensor_id: str, msg: Message) -> None:
        """Data from a sensor without a hello: hold it, and ask the sensor to say hello."""
        self._stats.before_hello += 1
        now = time.monotonic()
        new = sensor_id not in self.discovery
        request = self.discovery.hold(sensor_id, msg, now)
        if new and now - self.started < self._idle_timeout_s:
            self._hold_streams(sensor_id)
        while self.discovery.evicted:
            self._unhold_streams(self.discovery.evicted.pop())
        if request is None:
            return
        try:
            await transport.send(sensor_id, request)
            self._stats.controls_sent += 1
        except (TransportUnavailable, TransportClosed, ValueError, TypeError) as exc:
            self._stats.send_failures += 1
            log.debug("hello request to %r failed: %s", sensor_id, exc)

    def _hold_streams(self, sensor_id: str) -> None:
        """A sensor heard before its hello during start-up (it kept sending while the gateway
        restarted, or booted first) holds every stream's progress until its hello: its data
        waits in discovery, and a stream whose watermark moved on meanwhile, as the sensors
        whose hellos came first push their newer readings, would drop it all as late (a
        broker hands a returning session its backlog before the retained hellos). Which
        stream is its own only the hello says. At most the progress policy's idle timeout (a
        sensor that never says hello), and only during start-up (as long again from the
        manager's start): an unknown id later holds nothing back."""
        if sensor_id in self.holding:
            return
        self.holding.add(sensor_id)
        key = _PendingHello(sensor_id)
        for stream in self._fjord.streams:
            self._fjord.heartbeat(stream, key, -math.inf)  # holds it until it reports

    def _unhold_streams(self, sensor_id: str) -> None:
        if sensor_id not in self.holding:
            return
        self.holding.discard(sensor_id)
        key = _PendingHello(sensor_id)
        for stream in self._fjord.streams:
            self._fjord.release(stream, key, forget=True)


@dataclass(frozen=True, slots=True)
class _PendingHello:
    """The progress key of a sensor held in discovery: never equal to a sensor's own key."""

    sensor_id: str
