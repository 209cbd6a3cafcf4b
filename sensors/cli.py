"""`fjords-gateway simulate-motes`: a fleet of simulated motes from the command line.

    fjords-gateway simulate-motes --transport mqtt --broker 127.0.0.1:1883 \\
        --trace ../shared/data/metr-la/readings.csv --stations ../shared/data/metr-la/stations.csv

One mote per station, each with a retained hello (its station's attributes), then its readings
as fast as the link takes them, or `--speedup N` times real time. With `--transport serial`
the fleet sits behind one simulated base station on a pseudo-terminal whose path is printed
(point a gateway's serial transport at it); `--transport inprocess` just counts what arrives.
With `--firmware avr` (serial only) each mote is the AVR protocol image running in simavr
(firmware_sim.loop), its readings fed to its A-to-D and its own bytes sent to the gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from sensors.auth import load_keys
from sensors.motes.replay import TraceFormatError, TraceReplayFleet, load_stations, load_trace
from sensors.transports.broker import BrokerSettings
from sensors.transports.mqtt import MqttMoteLink

__all__ = ["add_commands", "simulate_motes"]


def add_commands(sub: Any) -> None:
    """Register `simulate-motes` on the gateway CLI's subparsers."""
    p = sub.add_parser(
        "simulate-motes",
        help="run simulated motes replaying a trace (one per station)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--transport", choices=["mqtt", "serial", "inprocess"], default="mqtt")
    p.add_argument("--broker", default="127.0.0.1:1883", help="MQTT broker HOST[:PORT]")
    p.add_argument("--prefix", default="fjords", help="MQTT topic prefix (default fjords)")
    p.add_argument(
        "--qos",
        type=int,
        choices=[0, 1],
        default=0,
        help="MQTT QoS of data messages (1: kept by the broker for a gateway that is away)",
    )
    p.add_argument("--trace", required=True, help="readings CSV: time,station,speed")
    p.add_argument("--stations", required=True, help="stations CSV: station,latitude,...")
    p.add_argument(
        "--speedup", type=float, default=None, help="N x real time (default: as fast as possible)"
    )
    p.add_argument("--limit", type=int, default=None, help="only the first N stations")
    p.add_argument("--program", default="raw", help="firmware program each mote runs (default raw)")
    p.add_argument("--device", default=None, help="serial: also expose the pty under this path")
    p.add_argument("--baud", type=int, default=115_200, help="serial: line rate to pace at")
    p.add_argument(
        "--firmware",
        choices=["python", "avr"],
        default="python",
        help="python: simulated motes; avr: the AVR firmware image in simavr (serial only)",
    )
    p.add_argument(
        "--keys-file",
        default=None,
        help="the motes' keys (lines '<sensor_id> <32 hex>', '*' a fleet's master key): each "
        "mote seals what it sends and obeys only controls sealed with its key",
    )
    p.add_argument(
        "--report",
        default=None,
        help="write a JSON report here at the end: per mote, readings taken, sleep/wake times",
    )
    p.set_defaults(func=cmd_simulate_motes)


def cmd_simulate_motes(args: argparse.Namespace) -> int:
    if args.speedup is not None and args.speedup <= 0:
        print("simulate-motes: --speedup must be > 0", file=sys.stderr)
        return 2
    if getattr(args, "firmware", "python") == "avr" and args.transport != "serial":
        print("simulate-motes: --firmware avr needs --transport serial", file=sys.stderr)
        return 2
    try:
        stations = load_stations(args.stations)
        wanted = set(list(stations)[: args.limit]) if args.limit else None
        trace = load_trace(args.trace, stations=wanted)
    except (OSError, TraceFormatError) as exc:
        print(f"simulate-motes: {exc}", file=sys.stderr)
        return 2
    try:
        keys = mote_keys(getattr(args, "keys_file", None), list(trace))
    except ValueError as exc:
        print(f"simulate-motes: --keys-file: {exc}", file=sys.stderr)
        return 2
    args.keys = keys
    try:
        summary = asyncio.run(simulate_motes(args, trace, stations))
    except KeyboardInterrupt:
        return 130
    except (OSError, TraceFormatError, RuntimeError) as exc:  # RuntimeError: firmware LoopError
        print(f"simulate-motes: {exc}", file=sys.stderr)
        return 1
    report = getattr(args, "report", None)
    if report and "per_mote" in summary:
        with open(report, "w") as f:
            json.dump(summary["per_mote"], f)
    print(
        f"simulate-motes: {summary['motes']} motes sent {summary['samples']} samples in "
        f"{summary['messages']} messages over {args.transport} in {summary['seconds']:.1f} s",
        file=sys.stderr,
    )
    return 0


def mote_keys(path: str | None, sensor_ids: list[str]) -> dict[str, bytes] | None:
    """Each mote's key from a keys file (None without one); ValueError names a mote that has
    none, or the file's bad line."""
    if path is None:
        return None
    ring = load_keys(Path(path))
    keys = {}
    for sid in sensor_ids:
        key = ring.key_for(sid)
        if key is None:
            raise ValueError(f"{path} has no key for mote {sid!r} (and no '*' master key)")
        keys[sid] = key
    return keys


async def simulate_motes(
    args: argparse.Namespace,
    trace: dict[str, list[tuple[float, float]]],
    stations: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """Run the fleet to the end of the trace; returns counts for the summary line."""
    start = time.monotonic()
    keys: dict[str, bytes] = getattr(args, "keys", None) or {}
    async with AsyncExitStack() as stack:
        if args.transport == "mqtt":
            broker = BrokerSettings.from_url(args.broker)
            links: dict[str, MqttMoteLink] = {}

            def link_for(sid: str) -> MqttMoteLink:
                links[sid] = MqttMoteLink(
                    sid, broker, prefix=args.prefix, data_qos=args.qos, key=keys.get(sid)
                )
                return links[sid]

            fleet = TraceReplayFleet(
                trace, stations, link_for, program=args.program, limit=args.limit
            )
            for sid, link in links.items():
                link.hello = fleet.motes[sid].hello
                await stack.enter_async_context(link)
            await asyncio.gather(*(link.wait_connected(30) for link in links.values()))
            await fleet.run(args.speedup)
            await asyncio.gather(*(link.drain() for link in links.values()))
        elif args.transport == "serial":
            from sensors.transports.serial import PtyBaseStation

            station = await stack.enter_async_context(
                PtyBaseStation(baudrate=args.baud, link_path=args.device)
            )
            print(f"simulate-motes: base station on {station.path}", file=sys.stderr, flush=True)
            if getattr(args, "firmware", "python") == "avr":
                from sensors.motes.firmware import FirmwareFleet

                firmware = FirmwareFleet(
                    trace, stations, station, program=args.program, limit=args.limit
                )
                await firmware.run(args.speedup)
                await station.drain()
                for line in firmware.report():
                    print(f"simulate-motes: {line}", file=sys.stderr)
                return {
                    "motes": len(firmware.configs),
                    "samples": firmware.stats.samples,
                    "messages": firmware.stats.frames,
                    "seconds": time.monotonic() - start,
                }
            fleet = TraceReplayFleet(
                trace,
                stations,
                lambda sid: station.link(sid, keys.get(sid)),
                program=args.program,
                limit=args.limit,
            )
            await fleet.run(args.speedup)
            await station.drain()
        else:
            from sensors.transports.inprocess import InProcessHub

            hub = await stack.enter_async_context(InProcessHub())
            fleet = TraceReplayFleet(
                trace,
                stations,
                lambda sid: hub.link(sid, keys.get(sid)),
                program=args.program,
                limit=args.limit,
            )

            async def consume() -> None:
                async for _ in hub.messages():
                    pass

            consumer = asyncio.create_task(consume())
            try:
                await fleet.run(args.speedup)
            finally:
                await hub.__aexit__(None, None, None)
                with contextlib.suppress(asyncio.CancelledError):
                    await consumer
    return {
        "motes": len(fleet.motes),
        "samples": fleet.samples,
        "messages": sum(m.stats.messages for m in fleet.motes.values()),
        "seconds": time.monotonic() - start,
        "per_mote": {
            sid: {
                "taken": m.stats.samples,
                "transitions": m.stats.transitions,
                "controls_ignored": _ignored(m.link),
            }
            for sid, m in fleet.motes.items()
        },
    }


def _ignored(link: object) -> dict[str, int]:
    """Controls a mote's link ignored as not authentic, by reason."""
    auth = getattr(link, "auth", None)
    return dict(auth.rejected) if auth is not None else {}
