"""`SensorRegistry`: the catalog of sensors, one proxy each: who joins, who is forgotten.

A hello makes a sensor's proxy (`create`) on the stream `stream_for` names, with its stream's
clock guard as the future bound of its readings; a loop pair's two motes share one `PairJoin`.
From then on the sensor feeds its stream: windows wait for its first readings (at most the
progress policy's idle timeout) instead of closing without them, and its demand comes from the
fan-out. Plain devices (a transport that implies their hello) take no controls: they are
`fixed`, and the catalog marks them `"programmable": false`.

Bounds (the catalog cannot grow without limit): at most `max_sensors` proxies; when full, a new
hello takes the place of the unconfirmed sensor heard from longest ago (one that sent nothing
after its hello: made-up ids that said hello and nothing more), else it is rejected
(`stats.catalog_full`); a hello whose attributes, schema or programs exceed
`max_hello_attributes` entries or whose encoding exceeds `max_hello_bytes` is rejected
(`stats.oversize_hellos`); a sensor not heard from for `forget_offline_after_s` of gateway time
(`wall_clock`) is forgotten: removed from the catalog, from its stream's progress and its clock
guard. `on_catalog_change(removed)` is told of every sensor that joins or leaves.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from fjords.runtime.fjord import Fjord
from proxies.actions import PushHeartbeat, PushRow
from proxies.clock import ClockGuards, StreamClock
from proxies.fanout import DemandFanOut
from proxies.outbox import Outbox
from proxies.pair import PAIR_ATTRIBUTES, PairJoin
from proxies.proxy import ProxyError, SensorProxy
from proxies.stats import DropLog, ManagerStats, RateLimitedLog
from sensors.protocol import Hello

__all__ = ["SensorRegistry", "StreamFor", "default_stream_for", "is_pair"]

log = logging.getLogger("proxies")

#: Messages after its hello (or a plain device's first) from which a sensor is no longer
#: evicted for a newcomer.
CONFIRMED = 1

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


class SensorRegistry:
    """See the module docstring. `proxy_options` are the `SensorProxy` settings every proxy
    gets; `heard_wall` is the wall-clock time each sensor was last heard (the intake's)."""

    def __init__(
        self,
        fjord: Fjord,
        *,
        outbox: Outbox,
        guards: ClockGuards,
        fanout: DemandFanOut,
        clock: StreamClock,
        stats: ManagerStats,
        stream_for: StreamFor,
        proxy_options: Mapping[str, Any],
        wall_clock: Callable[[], float],
        max_travel_s: float = 0.5,
        max_sensors: int = 10_000,
        forget_offline_after_s: float = 86_400.0,
        max_hello_attributes: int = 64,
        max_hello_bytes: int = 4096,
        on_catalog_change: Callable[[bool], None] | None = None,
    ) -> None:
        self._fjord = fjord
        self._outbox = outbox
        self._guards = guards
        self._fanout = fanout
        self._clock = clock
        self._stats = stats
        self._drops = DropLog(log)
        self.stream_for = stream_for
        self.proxy_options = dict(proxy_options)
        self.wall_clock = wall_clock
        self.max_travel_s = max_travel_s
        self.max_sensors = max_sensors
        self.forget_offline_after_s = forget_offline_after_s
        self.max_hello_attributes = max_hello_attributes
        self.max_hello_bytes = max_hello_bytes
        self.on_catalog_change = on_catalog_change
        self.proxies: dict[str, SensorProxy] = {}
        self.pairs: dict[str, PairJoin] = {}
        self.fixed: set[str] = set()  # sensors that take no controls (plain devices)
        self.heard_wall: dict[str, float] = {}
        self.swept_at = -math.inf  # stream clock time of the last liveness sweep
        self._stall_log = RateLimitedLog(log, "sensors stalled or resumed")

    def programmable(self, sensor_id: str) -> bool:
        """Whether the sensor takes controls (plain devices do not)."""
        return sensor_id not in self.fixed

    # -- joining -------------------------------------------------------------------------
    def create(
        self, hello: Hello, now: float, *, stream: str | None = None, programmable: bool = True
    ) -> SensorProxy | None:
        """The sensor's proxy from its first hello, on `stream` (default: `stream_for`'s); None
        when the hello is rejected (counted and logged)."""
        if len(self.proxies) >= self.max_sensors and not self._evict_unconfirmed(hello.sensor_id):
            self._stats.catalog_full += 1
            self._drops.once(
                "catalog_full",
                "sensor %r rejected: the catalog holds max_sensors=%d sensors already",
                hello.sensor_id,
                self.max_sensors,
            )
            return None
        why = self._hello_too_large(hello)
        if why is not None:
            self._stats.oversize_hellos += 1
            self._drops.once(
                "oversize_hello", "sensor %r rejected: hello of %s", hello.sensor_id, why
            )
            return None
        if stream is None:
            stream = self.stream_for(hello)
        if stream is None or stream not in self._fjord.streams:
            self._stats.rejected_hellos += 1
            log.warning("sensor %r: no stream for it (stream_for gave %r)", hello.sensor_id, stream)
            return None
        info = self._fjord.streams[stream].info
        try:
            pair = self._pair_of(hello, stream) if is_pair(hello) else None
            proxy = SensorProxy(
                hello,
                stream=stream,
                schema=info.schema,
                sensor_field=info.sensor_field,
                now=now,
                pair=pair,
                wall=self.wall_clock(),
                admit=self._guards.admit_for(stream),
                **(
                    self.proxy_options if programmable else {**self.proxy_options, "control": False}
                ),
            )
        except (ProxyError, ValueError) as exc:
            self._stats.rejected_hellos += 1
            log.warning("sensor %r rejected: %s", hello.sensor_id, exc)
            return None
        self.proxies[hello.sensor_id] = proxy
        if not programmable:
            self.fixed.add(hello.sensor_id)
        info.sensors[hello.sensor_id] = dict(proxy.static)
        # A sensor that said hello feeds the stream from now on: windows wait for its first
        # readings (at most the idle timeout, in gateway time), instead of closing without them.
        self._outbox.push(PushHeartbeat(stream, proxy.progress_key, -math.inf))
        for action in proxy.progress_actions():
            self._outbox.push(action)
        self._fanout.add(proxy, now)
        if self.on_catalog_change is not None:
            self.on_catalog_change(False)
        return proxy

    def _evict_unconfirmed(self, newcomer: str) -> bool:
        """Make room for `newcomer`: forget the unconfirmed sensor heard from longest ago."""
        heard = self.heard_wall
        victims = [sid for sid, p in self.proxies.items() if p.stats.messages < CONFIRMED]
        if not victims:
            return False
        gone = min(victims, key=lambda sid: heard.get(sid, -math.inf))
        self._stats.evicted_unconfirmed += 1
        self._drops.once(
            "evicted_unconfirmed",
            "catalog full (max_sensors=%d): sensor %r, which said hello and little more, "
            "forgotten to make room for %r",
            self.max_sensors,
            gone,
            newcomer,
        )
        self.forget(gone)
        return True

    def _pair_of(self, hello: Hello, stream: str) -> PairJoin:
        """The loop pair the mote belongs to (made, and kept, at its first mote's hello)."""
        pair_id = str(hello.attributes["pair"])
        pair = self.pairs.get(pair_id)
        if pair is not None:
            return pair
        sep = hello.attributes["separation_ft"]
        if isinstance(sep, bool) or not isinstance(sep, int | float) or sep <= 0:
            raise ProxyError(f"separation_ft must be a positive number, not {sep!r}")
        info = self._fjord.streams[stream].info
        if info.sensor_field is None:
            raise ProxyError(f"stream {stream!r} needs a sensor field for pair ids")
        pair = self.pairs[pair_id] = PairJoin(
            pair_id,
            float(sep),
            schema=info.schema,
            pair_field=info.sensor_field,
            max_travel_s=self.max_travel_s,
        )
        return pair

    def _hello_too_large(self, hello: Hello) -> str | None:
        n = self.max_hello_attributes
        if len(hello.attributes) > n or len(hello.schema) > n or len(hello.programs) > n:
            return f"more than {n} attributes, fields or programs"
        size = len(msgspec.msgpack.encode(hello))
        if size > self.max_hello_bytes:
            return f"{size} bytes, more than {self.max_hello_bytes}"
        return None

    # -- leaving -------------------------------------------------------------------------
    def forget(self, sensor_id: str) -> None:
        """Remove a sensor from the catalog and from its stream's progress."""
        proxy = self.proxies.pop(sensor_id, None)
        self._fanout.remove(sensor_id)
        self.fixed.discard(sensor_id)
        self._outbox.forget(sensor_id)
        self.heard_wall.pop(sensor_id, None)
        if proxy is None:
            return
        if self.on_catalog_change is not None:
            self.on_catalog_change(True)
        stream = self._fjord.streams.get(proxy.stream)
        if stream is not None:
            stream.info.sensors.pop(sensor_id, None)
        key = proxy.progress_key
        if not any(p.progress_key == key for p in self.proxies.values()):
            if proxy.stream in self._fjord.streams:
                self._fjord.release(proxy.stream, key, forget=True)
            self._guards.forget(proxy.stream, key)
            if proxy.pair is not None:
                self.pairs.pop(proxy.pair.pair_id, None)

    def forget_silent(self) -> None:
        """Forget the sensors not heard from for `forget_offline_after_s` of wall-clock time."""
        limit = self.forget_offline_after_s
        if not math.isfinite(limit):
            return
        now = self.wall_clock()
        gone = [sid for sid, t in self.heard_wall.items() if now - t > limit]
        for sid in gone:
            self._stats.forgotten += 1
            log.info("sensor %r forgotten: not heard from for %g s", sid, limit)
            self.forget(sid)

    # -- every sensor ----------------------------------------------------------------------
    def sweep(self) -> None:
        """Check every proxy for silence now (liveness: offline after missed periods)."""
        now = self._clock.now()
        self.swept_at = now
        wall = self.wall_clock()
        put = self._outbox.put
        for proxy in self.proxies.values():
            was = proxy.stall.stalled
            put(proxy.tick(now, wall=wall))
            if proxy.stall.stalled != was:
                self.stall_changed(proxy, was)
        self._stall_log.flush(wall)

    def stall_changed(self, proxy: SensorProxy, was: bool) -> None:
        """A sensor stalled (its data stopped while the gateway counts on it) or resumed:
        counted, and logged (at most a few lines a minute; then how many more)."""
        stall = proxy.stall
        if stall.stalled:
            self._stats.stalls += 1
            self._stall_log.log(
                self.wall_clock(), logging.WARNING, "sensor %r stalled: %s", proxy.sensor_id,
                stall.why,
            )  # fmt: skip
        elif was:
            self._stall_log.log(
                self.wall_clock(), logging.INFO, "sensor %r resumed: %s", proxy.sensor_id,
                proxy.history[-1][2] if proxy.history else "data again",
            )  # fmt: skip

    def stalled(self) -> list[str]:
        """The sensors whose data stopped while the gateway counts on it, by id."""
        return sorted(sid for sid, p in self.proxies.items() if p.stall.stalled)

    def unpaired(self) -> list[PushRow]:
        """End of input: the vehicles still waiting for a partner, to come out alone."""
        rows = []
        for pair in self.pairs.values():
            proxy = next((p for p in self.proxies.values() if p.pair is pair), None)
            if proxy is not None:
                rows += [PushRow(proxy.stream, row) for row in pair.flush()]
        return rows
