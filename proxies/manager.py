"""`ProxyManager`: every sensor's proxy, between the transports and the Fjord.

    async with hub, ProxyManager(fjord, [hub]) as proxies:
        ...                             # readings flow; add or remove queries, then:
        proxies.queries_changed()       # every proxy recomputes its demand and program

The manager owns its tasks, not the transports (enter those yourself, before it). A message
from a known sensor is handled as it arrives (the transport's listener, `set_listener`): its
proxy runs and its tuples are pushed into the Fjord in that same event-loop turn. Per transport
a reader task handles the rest in arrival order (hellos, sensors not yet introduced, whatever
arrived behind them) the same way. Controls the proxies ask for are sent, in order, by one
sender task. Tuples and heartbeats pass one bounded outbox (drop oldest, counted in
`stats.outbox_drops`) that is flushed into the Fjord at once (a push only appends to the
stream's queue); a pump task flushes what ticks and query changes put there. A ticker marks
silent sensors offline. Bad messages and hellos are counted and logged, never raised.

Time: `clock` gives "now" for liveness (offline after missed periods, sleep, energy
estimates). The default, `None`, is stream time: the latest admitted sample time any sensor
reported, which suits both replays at any speed and live sensors with synchronised clocks.
Since the fastest sensors drive it, a sensor is offline only if also silent on `wall_clock` for
as long as its limit takes at its own measured pace (`proxies.liveness`): a real-time loop pair
beside a fleet replayed 60x is not silent because stream time raced ahead.
Stream progress is not the manager's: each proxy announces its sensor's pace and the stream's
router releases quiet sensors by wall-clock idleness (`fjords.runtime.progress`); the ticker wakes the
routers so they notice idleness when nothing flows.

Plain devices (a transport with `programmable = False` and `implied_hello(sensor_id)`, e.g.
`sensors.transports.plain_mqtt`) say no hello: the first data of an unknown sensor on such a
transport creates its proxy from the hello the transport implies, on the stream it names, and
that proxy never sends controls (no pushdown, no rate control); the catalog marks it
`"programmable": false`.

Bounds (the catalog cannot grow without limit): at most `max_sensors` proxies (later hellos
are rejected, `stats.catalog_full`); a hello whose attributes, schema or programs exceed
`max_hello_attributes` entries or whose encoding exceeds `max_hello_bytes` is rejected
(`stats.oversize_hellos`); a sensor not heard from for `forget_offline_after_s` of gateway time
(`wall_clock`) is forgotten: removed from the catalog and from its stream's progress. Each
reading's time passes a per-stream future bound first (`fjords.runtime.progress`; per sensor
`clock_rejects`, `clock_suspect` in the catalog). Every drop is counted and logged once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import msgspec
from firmware_sim.energy import Battery
from firmware_sim.profiles import resolve_profile

from fjords.demand import Demand
from fjords.runtime.fjord import Fjord
from fjords.runtime.progress import ProgressPolicy, ProgressTracker
from fjords.supervision import log_task_failure
from proxies.choice import DEFAULT_SLEEP_S, ProgramChoice
from proxies.demand import analyse
from proxies.demand_index import DemandIndex
from proxies.discovery import Discovery
from proxies.pair import PAIR_ATTRIBUTES, PairJoin
from proxies.proxy import (
    DEFAULT_RETRY_AFTER_S,
    Action,
    ProxyError,
    PushHeartbeat,
    PushPace,
    PushRelease,
    PushRow,
    SendControl,
    SensorProxy,
)
from sensors.protocol import AggregateReport, Control, Events, Hello, Listen, Message, Samples
from sensors.transports.base import (
    DropOldestQueue,
    Transport,
    TransportClosed,
    TransportUnavailable,
)

__all__ = ["ManagerStats", "ProxyManager", "default_stream_for"]

log = logging.getLogger("proxies")

StreamFor = Callable[[Hello], "str | None"]


def is_pair(hello: Hello) -> bool:
    return all(k in hello.attributes for k in PAIR_ATTRIBUTES)


def default_stream_for(fjord: Fjord) -> StreamFor:
    """Loop pairs feed `vehicles`, scalar sensors `traffic` (or the Fjord's only stream)."""

    def stream_for(hello: Hello) -> str | None:
        names = list(fjord.streams)
        wanted = "vehicles" if is_pair(hello) else "traffic"
        if wanted in fjord.streams:
            return wanted
        return names[0] if len(names) == 1 else None

    return stream_for


@dataclass(slots=True)
class ManagerStats:
    messages: int = 0
    before_hello: int = 0  # messages from a sensor we had no hello from (held: Discovery)
    no_proxy: int = 0  # data dropped: its sensor's hello was rejected (no stream, catalog full...)
    rejected_hellos: int = 0
    errors: int = 0
    outbox_drops: int = 0
    pushed_tuples: int = 0
    pushed_heartbeats: int = 0
    controls_sent: int = 0
    send_failures: int = 0
    demand_updates: int = 0
    catalog_full: int = 0  # hellos rejected: max_sensors proxies already
    oversize_hellos: int = 0  # hellos rejected: too many or too large attributes
    forgotten: int = 0  # sensors removed after forget_offline_after_s of silence


class ProxyManager:
    """See the module docstring."""

    def __init__(
        self,
        fjord: Fjord,
        transports: Sequence[Transport],
        *,
        stream_for: StreamFor | None = None,
        default_period_s: float | None = None,
        profile: str = "paper",
        queue_bound: int = 10_000,
        clock: Callable[[], float] | None = None,
        offline_after: float = 3.0,
        retry_windows: int = 2,
        max_sends: int = 5,
        retry_after_s: float = DEFAULT_RETRY_AFTER_S,
        sleep_s: float = DEFAULT_SLEEP_S,
        listen_ms_per_s: float | None = None,
        pushdown: bool = True,
        tick_s: float = 1.0,
        max_travel_s: float = 0.5,
        max_sensors: int = 10_000,
        forget_offline_after_s: float = 86_400.0,
        max_hello_attributes: int = 64,
        max_hello_bytes: int = 4096,
        wall_clock: Callable[[], float] = time.monotonic,
        progress: ProgressPolicy | None = None,
    ) -> None:
        self.fjord = fjord
        self.transports = list(transports)
        self.stream_for = stream_for or default_stream_for(fjord)
        self.default_period_s = default_period_s
        self.profile = profile
        self.clock = clock
        self.proxy_options: dict[str, Any] = {
            "profile": profile,
            "default_period_s": default_period_s,
            "offline_after": offline_after,
            "retry_windows": retry_windows,
            "max_sends": max_sends,
            "retry_after_s": retry_after_s,
            "sleep_s": sleep_s,
            "listen_ms_per_s": listen_ms_per_s,
            "control": pushdown,
        }
        self.tick_s = tick_s
        self.max_travel_s = max_travel_s
        self.proxies: dict[str, SensorProxy] = {}
        self.pairs: dict[str, PairJoin] = {}
        self.stats = ManagerStats()
        self._outbox: DropOldestQueue[Action] = DropOldestQueue(queue_bound)
        self._transport_of: dict[str, Transport] = {}
        self._demands = DemandIndex(default_period_s=default_period_s)
        self._stale: dict[str, None] = {}  # sensors whose demand is still to update, in order
        self._demand_wake: asyncio.Event | None = None
        self.demand_slice_s = 0.004
        self._stream_time = -math.inf
        self._last_tick = -math.inf
        self._task: asyncio.Task[None] | None = None
        self._busy = 0
        # Controls to send, in the order the proxies asked for them (one sender task).
        self._controls: asyncio.Queue[tuple[SensorProxy, SendControl]] = asyncio.Queue()
        self._sending = 0
        self.discovery = Discovery()
        # Sensors first heard before their hello during start-up: each holds every stream's
        # progress until its hello (`_hold_streams`).
        self._holding: set[str] = set()
        self._started = time.monotonic()
        self.max_sensors = max_sensors
        self.forget_offline_after_s = forget_offline_after_s
        self.max_hello_attributes = max_hello_attributes
        self.max_hello_bytes = max_hello_bytes
        self.wall_clock = wall_clock
        self.progress_policy = progress or fjord.progress_policy or ProgressPolicy()
        # Per stream, the future bound on readings' times (its own tracker: it sees every
        # claim, admitted or not, before a proxy can take an outlier as its latest time).
        self._guards: dict[str, ProgressTracker] = {}
        self._heard_wall: dict[str, float] = {}
        self._logged: set[str] = set()
        self._fixed: set[str] = set()  # sensors that take no controls (plain devices)
        # Told when a sensor joins the catalog (False) or leaves it (True): the gateway keeps
        # long-lived objects out of the garbage collector's way (`gateway.long_lived`).
        self.on_catalog_change: Callable[[bool], None] | None = None

    # -- lifecycle -----------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self.run(), name="proxy-manager")
        self._task.add_done_callback(functools.partial(log_task_failure, logger=log))
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
        self._flush()

    async def run(self) -> None:
        """Read every transport, pump the outbox, tick; until cancelled or the transports end."""
        listening = [t for t in self.transports if hasattr(t, "set_listener")]
        for t in listening:
            t.set_listener(functools.partial(self._arrived, t))
        try:
            async with asyncio.TaskGroup() as tg:
                readers = [
                    tg.create_task(self._read(t), name=f"proxy-reader-{i}")
                    for i, t in enumerate(self.transports)
                ]
                pump = tg.create_task(self._pump(), name="proxy-pump")
                sender = tg.create_task(self._sender(), name="proxy-sender")
                ticker = tg.create_task(self._ticker(), name="proxy-ticker")
                demand = tg.create_task(self._demand_updates(), name="proxy-demand")
                await asyncio.gather(*readers)
                ticker.cancel()
                demand.cancel()
                await self._controls.join()  # what the readers asked for is sent
                sender.cancel()
                self._outbox.close()
                await pump
        finally:
            for t in listening:
                t.set_listener(None)

    # -- what the gateway calls ------------------------------------------------------------
    def now(self) -> float:
        if self.clock is not None:
            return self.clock()
        return self._stream_time if self._stream_time > -math.inf else 0.0

    def queries_changed(self) -> None:
        """Queries were added or removed: the proxies they concern update demand and program.

        The demand index (`proxies.demand_index`) says which sensors a change touches, at a
        cost of queries + sensors, not their product. Those update at once for a few
        milliseconds (all of them, for a fleet of ordinary size, so a new program goes out in
        the sensor's next receive window); while the manager runs, the rest continue in the
        background in slices, together with those of later changes: a registration never
        stalls the event loop.
        """
        self._sync_demands()
        running = self._task is not None and not self._task.done()
        self._update_stale(self.demand_slice_s if running else math.inf)

    def _sync_demands(self) -> None:
        """Mark the sensors the queries' changes touch; the background task updates them."""
        self._stale.update(dict.fromkeys(self._demands.sync(self.fjord.queries)))
        if self._stale and self._demand_wake is not None:
            self._demand_wake.set()  # (else the task takes them when it starts)

    def _update_stale(self, budget_s: float) -> None:
        """Update stale sensors' demands, oldest first, for at most about `budget_s`."""
        deadline = time.perf_counter() + budget_s
        now = self.now()
        stale = self._stale
        while stale:
            sid = next(iter(stale))
            del stale[sid]
            proxy = self.proxies.get(sid)
            if proxy is not None:
                self._update_demand(proxy, now)
            if time.perf_counter() >= deadline:
                return

    async def _demand_updates(self) -> None:
        self._demand_wake = wake = asyncio.Event()
        if self._stale:
            wake.set()
        try:
            while True:
                await wake.wait()
                wake.clear()
                while self._stale:
                    self._update_stale(self.demand_slice_s)
                    await asyncio.sleep(0)
        finally:
            self._demand_wake = None
            self._update_stale(math.inf)  # stopped half-way: finish now

    def catalog(self) -> list[dict[str, Any]]:
        """One entry per sensor for GET /sensors, sorted by id (`gateway.sensors_view`)."""
        from gateway.sensors_view import sensors_catalog  # the view is the gateway's

        return sensors_catalog(self)

    def programmable(self, sensor_id: str) -> bool:
        """Whether the sensor takes controls (plain devices do not)."""
        return sensor_id not in self._fixed

    def clock_report(self, proxy: SensorProxy) -> dict[str, Any]:
        """`clock_rejects` (readings dated implausibly far ahead, dropped), `clock_suspect` and
        the offset of the sensor's latest reading from the gateway's clock and its peers."""
        guard = self._guards.get(proxy.stream)
        report: dict[str, Any] = (
            guard.clock_report(proxy.progress_key)
            if guard is not None
            else {"clock_rejects": 0, "clock_suspect": False}
        )
        stream = self.fjord.streams.get(proxy.stream)
        if stream is not None:  # rejected by the router itself (pushed around the proxies)
            s = stream.router.progress.sensors.get(proxy.progress_key)
            if s is not None:
                report["clock_rejects"] += s.rejects
        report["clock_rejects"] = max(report["clock_rejects"], proxy.stats.clock_rejects)
        return report

    def tick(self) -> None:
        """Check every proxy for silence now (the ticker task does this every `tick_s`); let
        the streams notice idle sensors; forget sensors silent for `forget_offline_after_s`."""
        self._tick_proxies()
        self._forget_silent()
        self.fjord.check_idle()

    def _tick_proxies(self) -> None:
        now = self.now()
        self._last_tick = now
        wall = self.wall_clock()
        for proxy in self.proxies.values():
            self._enqueue(proxy.tick(now, wall=wall))

    async def settle(self) -> None:
        """Wait until every message received so far is handled and its tuples are pushed."""
        while True:
            waiting = any(
                t.stats.received - t.stats.dropped_queue_full > t.stats.delivered
                for t in self.transports
            )
            demand = bool(self._stale)
            sending = self._sending or self._controls.qsize()
            if not (waiting or self._busy or len(self._outbox) or demand or sending):
                return
            await asyncio.sleep(0)

    # -- reading --------------------------------------------------------------------------
    async def _read(self, transport: Transport) -> None:
        try:
            async for sensor_id, msg in transport.messages():
                self._busy += 1
                try:
                    if (
                        sensor_id not in self.proxies
                        and not isinstance(msg, Hello)
                        and not self._implied(transport, sensor_id)
                    ):
                        await self._introduce(transport, sensor_id, msg)
                        continue
                    controls = self._handle(transport, sensor_id, msg)
                    if isinstance(msg, Hello):  # what it sent before its hello, in order
                        for held in self.discovery.release(sensor_id):
                            controls += self._handle(transport, sensor_id, held)
                    self._flush()  # into the Fjord now
                    if isinstance(msg, Hello):
                        self._unhold_streams(sensor_id)  # behind its held data, in the queues
                    for control in controls:
                        self._controls.put_nowait(control)
                except Exception:  # one bad message must never stop the reader
                    self.stats.errors += 1
                    log.exception("handling %s from %r failed", msg.kind, sensor_id)
                finally:
                    self._busy -= 1
                if self.tick_s and self.now() - self._last_tick >= self.tick_s:
                    self._tick_proxies()  # stream time moved: liveness (wall-clock work waits)
        except TransportClosed:
            return

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
        proxy = self._create(hello, self.now(), stream=stream, programmable=programmable)
        if proxy is not None:
            if not programmable:
                self._fixed.add(sensor_id)
            self._transport_of[sensor_id] = transport
            self._heard_wall[sensor_id] = self.wall_clock()
        return True

    def _arrived(self, transport: Transport, sensor_id: str, msg: Message) -> bool:
        """A message as the transport receives it (its listener): a known sensor's data is
        handled now, its tuples pushed into the Fjord before the event loop runs anything
        else. False (the reader handles it, in order) for a hello, a sensor not introduced yet,
        or while the reader is in the middle of a message."""
        if self._busy or isinstance(msg, Hello) or sensor_id not in self.proxies:
            return False
        self._busy += 1
        try:
            controls = self._handle(transport, sensor_id, msg)
            self._flush()
            for control in controls:
                self._controls.put_nowait(control)
        except Exception:  # one bad message must never stop the transport
            self.stats.errors += 1
            log.exception("handling %s from %r failed", msg.kind, sensor_id)
        finally:
            self._busy -= 1
        if self.tick_s and self.now() - self._last_tick >= self.tick_s:
            self._tick_proxies()
        return True

    async def _sender(self) -> None:
        """Send the proxies' controls one at a time, in the order they were asked for."""
        while True:
            proxy, action = await self._controls.get()
            self._sending += 1
            try:
                await self._send(proxy, action)
            except Exception:  # a bug in a transport: count it, keep sending the others
                self.stats.errors += 1
                log.exception("sending a control to %r failed", action.sensor_id)
            finally:
                self._sending -= 1
                self._controls.task_done()
            # A cancel can be swallowed below us (Python 3.11's asyncio.wait_for, used by aiomqtt,
            # loses one that races with the publish completing): honour it here, or the
            # manager's shutdown waits on this task forever (the daemon ignored SIGTERM).
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                raise asyncio.CancelledError

    async def _introduce(self, transport: Transport, sensor_id: str, msg: Message) -> None:
        """Data from a sensor without a hello: hold it, and ask the sensor to say hello."""
        self.stats.before_hello += 1
        now = time.monotonic()
        new = sensor_id not in self.discovery
        request = self.discovery.hold(sensor_id, msg, now)
        if new and now - self._started < self.progress_policy.idle_timeout_s:
            self._hold_streams(sensor_id)
        while self.discovery.evicted:
            self._unhold_streams(self.discovery.evicted.pop())
        if request is None:
            return
        try:
            await transport.send(sensor_id, request)
            self.stats.controls_sent += 1
        except (TransportUnavailable, TransportClosed, ValueError, TypeError) as exc:
            self.stats.send_failures += 1
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
        if sensor_id in self._holding:
            return
        self._holding.add(sensor_id)
        key = _PendingHello(sensor_id)
        for stream in self.fjord.streams:
            self.fjord.heartbeat(stream, key, -math.inf)  # holds it until it reports

    def _unhold_streams(self, sensor_id: str) -> None:
        if sensor_id not in self._holding:
            return
        self._holding.discard(sensor_id)
        key = _PendingHello(sensor_id)
        for stream in self.fjord.streams:
            self.fjord.release(stream, key, forget=True)

    def _handle(
        self, transport: Transport, sensor_id: str, msg: Message
    ) -> list[tuple[SensorProxy, SendControl]]:
        self.stats.messages += 1
        now = self.now()
        proxy = self.proxies.get(sensor_id)
        if proxy is None:
            if not isinstance(msg, Hello):
                self.stats.no_proxy += 1
                self._drop_once(
                    "no_proxy", "data from %r dropped: its hello was refused", sensor_id
                )
                return []
            proxy = self._create(msg, now)
            if proxy is not None:
                self._transport_of[sensor_id] = transport
                self._heard_wall[sensor_id] = self.wall_clock()
            return []
        self._transport_of[sensor_id] = transport
        self._heard_wall[sensor_id] = self.wall_clock()
        guard = self._guards.get(proxy.stream)
        t = _message_time(msg)
        if guard is not None:
            guard.begin()
            if t is not None and not guard.plausible(proxy.progress_key, t):
                t = None  # an outlier is never "now" (its readings are rejected below)
        if t is not None and t > self._stream_time:
            if self._stream_time == -math.inf and self.clock is None:
                for p in self.proxies.values():  # heard "at 0" before stream time began
                    p.last_heard = max(p.last_heard, t)
            self._stream_time = t
        actions = proxy.on_message(msg, self.now(), wall=self.wall_clock())
        return self._enqueue(actions, proxy)

    def _drop_once(self, kind: str, message: str, *args: object) -> None:
        """Log the first drop of each kind (the counters tell the rest)."""
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning(message + " (logged once; see the counters)", *args)

    def _hello_too_large(self, hello: Hello) -> str | None:
        n = self.max_hello_attributes
        if len(hello.attributes) > n or len(hello.schema) > n or len(hello.programs) > n:
            return f"more than {n} attributes, fields or programs"
        size = len(msgspec.msgpack.encode(hello))
        if size > self.max_hello_bytes:
            return f"{size} bytes, more than {self.max_hello_bytes}"
        return None

    def _create(
        self, hello: Hello, now: float, *, stream: str | None = None, programmable: bool = True
    ) -> SensorProxy | None:
        if len(self.proxies) >= self.max_sensors:
            self.stats.catalog_full += 1
            self._drop_once(
                "catalog_full",
                "sensor %r rejected: the catalog holds max_sensors=%d sensors already",
                hello.sensor_id,
                self.max_sensors,
            )
            return None
        why = self._hello_too_large(hello)
        if why is not None:
            self.stats.oversize_hellos += 1
            self._drop_once(
                "oversize_hello", "sensor %r rejected: hello of %s", hello.sensor_id, why
            )
            return None
        if stream is None:
            stream = self.stream_for(hello)
        if stream is None or stream not in self.fjord.streams:
            self.stats.rejected_hellos += 1
            log.warning("sensor %r: no stream for it (stream_for gave %r)", hello.sensor_id, stream)
            return None
        info = self.fjord.streams[stream].info
        pair = None
        try:
            if is_pair(hello):
                pair_id = str(hello.attributes["pair"])
                pair = self.pairs.get(pair_id)
                if pair is None:
                    sep = hello.attributes["separation_ft"]
                    if isinstance(sep, bool) or not isinstance(sep, int | float) or sep <= 0:
                        raise ProxyError(f"separation_ft must be a positive number, not {sep!r}")
                    if info.sensor_field is None:
                        raise ProxyError(f"stream {stream!r} needs a sensor field for pair ids")
                    pair = PairJoin(
                        pair_id,
                        float(sep),
                        schema=info.schema,
                        pair_field=info.sensor_field,
                        max_travel_s=self.max_travel_s,
                    )
                    self.pairs[pair_id] = pair
            proxy = SensorProxy(
                hello,
                stream=stream,
                schema=info.schema,
                sensor_field=info.sensor_field,
                now=now,
                pair=pair,
                wall=self.wall_clock(),
                **(
                    self.proxy_options if programmable else {**self.proxy_options, "control": False}
                ),
            )
        except (ProxyError, ValueError) as exc:
            self.stats.rejected_hellos += 1
            log.warning("sensor %r rejected: %s", hello.sensor_id, exc)
            return None
        self.proxies[hello.sensor_id] = proxy
        info.sensors[hello.sensor_id] = dict(proxy.static)
        guard = self._guards.get(stream)
        if guard is None:
            guard = self._guards[stream] = ProgressTracker(policy=self.progress_policy)
        key = proxy.progress_key
        proxy.admit = lambda t: guard.observe(key, t)
        # A sensor that said hello feeds the stream from now on: windows wait for its first
        # readings (at most the idle timeout, in gateway time), instead of closing without them.
        self._push(PushHeartbeat(stream, key, -math.inf))
        for action in proxy.progress_actions():
            self._push(action)
        self._sync_demands()  # (queries changed without `queries_changed` still count)
        self._demands.add_sensor(hello.sensor_id, stream, proxy.view)
        self._update_demand(proxy, now)
        if self.on_catalog_change is not None:
            self.on_catalog_change(False)
        return proxy

    def forget(self, sensor_id: str) -> None:
        """Remove a sensor from the catalog and from its stream's progress."""
        proxy = self.proxies.pop(sensor_id, None)
        self._demands.remove_sensor(sensor_id)
        self._stale.pop(sensor_id, None)
        self._fixed.discard(sensor_id)
        self._transport_of.pop(sensor_id, None)
        self._heard_wall.pop(sensor_id, None)
        if proxy is None:
            return
        if self.on_catalog_change is not None:
            self.on_catalog_change(True)
        stream = self.fjord.streams.get(proxy.stream)
        if stream is not None:
            stream.info.sensors.pop(sensor_id, None)
        key = proxy.progress_key
        if not any(p.progress_key == key for p in self.proxies.values()):
            if proxy.stream in self.fjord.streams:
                self.fjord.release(proxy.stream, key, forget=True)
            guard = self._guards.get(proxy.stream)
            if guard is not None:
                guard.forget(key)
            if proxy.pair is not None:
                self.pairs.pop(proxy.pair.pair_id, None)

    def _forget_silent(self) -> None:
        limit = self.forget_offline_after_s
        if not math.isfinite(limit):
            return
        now = self.wall_clock()
        gone = [sid for sid, t in self._heard_wall.items() if now - t > limit]
        for sid in gone:
            self.stats.forgotten += 1
            log.info("sensor %r forgotten: not heard from for %g s", sid, limit)
            self.forget(sid)

    def what_if(self, demand: Demand) -> list[dict[str, Any]]:
        """EXPLAIN: the sensors whose program or rate would change if a query with `demand`
        were added, with the cost model's power and battery life before and after."""
        changes = []
        for sid in sorted(self.proxies):
            proxy = self.proxies[sid]
            if proxy.stream != demand.stream or proxy.choice is None or sid in self._fixed:
                continue
            extra = analyse("__explain__", demand, proxy.view)
            after = proxy.what_if(self._demands.demand(sid, extra))
            before = proxy.choice
            if after.key() == before.key():
                continue
            changes.append(
                {
                    "sensor": sid,
                    "before": _summary(before, proxy.profile),
                    "after": _summary(after, proxy.profile),
                    "reason": after.reason,
                }
            )
        return changes

    def _update_demand(self, proxy: SensorProxy, now: float) -> None:
        demand = self._demands.demand(proxy.sensor_id)
        if demand != proxy.demand or proxy.choice is None:
            self.stats.demand_updates += 1
            proxy.set_demand(demand, now)

    # -- output ----------------------------------------------------------------------------
    def _enqueue(
        self, actions: list[Action], proxy: SensorProxy | None = None
    ) -> list[tuple[SensorProxy, SendControl]]:
        controls: list[tuple[SensorProxy, SendControl]] = []
        put = self._outbox.put_nowait
        for a in actions:
            if a.__class__ is SendControl:
                assert proxy is not None
                controls.append((proxy, a))  # type: ignore[arg-type]
            elif not put(a):
                self.stats.outbox_drops += 1
                self._drop_once("outbox", "proxy outbox full: dropping the oldest tuples")
        return controls

    async def _send(self, proxy: SensorProxy, action: SendControl) -> None:
        transport = self._transport_of.get(action.sensor_id)
        control: Control = action.control
        if transport is None:
            return
        try:
            await transport.send(action.sensor_id, control)
            self.stats.controls_sent += 1
        except (TransportUnavailable, TransportClosed) as exc:
            self.stats.send_failures += 1
            proxy.on_send_failed(control, str(exc), permanent=False, now=self.now())
        except (ValueError, TypeError) as exc:  # cannot be encoded, or the link rejects it
            self.stats.send_failures += 1
            log.warning("control for %r cannot be sent: %s", action.sensor_id, exc)
            proxy.on_send_failed(control, str(exc), permanent=True, now=self.now())

    async def _pump(self) -> None:
        try:
            while True:
                first = await self._outbox.get()
                self._push(first)
                for item in self._outbox.drain():
                    self._push(item)
                await asyncio.sleep(0)
        except TransportClosed:  # the outbox was closed: the readers are done
            self._flush()

    def _flush(self) -> None:
        for item in self._outbox.drain():
            self._push(item)

    def _push(self, item: Action) -> None:
        if item.__class__ is PushRow:
            self.fjord.push(item.stream, item.row)  # type: ignore[union-attr]
            self.stats.pushed_tuples += 1
        elif item.__class__ is PushHeartbeat:
            self.fjord.heartbeat(item.stream, item.sensor, item.time)  # type: ignore[union-attr]
            self.stats.pushed_heartbeats += 1
        elif item.__class__ is PushPace:
            self.fjord.pace(item.stream, item.sensor, item.gap_s)  # type: ignore[union-attr]
            guard = self._guards.get(item.stream)  # type: ignore[union-attr]
            if guard is not None:  # the future bound allows a message gap too
                guard.pace(item.sensor, item.gap_s)  # type: ignore[union-attr]
        elif item.__class__ is PushRelease:
            self.fjord.release(item.stream, item.sensor)  # type: ignore[union-attr]

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            self.tick()

    def flush_pairs(self) -> None:
        """End of input: vehicles still waiting for a partner come out alone."""
        for pair in self.pairs.values():
            proxy = next((p for p in self.proxies.values() if p.pair is pair), None)
            if proxy is not None:
                for row in pair.flush():
                    self._outbox.put_nowait(PushRow(proxy.stream, row))
        self._flush()


def _summary(choice: ProgramChoice, profile: str) -> dict[str, Any]:
    p = choice.prediction
    if p is not None:
        power, days = p.power_mw, p.lifetime_days
    elif choice.program == "sleep":
        # Asleep: the processor idles, the radio is off (the wake-ups every few seconds to check
        # are brief enough to leave out).
        prof = resolve_profile(profile)
        power = prof.cpu_idle_mw
        days = Battery.of(prof).lifetime_s(power) / 86_400.0
    else:
        power = days = None
    return {
        "program": choice.program,
        "sample_rate_hz": choice.rate_hz,
        "power_mw": power,
        "battery_days": days,
    }


def _message_time(msg: Message) -> float | None:
    """The latest sample time a message carries, or a listen's clock (None for hello, ack,
    a listen without time...)."""
    t: float | None = None
    if isinstance(msg, Listen):
        t = msg.time
    elif isinstance(msg, Samples) and msg.times:
        t = max(msg.times)
    elif isinstance(msg, Events) and msg.times:
        t = max((x[-1] for x in msg.times if x), default=None)
    elif isinstance(msg, AggregateReport):
        t = msg.end
    if t is None or not math.isfinite(t):
        return None
    return t


@dataclass(frozen=True, slots=True)
class _PendingHello:
    """The progress key of a sensor held in discovery: never equal to a sensor's own key."""

    sensor_id: str
