"""The result sinks of every query: created from the specs a query was registered with, run as
tasks this manager owns, stopped when their query goes, and counted for /metrics and GET.

`async with SinkManager(...)`: entering starts the sinks already attached; leaving lets each sink
flush what its queue holds (bounded by `grace_s`), then stops it. A sink whose code fails is
logged, counted (`restarts`) and started again with backoff; its destination failing is the
sink's own business (retries, drops), never the Fjord's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeGuard

from fjords.errors import QueryError
from fjords.supervision import log_task_failure
from gateway.sinks.address_policy import AddressPolicy, Refused, parse_address
from gateway.sinks.base import ResultSink
from gateway.sinks.files import FileSink
from gateway.sinks.mqtt import MqttSink, MqttSinks
from gateway.sinks.spec import (
    FileSinkSpec,
    MqttSinkSpec,
    PolicyRefused,
    SinkSettings,
    SinkSpec,
    WebhookSinkSpec,
    check,
    decode_specs,
)
from gateway.sinks.webhook import WebhookSink

if TYPE_CHECKING:
    from gateway.config import MqttConfig
    from gateway.results import ResultHub

log = logging.getLogger("gateway.sinks")

Key = tuple[str, str]  # (stage, reason)
_SPEC_TYPES = (MqttSinkSpec, WebhookSinkSpec, FileSinkSpec)


def _typed_specs(raw: object) -> TypeGuard[list[SinkSpec]]:
    """Specs already decoded (a client's body); saved options hold builtins instead."""
    return isinstance(raw, list) and all(isinstance(s, _SPEC_TYPES) for s in raw)


class SinkManager:
    def __init__(
        self,
        hub: ResultHub,
        settings: SinkSettings | None = None,
        mqtt: MqttConfig | None = None,
        *,
        grace_s: float = 5.0,
    ) -> None:
        self.hub = hub
        self.settings = settings or SinkSettings()
        self.mqtt_config = mqtt
        self.grace_s = grace_s
        self.link: MqttSinks | None = None
        self.sinks: dict[str, list[ResultSink]] = {}
        self.restarts = 0
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[Any]] = set()  # sinks stopping, the link starting
        self._closed_counts: dict[Key, int] = {}  # drops of sinks already gone (never shrink)
        self._retiring: set[ResultSink] = set()  # detached, still flushing
        self._entered = False
        #: where webhooks may go; the gateway adds its HTTP port once bound
        self.policy = AddressPolicy.from_entries(self.settings.webhook_hosts)
        #: webhooks the address policy refused, by when: "registration" or "connect"
        self.refused: dict[str, int] = {"registration": 0, "connect": 0}

    # -- what the gateway calls -----------------------------------------------------------
    def validate(self, raw: object) -> list[SinkSpec]:
        """Specs (typed or saved builtins) checked against this gateway; QueryError if bad."""
        specs = raw if _typed_specs(raw) else decode_specs(raw)
        try:
            check(specs, self.settings, have_mqtt=self.mqtt_config is not None, policy=self.policy)
        except PolicyRefused as e:
            self._count_refused("registration", str(e))
            raise
        return specs

    async def check_resolved(self, specs: list[SinkSpec], timeout_s: float = 5.0) -> None:
        """The addresses webhook hosts resolve to now, checked (a POST's sinks, after
        `validate`): PolicyRefused if none may be connected to. A name that does not resolve
        now is left to the check at connect time."""
        for i, spec in enumerate(specs):
            if not isinstance(spec, WebhookSinkSpec):
                continue
            target = self.policy.check_url(spec.url)
            if target.address is not None or target.named:
                continue
            resolver = WebhookSink.make_resolver()
            try:
                found = await asyncio.wait_for(
                    resolver.resolve(target.host, target.port, socket.AF_UNSPEC), timeout_s
                )
            except (OSError, TimeoutError):
                continue
            finally:
                await resolver.close()
            addresses = [parse_address(r["host"].split("%", 1)[0]) for r in found]
            try:
                self.policy.allowed(target, [a for a in addresses if a is not None])
            except Refused as e:
                message = f"sinks[{i}].url: {e}"
                self._count_refused("registration", message)
                raise PolicyRefused(message) from None

    def _count_refused(self, when: str, message: str) -> None:
        level = logging.WARNING if not any(self.refused.values()) else logging.DEBUG
        self.refused[when] += 1
        log.log(level, "webhook refused at %s: %s", when, message)

    def attach(
        self,
        query_id: str,
        raw_specs: object,
        group_columns: Callable[[], tuple[str, ...]] = tuple,
    ) -> None:
        """Start the query's sinks; raises QueryError (nothing attached) for a bad spec."""
        specs = self.validate(raw_specs)
        if not specs:
            return
        if query_id in self.sinks:
            raise QueryError(f"query {query_id!r} already has sinks")
        made: list[ResultSink] = []
        try:
            for spec in specs:
                made.append(self._make(query_id, spec, group_columns))
        except BaseException:
            for sink in made:
                if sink.sub is not None:
                    sink.sub.close()
            raise
        self.sinks[query_id] = made
        if self._entered:
            for sink in made:
                self._start(sink)

    def _make(
        self, query_id: str, spec: SinkSpec, group_columns: Callable[[], tuple[str, ...]]
    ) -> ResultSink:
        if isinstance(spec, FileSinkSpec):
            assert self.settings.dir is not None  # check() refused it otherwise
            sub = self.hub.subscribe(query_id, spec.queue_rows)
            try:
                return FileSink(query_id, spec, sub, self.settings.dir)
            except OSError as e:
                sub.close()
                raise QueryError(f"file sink: cannot create its directory: {e}") from e
        if isinstance(spec, WebhookSinkSpec):
            return WebhookSink(
                query_id,
                spec,
                self.hub.subscribe(query_id, spec.queue_rows),
                self.settings,
                self.policy,
                on_refused=partial(self._count_connect_refused, query_id),
            )
        link = self._mqtt_link()
        sink = MqttSink(
            query_id,
            spec,
            self.hub.subscribe(query_id, 10_000),
            link,
            group_columns(),
            max_groups=self.settings.mqtt_max_groups,
        )
        link.add(sink)
        return sink

    def _count_connect_refused(self, query_id: str) -> None:
        self.refused["connect"] += 1

    def _mqtt_link(self) -> MqttSinks:
        if self.link is None:
            assert self.mqtt_config is not None
            self.link = MqttSinks(self.mqtt_config, self.settings.mqtt_topic_prefix)
            if self._entered:
                self._start_link()
        return self.link

    def detach(self, query_id: str) -> None:
        """The query is gone: its sinks flush (bounded) and stop in the background."""
        for sink in self.sinks.pop(query_id, []):
            self._retiring.add(sink)
            task = asyncio.ensure_future(self._stop(sink, retract=True))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            task.add_done_callback(partial(log_task_failure, logger=log))

    def describe(self, query_id: str) -> list[dict[str, Any]]:
        """Each sink's spec and state (rows sent, dropped, last error), for GET /queries/{id}."""
        return [s.describe() for s in self.sinks.get(query_id, [])]

    def drop_counts(self) -> dict[Key, int]:
        """Drops of every sink ever run, by (stage, reason); they only grow."""
        out = dict(self._closed_counts)
        for sink in [*(s for group in self.sinks.values() for s in group), *self._retiring]:
            for reason, n in sink.dropped.items():
                out[sink.stage, reason] = out.get((sink.stage, reason), 0) + n
        return out

    def health(self) -> list[str]:
        if self.link is not None and self.link.running and self.link.sinks:
            return self.link.health()
        return []

    # -- tasks --------------------------------------------------------------------------------
    def _start(self, sink: ResultSink) -> None:
        task = asyncio.ensure_future(self._keep(sink))
        task.set_name(f"sink {sink.kind} {sink.query_id}")
        self._tasks[id(sink)] = task

    def _start_link(self) -> None:
        assert self.link is not None
        task = asyncio.ensure_future(self.link.__aenter__())
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(partial(log_task_failure, logger=log))

    async def _keep(self, sink: ResultSink) -> None:
        delay = 0.5
        while True:
            try:
                await sink.run()
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a bug in the sink: logged, counted, started again
                self.restarts += 1
                sink.error(f"{type(e).__name__}: {e}"[:300])
                log.error("sink %s of query %s failed; restarting", sink.kind, sink.query_id,
                          exc_info=e)  # fmt: skip
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)

    async def _stop(self, sink: ResultSink, retract: bool = False) -> None:
        """Close its queue (what is in it is still delivered), wait `grace_s`, then stop it;
        `retract`: the query is gone (its retained MQTT values are cleared)."""
        if sink.sub is not None:
            sink.sub.close()
        task = self._tasks.pop(id(sink), None)
        if task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(task), self.grace_s)
            except TimeoutError:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            except Exception:  # noqa: BLE001 - already logged by _keep
                pass
        try:
            await sink.close()
        except Exception as e:  # noqa: BLE001
            log.error("closing sink %s of query %s: %r", sink.kind, sink.query_id, e)
        if retract and isinstance(sink, MqttSink) and self.link is not None:
            self.link.remove(sink)
        for reason, n in sink.dropped.items():
            key = (sink.stage, reason)
            self._closed_counts[key] = self._closed_counts.get(key, 0) + n
        self._retiring.discard(sink)

    async def __aenter__(self) -> SinkManager:
        self._entered = True
        if self.link is not None:
            await self.link.__aenter__()
        for sinks in self.sinks.values():
            for sink in sinks:
                self._start(sink)
        return self

    async def __aexit__(self, *exc: object) -> None:
        sinks = [s for group in self.sinks.values() for s in group]
        self.sinks.clear()
        self._retiring.update(sinks)
        await asyncio.gather(*(self._stop(s) for s in sinks), *self._background)
        if self.link is not None:
            link = self.link
            if link.stats.connected and not link._wake.is_set():
                link.wake()
            with contextlib.suppress(TimeoutError):  # the last values and retractions
                await asyncio.wait_for(link.flushed(), self.grace_s)
            await link.__aexit__(None, None, None)
        self._entered = False
