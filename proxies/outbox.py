"""`Outbox`: where the proxies' actions go out, into the Fjord and to the sensors.

Tuples, heartbeats, paces and releases pass one bounded queue (drop oldest, counted in
`stats.outbox_drops`) that the intake flushes into the Fjord as soon as a message is handled (a
push only appends to the stream's queue); the pump task flushes what ticks and query changes
put there. Controls are sent one at a time, in the order the proxies asked for them, by one
sender task, on the transport each sensor was last heard on (`routes`, kept by the intake): a
control that cannot be sent is handed back to its proxy (`on_send_failed`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from fjords.runtime.fjord import Fjord
from proxies.actions import Action, PushHeartbeat, PushPace, PushRelease, PushRow, SendControl
from proxies.clock import ClockGuards, StreamClock
from proxies.proxy import SensorProxy
from proxies.stats import DropLog, ManagerStats
from sensors.protocol import Control
from sensors.transports.base import (
    DropOldestQueue,
    Transport,
    TransportClosed,
    TransportUnavailable,
)

__all__ = ["Outbox"]

log = logging.getLogger("proxies")

Outgoing = tuple[SensorProxy, SendControl]


class Outbox:
    """See the module docstring."""

    def __init__(
        self,
        fjord: Fjord,
        guards: ClockGuards,
        clock: StreamClock,
        stats: ManagerStats,
        *,
        bound: int,
    ) -> None:
        self._fjord = fjord
        self._guards = guards
        self._clock = clock
        self._stats = stats
        self._drops = DropLog(log)
        self._queue: DropOldestQueue[Action] = DropOldestQueue(bound)
        self.routes: dict[str, Transport] = {}  # sensor -> the transport it was last heard on
        self._controls: asyncio.Queue[Outgoing] = asyncio.Queue()
        self._sending = 0

    @property
    def pending(self) -> bool:
        """Whether anything is still on its way out (queued pushes, controls to send)."""
        return bool(len(self._queue) or self._sending or self._controls.qsize())

    # -- into the Fjord --------------------------------------------------------------------
    def put(self, actions: Iterable[Action], proxy: SensorProxy | None = None) -> list[Outgoing]:
        """Queue `proxy`'s pushes; returns its controls, for the caller to `send` once the
        pushes are flushed."""
        controls: list[Outgoing] = []
        put = self._queue.put_nowait
        for a in actions:
            if a.__class__ is SendControl:
                assert proxy is not None
                controls.append((proxy, a))
            elif not put(a):
                self._stats.outbox_drops += 1
                self._drops.once("outbox", "proxy outbox full: dropping the oldest tuples")
        return controls

    def push(self, item: Action) -> None:
        """Into the Fjord now (dispatch on the exact class: this runs for every tuple)."""
        if item.__class__ is PushRow:
            self._fjord.push(item.stream, item.row)
            self._stats.pushed_tuples += 1
        elif item.__class__ is PushHeartbeat:
            self._fjord.heartbeat(item.stream, item.sensor, item.time)
            self._stats.pushed_heartbeats += 1
        elif item.__class__ is PushPace:
            self._fjord.pace(item.stream, item.sensor, item.gap_s, item.every)
            self._guards.pace(item.stream, item.sensor, item.gap_s)
        elif item.__class__ is PushRelease:
            self._fjord.release(item.stream, item.sensor)

    def flush(self) -> None:
        for item in self._queue.drain():
            self.push(item)

    async def pump(self) -> None:
        """Flush what arrives until `close`, then what is left."""
        try:
            while True:
                first = await self._queue.get()
                self.push(first)
                for item in self._queue.drain():
                    self.push(item)
                await asyncio.sleep(0)
        except TransportClosed:  # closed: the readers are done
            self.flush()

    def close(self) -> None:
        self._queue.close()

    # -- to the sensors --------------------------------------------------------------------
    def send(self, controls: list[Outgoing]) -> None:
        """Queue controls for the sender task, in order."""
        for control in controls:
            self._controls.put_nowait(control)

    async def sent(self) -> None:
        """Until every control queued so far is sent (or failed)."""
        await self._controls.join()

    def forget(self, sensor_id: str) -> None:
        self.routes.pop(sensor_id, None)

    async def sender(self) -> None:
        """Send the proxies' controls one at a time, in the order they were asked for."""
        while True:
            proxy, action = await self._controls.get()
            self._sending += 1
            try:
                await self._send(proxy, action)
            except Exception:  # a bug in a transport: count it, keep sending the others
                self._stats.errors += 1
                log.exception("sending a control to %r failed", action.sensor_id)
            finally:
                self._sending -= 1
                self._controls.task_done()
            # A cancel can be swallowed below us (Python 3.11's asyncio.wait_for, used by aiomqtt,
            # loses one that races with the publish completing): honour it here, or the
            # manager's shutdown waits on this task forever (the daemon would ignore SIGTERM).
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                raise asyncio.CancelledError

    async def _send(self, proxy: SensorProxy, action: SendControl) -> None:
        transport = self.routes.get(action.sensor_id)
        control: Control = action.control
        if transport is None:  # forgotten meanwhile
            return
        try:
            await transport.send(action.sensor_id, control)
            self._stats.controls_sent += 1
        except (TransportUnavailable, TransportClosed) as exc:
            self._stats.send_failures += 1
            proxy.on_send_failed(control, str(exc), permanent=False, now=self._clock.now())
        except (ValueError, TypeError) as exc:  # cannot be encoded, or the link rejects it
            self._stats.send_failures += 1
            log.warning("control for %r cannot be sent: %s", action.sensor_id, exc)
            proxy.on_send_failed(control, str(exc), permanent=True, now=self._clock.now())
