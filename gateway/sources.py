"""What feeds the gateway's streams, from its configuration: transports, proxies, simulated motes.

Every reading takes the real path: a mote (simulated or not) speaks the wire protocol over a
transport (in-process, MQTT, serial); its proxy (proxies/) turns messages into tuples and pushes
each once into the Fjord, and steers the mote's program and sample rate from the queries.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import functools
import itertools
import logging
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypedDict

import msgspec

from gateway.config import Config, ConfigError, check_regular_file
from gateway.daemon import Gateway
from gateway.fleet import generated_stations, generated_trace
from proxies.manager import ProxyManager
from sensors.motes.mote import Pacer, SimulatedMote
from sensors.motes.pair import TrafficPair
from sensors.motes.replay import TraceReplayFleet, load_stations, load_trace
from sensors.sealing import GatewayAuth
from sensors.transports.inprocess import InProcessHub
from sensors.transports.supervisor import SupervisedTransport

log = logging.getLogger("gateway.sources")

GENERATED_PERIOD_S = 60.0

Fleet = Callable[[], Coroutine[Any, Any, None]]


def configure_sources(gw: Gateway, trace_speedup: float | None = None) -> None:
    """Register one source on the gateway: its transports, their proxies and any simulated fleets
    (a trace replays as fast as it goes, or `trace_speedup` times real time)."""
    cfg = gw.config
    transports: list[SupervisedTransport] = []
    fleets: list[tuple[str, Fleet]] = []
    auth = gw.auth = mote_auth(cfg)
    if cfg.simulation is not None or cfg.trace is not None:
        hub = InProcessHub(queue_bound=cfg.queue_bound)
        hub.mote_keys = cfg.keyring  # the embedded motes are provisioned from the same file
        transports.append(hub)
        if cfg.simulation is not None:
            sim = cfg.simulation
            fleets.append(
                (
                    "generated-fleet",
                    lambda: run_generated_fleet(hub, sim.stations, sim.segments, sim.speedup),
                )
            )
            if sim.traffic_pair:
                fleets.append(("traffic-pair", lambda: run_traffic_pairs(hub)))
        if cfg.trace is not None:
            replay = _replay_fleet(cfg.trace, cfg.stations or "", hub)
            log.info(
                "replaying %s: %d motes, %d samples", cfg.trace, len(replay.motes), replay.samples
            )
            fleets.append(("replay", lambda: replay.run(speedup=trace_speedup)))
    if cfg.mqtt is not None:
        from sensors.transports.mqtt import MqttTransport

        transports.append(
            MqttTransport(
                cfg.mqtt.broker(),
                prefix=cfg.mqtt.topic_prefix,
                qos=cfg.mqtt.qos,
                clean_session=cfg.mqtt.clean_session,
                # Room for a fleet's burst while the Fjord catches up (QoS 0 has no backpressure).
                queue_bound=cfg.queue_bound,
                # the data is left in the broker while the gateway is full
                hold=gw.intake_full,
            )
        )
    for s in cfg.serial:
        from sensors.transports.serial import SerialTransport

        transports.append(SerialTransport(s.device, baudrate=s.baud))
    for t in transports:  # the motes' links (plain devices have no keys)
        t.auth = auth
    if cfg.mqtt is not None and gw.plain_streams:
        transports.append(plain_transport(gw))
    if not transports:
        log.warning("no sensors configured: the gateway serves queries but has no data")
        return
    for t in transports:
        gw.add_link(t)

    async def run(gw: Gateway) -> None:
        """Run by the gateway under supervision: if it fails it is entered again, transports
        included (each is also supervised on its own, so a bad packet never gets this far)."""
        if auth is not None and cfg.state_dir is not None:
            restore_counters(auth, Path(cfg.state_dir))
        async with contextlib.AsyncExitStack() as stack:
            for t in transports:
                await stack.enter_async_context(t)
            manager = await stack.enter_async_context(
                ProxyManager(
                    gw.fjord,
                    transports,
                    standing=gw.demands,  # the archive's and the Spark queries' demands
                    queue_bound=cfg.queue_bound,
                    # A sensor joining or leaving changes the long-lived set as a query does.
                    on_catalog_change=lambda removed: gw.heap_freezer.changed(removed=removed),
                    # [sensors] max_sensors, forget_offline_after_s, once configured
                    **_catalog_bounds(cfg),
                    **_power_settings(cfg),
                    **_stall_settings(cfg),
                )
            )
            gw.attach_proxies(manager)
            if auth is not None:
                auth.on_reject = functools.partial(_count_rejection, manager)
            async with asyncio.TaskGroup() as tg:
                for name, fleet in fleets:
                    tg.create_task(fleet(), name=name)
                if auth is not None and cfg.state_dir is not None:
                    tg.create_task(keep_counters(auth, Path(cfg.state_dir)), name="auth-counters")
                tg.create_task(asyncio.Event().wait(), name="sources")  # until cancelled

    gw.add_source("sensors", run)


def _replay_fleet(trace_path: str, stations_path: str, hub: InProcessHub) -> TraceReplayFleet:
    """The replay of `[replay] trace` (`--trace`) with its stations; whatever is wrong with
    either file (a FIFO, a directory, a device, missing columns, bad numbers, bytes that are
    not text) is a ConfigError naming it. Each is checked to be a regular file before it is
    opened: a FIFO would block the start for ever."""
    loaded: list[Any] = []
    for key, path, load in (
        ("[replay] trace (--trace)", trace_path, load_trace),
        ("[replay] stations (--stations)", stations_path, load_stations),
    ):
        try:
            check_regular_file(path)
            loaded.append(load(path))
        except (OSError, ValueError, csv.Error) as e:  # TraceFormatError, UnicodeDecodeError
            raise ConfigError(f"{key} {path}: {e}") from None
    try:
        return TraceReplayFleet(loaded[0], loaded[1], hub.link)
    except ValueError as e:
        raise ConfigError(f"[replay] trace and stations: {e}") from None


def mote_auth(cfg: Config) -> GatewayAuth | None:
    """The verifier of the motes' messages ([sensors] keys_file, require_mac); without keys,
    mote messages are taken on trust, which is said once at start."""
    if cfg.keyring is None:
        log.warning(
            "mote messages are not authenticated: anyone who can reach the broker or a serial "
            "line can speak for a mote or command it (set [sensors] keys_file)"
        )
        return None
    if not cfg.require_mac:
        log.warning(
            "[sensors] require_mac = false: sealed mote messages are verified, unsealed ones "
            "are accepted (counted in fjords_auth_unsigned_accepted_total)"
        )
    return GatewayAuth(cfg.keyring, require_mac=cfg.require_mac)


#: How often the motes' accepted message counters are saved (a replay of a message captured
#: before a crash is possible only if it is newer than the last save).
COUNTERS_SAVE_S = 2.0


async def keep_counters(auth: GatewayAuth, state_dir: Path) -> None:
    """Save the motes' counters every `COUNTERS_SAVE_S` and at the end, so a restart does
    not reopen replays (`restore_counters` reads them back)."""
    path = _counters_path(state_dir)
    saved = -1
    try:
        while True:
            await asyncio.sleep(COUNTERS_SAVE_S)
            if auth.accepted != saved:
                saved = auth.accepted
                await asyncio.to_thread(_save_counters, path, auth.counters())
    finally:
        _save_counters(path, auth.counters())


def _counters_path(state_dir: Path) -> Path:
    return state_dir.expanduser() / "auth-counters.json"


def restore_counters(auth: GatewayAuth, state_dir: Path) -> None:
    """The counters the previous run saved: only newer messages are accepted."""
    path = _counters_path(state_dir)
    try:
        auth.restore(msgspec.json.decode(path.read_bytes(), type=dict[str, dict[str, int]]))
    except FileNotFoundError:
        pass
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.warning("%s unreadable (%s): replay windows start empty", path, exc)


def _save_counters(path: Path, counters: dict[str, dict[str, int]]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(msgspec.json.encode(counters))
        tmp.replace(path)
    except OSError as exc:
        log.warning("cannot save the motes' message counters to %s: %s", path, exc)


def _count_rejection(manager: ProxyManager, sensor_id: str, reason: str) -> None:
    """A refused message under a catalogued sensor's id shows on its proxy (/sensors); ids
    not in the catalog are only counted globally, so forged ids take no memory."""
    proxy = manager.proxies.get(sensor_id)
    if proxy is not None and reason in ("bad_mac", "replay", "unsigned"):
        setattr(proxy.stats, reason, getattr(proxy.stats, reason) + 1)


def plain_transport(gw: Gateway) -> SupervisedTransport:
    """Plain MQTT devices ([[mqtt.streams]]): their own session on the [mqtt] broker."""
    from sensors.transports.plain_mqtt import PlainMqttTransport

    cfg = gw.config
    assert cfg.mqtt is not None
    return PlainMqttTransport(
        gw.plain_streams,
        cfg.mqtt.broker(),
        prefix=cfg.mqtt.topic_prefix,
        qos=cfg.mqtt.qos,
        clean_session=cfg.mqtt.clean_session,
        queue_bound=cfg.queue_bound,
        max_sensors=cfg.sensors.max_sensors,
        forget_after_s=cfg.sensors.forget_offline_after_s,
    )


class _CatalogBounds(TypedDict):
    max_sensors: int
    forget_offline_after_s: float
    max_new_per_minute: float
    forget_unknown_after_s: float
    max_unknown: int


class _PowerSettings(TypedDict):
    sleep_s: float
    retry_after_s: float


def _catalog_bounds(cfg: Config) -> _CatalogBounds:
    return {
        "max_sensors": cfg.sensors.max_sensors,
        "forget_offline_after_s": cfg.sensors.forget_offline_after_s,
        # per source: one transport (an MQTT subscriber cannot see who published)
        "max_new_per_minute": cfg.sensors.max_new_per_minute,
        "forget_unknown_after_s": cfg.sensors.forget_unknown_after_s,
        "max_unknown": cfg.sensors.max_unknown,
    }


class _StallSettings(TypedDict):
    stall_after: float
    stall_min_s: float


def _stall_settings(cfg: Config) -> _StallSettings:
    """[sensors] stall_after, stall_min_s: when a sensor whose data stopped while its program
    should send is stalled (proxies.stall)."""
    return {"stall_after": cfg.sensors.stall_after, "stall_min_s": cfg.sensors.stall_min_s}


def _power_settings(cfg: Config) -> _PowerSettings:
    """[sensors] wake_check_s: how often a sleeping sensor listens for a wake (how long a new
    query may wait for it); retry_after_s: how long a control waits for its ack (wall time)."""
    return {"sleep_s": cfg.sensors.wake_check_s, "retry_after_s": cfg.sensors.retry_after_s}


async def run_generated_fleet(hub: InProcessHub, count: int, segments: int, speedup: float) -> None:
    """The embedded defaults' loop detectors: one mote per station, day after generated day."""
    stations = generated_stations(count, segments)
    start = time.time()
    pacer = Pacer(speedup, origin=start - start % GENERATED_PERIOD_S)
    motes = {
        sid: SimulatedMote(
            sid,
            hub.link(sid),
            field="speed",
            period_s=GENERATED_PERIOD_S,
            attributes={"station": sid, **attrs},
            listen_every_s=8 * GENERATED_PERIOD_S,
            trace_step_s=GENERATED_PERIOD_S,  # set_period at multiples sub-samples the trace
        )
        for sid, attrs in stations.items()
    }
    for mote in motes.values():
        await mote.link.send(mote.hello())
    for day in itertools.count():
        trace = generated_trace(
            stations, start + day * 86_400, 86_400, GENERATED_PERIOD_S, seed=day
        )
        for k in range(len(next(iter(trace.values())))):
            for sid, mote in motes.items():
                t, v = trace[sid][k]
                await mote.step(t, v, pacer)


async def run_traffic_pairs(hub: InProcessHub, duration_s: float = 600.0) -> None:
    """A loop-detector pair sampling its light sensors at 180 Hz, in real time, forever; its
    times are epoch seconds like the generated fleet's (stream time is shared: a pair counting
    from 0 would look silent for decades and flap offline)."""
    start = time.time()
    for i in itertools.count():
        pair = TrafficPair(
            "pair1",
            hub.link,
            duration_s=duration_s,
            vehicles_per_second=0.5,
            seed=i,
            start=start + i * duration_s,
        )
        await pair.run(speedup=1.0)
