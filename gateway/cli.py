"""`fjords-gateway`: run the daemon, and talk to a running one.

  fjords-gateway run [--config gateway.toml] [--http HOST:PORT] [--state-dir DIR]
  fjords-gateway query "SELECT ..." [--url URL] [--json]     # results as they come; Ctrl-C removes it
  fjords-gateway explain "SELECT ..." [--url URL]             # the plan, without installing it
  fjords-gateway sensors [--url URL] [--json]                 # the sensor catalog

Each feature adds its own subcommands in its own module (see `_feature_commands`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8080"
log = logging.getLogger("gateway")


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        _JsonFormatter()
        if fmt == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


# -- run ---------------------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace) -> int:
    from gateway.config import Config, ConfigError
    from gateway.daemon import Gateway

    setup_logging(args.log_level, args.log_format)
    try:
        config = Config.load(args.config) if args.config else Config()
    except ConfigError as e:
        print(f"fjords-gateway: {e}", file=sys.stderr)
        return 2
    if args.http:
        config.http.host, config.http.port = args.http
    if args.state_dir:
        config.state_dir = args.state_dir
    if args.trace or args.stations:
        if not (args.trace and args.stations):
            print("fjords-gateway: --trace and --stations go together", file=sys.stderr)
            return 2
        config.trace, config.stations = args.trace, args.stations
    try:
        config.validate()  # again: the command line may have changed what the file said
    except ConfigError as e:
        print(f"fjords-gateway: {e}", file=sys.stderr)
        return 2
    if config.exposed_without_token():
        log.warning(
            "HTTP API on %s without a token (allow_unauthenticated = true): anyone who can "
            "reach this address can read every query and register new ones",
            config.http.host,
        )

    async def main() -> int:
        from gateway.sources import configure_sources

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        gw = Gateway(config)
        configure_sources(gw)
        async with gw:
            await gw.start_http()
            waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(gw.failed.wait())]
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for w in waiters:
                w.cancel()
            log.info("shutting down")
        return 1 if gw.failed.is_set() else 0

    try:
        return asyncio.run(main())
    except OSError as e:  # e.g. the port is taken
        log.error("cannot start: %s", e)
        return 1
    except Exception as e:  # a bad table file, a bad stored query...
        from fjords.errors import FjordsError

        if isinstance(e, FjordsError):
            log.error("cannot start: %s", e)
            return 2
        raise


# -- replay ------------------------------------------------------------------------------------


def _table(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=FILE, got {text!r}")
    return name, path


def cmd_replay(args: argparse.Namespace) -> int:
    from fjords.errors import FjordsError

    try:
        if args.engine == "spark":
            from gateway.spark.cli import run_replay

            return run_replay(args)
        from gateway.replay import replay_trace

        asyncio.run(
            replay_trace(
                args.readings,
                args.query,
                stations=args.stations,
                stream=args.stream,
                tables=args.table,
                speedup=args.speedup,
            )
        )
        return 0
    except (FjordsError, ValueError, OSError) as e:
        print(f"fjords-gateway replay: {e}", file=sys.stderr)
        return 2


# -- clients -----------------------------------------------------------------------------------


def _headers(args: argparse.Namespace) -> dict[str, str]:
    token = args.token or os.environ.get("FJORDS_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


async def _post_query(http: Any, args: argparse.Namespace, dry_run: bool) -> tuple[int, dict]:
    r = await http.post(
        "/queries", json={"sql": args.sql, "dry_run": dry_run}, headers=_headers(args)
    )
    return r.status, await r.json()


def _print_error(body: dict) -> None:
    where = f" (line {body['line']}, column {body['column']})" if "line" in body else ""
    expected = f"; expected {', '.join(body['expected'])}" if body.get("expected") else ""
    print(f"fjords-gateway: {body.get('error')}{where}{expected}", file=sys.stderr)


def cmd_query(args: argparse.Namespace) -> int:
    import aiohttp

    async def run() -> int:
        async with aiohttp.ClientSession(
            args.url, timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)
        ) as http:
            status, body = await _post_query(http, args, dry_run=False)
            if status != 201:
                _print_error(body)
                return 2
            qid = body["id"]
            columns = body["columns"]
            if not args.json:
                print("\t".join(columns), flush=True)
            try:
                async with http.get(
                    f"/queries/{qid}/results", params={"format": "ndjson"}, headers=_headers(args)
                ) as resp:
                    if resp.status != 200:
                        _print_error(await resp.json())
                        return 2
                    async for line in resp.content:
                        if not line.strip():
                            continue
                        row = json.loads(line)
                        if args.json:
                            print(json.dumps(row), flush=True)
                        elif "missed" in row and len(row) == 1:
                            print(
                                f"# missed {row['missed']} rows (client too slow)", file=sys.stderr
                            )
                        else:
                            print("\t".join(_fmt(row.get(c)) for c in columns), flush=True)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.shield(http.delete(f"/queries/{qid}", headers=_headers(args)))
            return 0

    return _run_client(run)


def _fmt(v: object) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def cmd_explain(args: argparse.Namespace) -> int:
    import aiohttp

    async def run() -> int:
        async with aiohttp.ClientSession(args.url) as http:
            status, body = await _post_query(http, args, dry_run=True)
        if status != 200:
            _print_error(body)
            return 2
        print(json.dumps(body, indent=2))
        return 0

    return _run_client(run)


def cmd_sensors(args: argparse.Namespace) -> int:
    import aiohttp

    async def run() -> int:
        async with aiohttp.ClientSession(args.url) as http:
            r = await http.get("/sensors", headers=_headers(args))
            body = await r.json()
        if r.status != 200:
            _print_error(body)
            return 2
        sensors = body.get("sensors", [])
        if args.json:
            print(json.dumps(sensors, indent=2))
            return 0
        from rich.console import Console
        from rich.table import Table

        t = Table(title=f"{len(sensors)} sensors")
        for c in _SENSOR_COLUMNS:
            t.add_column(c)
        for s in sensors:
            t.add_row(
                *[
                    _fmt(s.get(c, ""))
                    for c in (
                        "id",
                        "status",
                        "program",
                        "sample_rate_hz",
                        "battery_days",
                        "energy_j",
                    )
                ]
            )
        Console().print(t)
        return 0

    return _run_client(run)


_SENSOR_COLUMNS = (
    "id",
    "stream",
    "status",
    "program",
    "sample_rate_hz",
    "power_mw_estimate",
    "lifetime_days_estimate",
)


def _run_client(run: Callable[[], Any]) -> int:
    import aiohttp

    try:
        return asyncio.run(run())
    except KeyboardInterrupt:
        return 130
    except aiohttp.ClientConnectionError as e:
        print(f"fjords-gateway: cannot reach the gateway: {e}", file=sys.stderr)
        return 1


# -- parser ------------------------------------------------------------------------------------


def _client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        default=os.environ.get("FJORDS_URL", DEFAULT_URL),
        help=f"gateway URL (default {DEFAULT_URL})",
    )
    p.add_argument("--token", help="bearer token for a gateway that needs one (or FJORDS_TOKEN)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fjords-gateway",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run the gateway daemon")
    run.add_argument(
        "--config", help="TOML configuration (see gateway.example.toml); default: embedded defaults"
    )
    run.add_argument(
        "--http",
        type=_host_port,
        metavar="HOST:PORT",
        help="HTTP bind address (default 127.0.0.1:8080)",
    )
    run.add_argument("--state-dir", help="where registered queries are kept across restarts")
    run.add_argument("--trace", help="add an in-process replay fleet from this trace (CSV)")
    run.add_argument("--stations", help="station attributes for --trace (CSV)")
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    run.add_argument("--log-format", default="text", choices=["text", "json"])
    run.set_defaults(func=cmd_run)

    q = sub.add_parser("query", help="register a query on a running gateway and print its results")
    q.add_argument("sql")
    q.add_argument("--json", action="store_true", help="NDJSON rows instead of a table")
    _client_args(q)
    q.set_defaults(func=cmd_query)

    e = sub.add_parser("explain", help="show a query's plan without installing it")
    e.add_argument("sql")
    _client_args(e)
    e.set_defaults(func=cmd_explain)

    s = sub.add_parser("sensors", help="list the sensor catalog of a running gateway")
    s.add_argument("--json", action="store_true")
    _client_args(s)
    s.set_defaults(func=cmd_sensors)

    r = sub.add_parser(
        "replay", help="replay a recorded trace through motes, proxies and the Fjord"
    )
    r.add_argument(
        "--readings", required=True, metavar="FILE", help="the trace (CSV): time, station, value"
    )
    r.add_argument(
        "--stations", metavar="FILE", help="station attributes joined onto each row (CSV)"
    )
    r.add_argument("--stream", default="traffic")
    r.add_argument("--table", action="append", default=[], type=_table, metavar="NAME=FILE")
    r.add_argument("--query", action="append", required=True, metavar="SQL")
    r.add_argument("--speedup", type=float, help="N times real time (default: as fast as possible)")
    r.add_argument("--json", action="store_true", help="NDJSON rows (the default and only form)")
    r.add_argument("--engine", choices=("fjords", "spark"), default="fjords")
    from gateway.spark.cli import add_spark_options

    add_spark_options(r)
    r.set_defaults(func=cmd_replay)

    for add in _feature_commands():
        add(sub)
    return parser


def _feature_commands() -> list[Callable[[Any], None]]:
    """Subcommands that live with their feature (each module has `add_commands(subparsers)`)."""
    from gateway.spark.cli import add_commands as spark_commands
    from sensors.cli import add_commands as sensor_commands

    return [sensor_commands, spark_commands]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # e.g. piped into `head`
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        return 0


if __name__ == "__main__":
    sys.exit(main())
