"""`fjords-gateway simulate-motes`: a fleet of simulated motes from the command line.

    fjords-gateway simulate-motes --transport mqtt --broker 127.0.0.1:1883 \\
        --trace ../shared/data/metr-la/readings.csv --stations ../shared/data/metr-la/stations.csv

One mote per station, each with a retained hello (its station's attributes), then its readings
as fast as the link takes them, or `--speedup N` times real time. With `--transport serial`
the fleet sits behind one simulated base station on a pseudo-terminal whose path is printed
(point a gateway's serial transport at it); `--transport inprocess` just counts what arrives.
With `--firmware avr` (serial only) each mote is the AVR protocol image running in simavr
(firmware_sim.loop), its readings fed to its A-to-D and its own bytes sent to the gateway;
`--keys-file` puts each mote's key in its EEPROM (the firmware seals and checks itself).

On a broker with credentials (deploy/mosquitto/), each mote connects as itself:

    fjords-gateway simulate-motes --broker mqtts://broker:8883 --ca-file ca.pem \\
        --username '{sensor_id}' --password-file motes.passwd ...

`--username`, `--certfile` and `--keyfile` may name the mote as `{sensor_id}`. The password
file holds one password for every mote (a single line), or one line `SENSOR_ID PASSWORD` per
mote (`#` comments and blank lines are skipped).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import ssl
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from sensors.auth import Keyring, load_keys
from sensors.motes.replay import TraceFormatError, TraceReplayFleet, load_stations, load_trace
from sensors.transports.broker import (
    BrokerSettings,
    broker_address,
    file_problem,
    read_secret,
    topic_problem,
)
from sensors.transports.mqtt import MqttMoteLink

__all__ = ["ConnectFailed", "add_commands", "mote_identities", "simulate_motes"]


def add_commands(sub: Any) -> None:
    """Register `simulate-motes` on the gateway CLI's subparsers."""
    p = sub.add_parser(
        "simulate-motes",
        help="run simulated motes replaying a trace (one per station)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--transport", choices=["mqtt", "serial", "inprocess"], default="mqtt")
    p.add_argument(
        "--broker", default="127.0.0.1:1883", type=_broker, help="MQTT broker HOST[:PORT]"
    )
    p.add_argument(
        "--prefix", default="fjords", type=_prefix, help="MQTT topic prefix (default fjords)"
    )
    p.add_argument(
        "--username", default=None, help="MQTT user of each mote; {sensor_id} names the mote"
    )
    p.add_argument(
        "--password-file",
        default=None,
        help="one password (one line) or `SENSOR_ID PASSWORD` lines, one per mote",
    )
    p.add_argument("--tls", action="store_true", help="TLS (also: an mqtts:// --broker)")
    p.add_argument("--ca-file", default=None, help="CA the broker's certificate is checked against")
    p.add_argument(
        "--certfile", default=None, help="PEM client certificate (mutual TLS); may use {sensor_id}"
    )
    p.add_argument("--keyfile", default=None, help="its private key (unset: in --certfile)")
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


def _broker(text: str) -> str:
    """A broker address as `--broker` takes it, checked before any mote starts."""
    try:
        broker_address(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _prefix(text: str) -> str:
    if (problem := topic_problem(text)) is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def cmd_simulate_motes(args: argparse.Namespace) -> int:
    if args.speedup is not None and not 0 < args.speedup < math.inf:
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
    if args.transport == "mqtt":
        try:
            args.identities = mote_identities(args, [s for s in stations if s in trace])
        except ValueError as exc:
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
    except ConnectFailed as exc:
        print(f"simulate-motes: {exc}", file=sys.stderr)
        return 1
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


class ConnectFailed(Exception):
    """A mote could not connect to the broker; the message says why (see BrokerSettings.explain)."""


def mote_identities(args: argparse.Namespace, sensor_ids: list[str]) -> dict[str, BrokerSettings]:
    """Each mote's broker settings: its own username, password and certificate where the flags
    name them per mote. ValueError names the flag and the file at fault."""
    try:
        base = BrokerSettings.from_url(
            args.broker, tls=bool(getattr(args, "tls", False)), ca_file=args.ca_file
        )
    except ValueError as exc:
        raise ValueError(f"--broker: {exc}") from None
    for flag, value in (("--ca-file", args.ca_file), ("--password-file", args.password_file)):
        problem = value and file_problem(value)
        if problem:
            raise ValueError(f"{flag}: {problem}")
    if (args.ca_file or args.certfile) and not base.tls:
        raise ValueError("--ca-file/--certfile need TLS: an mqtts:// --broker, or --tls")
    if args.keyfile and not args.certfile:
        raise ValueError("--keyfile needs --certfile")
    passwords = _mote_passwords(args.password_file) if args.password_file else None
    out: dict[str, BrokerSettings] = {}
    for sid in sensor_ids:
        password = None
        if passwords is not None:
            password = passwords.get(sid, passwords.get(""))
            if password is None:
                raise ValueError(
                    f"--password-file: no password for mote {sid!r} in {args.password_file}"
                )
        files: dict[str, str | None] = {}
        for flag, template in (("--certfile", args.certfile), ("--keyfile", args.keyfile)):
            path = _per_mote(template, sid, flag)
            problem = path and file_problem(path)
            if problem:
                raise ValueError(f"{flag}: {problem}")
            files[flag] = path
        out[sid] = dataclasses.replace(
            base,
            username=_per_mote(args.username, sid, "--username"),
            password=password,
            password_file=args.password_file,
            certfile=files["--certfile"],
            keyfile=files["--keyfile"],
        )
    if out and base.tls:
        first = next(iter(out.values()))
        try:
            first.tls_context()
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"TLS files (--ca-file {args.ca_file}, --certfile {first.certfile}): {exc}"
            ) from None
    return out


def _per_mote(template: str | None, sensor_id: str, flag: str) -> str | None:
    if template is None:
        return None
    try:
        return template.format(sensor_id=sensor_id)
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"{flag}: {template!r} may only name {{sensor_id}} ({exc})") from None


def _mote_passwords(path: str) -> dict[str, str]:
    """sensor id -> password; "" -> the one password of a file with a single bare line."""
    try:
        lines = [
            line.strip()
            for line in Path(path).read_text(encoding="utf-8").splitlines()
            if line.strip() and not line.lstrip().startswith("#")
        ]
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--password-file: cannot read {path}: {exc}") from None
    if len(lines) == 1 and len(lines[0].split()) == 1:
        return {"": read_secret(path).strip()}
    out: dict[str, str] = {}
    for n, line in enumerate(lines, 1):
        parts = line.split(None, 1)
        if len(parts) != 2:
            raise ValueError(f"--password-file: {path}: entry {n} is not `SENSOR_ID PASSWORD`")
        out[parts[0]] = parts[1].strip()
    return out


async def all_connected(links: dict[str, MqttMoteLink], timeout: float) -> None:
    """Wait until every mote is connected; ConnectFailed at once when the broker refuses one
    (credentials, TLS: retrying will not help) or after `timeout` s, naming the reason."""
    deadline = time.monotonic() + timeout
    while True:
        waiting = [link for link in links.values() if not link.stats.connected]
        if not waiting:
            return
        for link in waiting:
            if link.stats.refused:
                raise ConnectFailed(f"mote {link.sensor_id}: {link.stats.last_error}")
        if time.monotonic() >= deadline:
            link = waiting[0]
            why = link.stats.last_error or "no answer"
            raise ConnectFailed(
                f"{len(waiting)} mote(s) not connected within {timeout:g} s;"
                f" mote {link.sensor_id}: {why}"
            )
        await asyncio.sleep(0.05)


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
            identities = getattr(args, "identities", None) or mote_identities(args, list(trace))
            links: dict[str, MqttMoteLink] = {}

            def link_for(sid: str) -> MqttMoteLink:
                broker = identities[sid]
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
            await all_connected(links, 30)
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
                    trace,
                    stations,
                    station,
                    program=args.program,
                    limit=args.limit,
                    keys=Keyring(keys=keys) if keys else None,
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
                    "per_mote": firmware.per_mote(),
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
