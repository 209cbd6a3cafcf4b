"""`fjords-gateway`: run the daemon, and talk to a running one.

  fjords-gateway run [--config gateway.toml] [--http HOST:PORT] [--state-dir DIR | --no-state]
  fjords-gateway run --config gateway.toml --check-config    # check it (exit 0 or 2), run nothing
  fjords-gateway query "SELECT ..." [--url URL] [--json]     # results as they come; Ctrl-C removes it
  fjords-gateway explain "SELECT ..." [--url URL] [--json]    # the plan, without installing it
  fjords-gateway sensors [--url URL] [--json]                 # the sensor catalog
  fjords-gateway replay --trace FILE --query SQL              # a recorded trace, no daemon
  fjords-gateway simulate-motes --trace FILE --stations FILE  # a fleet of simulated motes
  fjords-gateway spark {run,batch} ...                        # queries on Apache Spark
  fjords-gateway archive compact --dir ROOT [--dry-run]      # a closed day's segments, merged

`fjords-gateway COMMAND --help` describes each command. A running daemon also serves a status
page at http://127.0.0.1:8080/ and its API reference at /docs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.cli_text import cell_text, explain_text

DEFAULT_URL = "http://127.0.0.1:8080"
log = logging.getLogger("gateway")


def version() -> str:
    """The installed distribution's version (one definition: `fjords.version`)."""
    from fjords import version as fjords_version

    return fjords_version()


def default_state_dir() -> Path:
    """Where a user's run keeps its queries unless told otherwise: $XDG_DATA_HOME/fjords-gateway,
    else ~/.local/share/fjords-gateway (the XDG base directory rule: a relative value is ignored)."""
    base = os.environ.get("XDG_DATA_HOME", "")
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".local" / "share"
    return root / "fjords-gateway"


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
    elif args.no_state or not config.persist_state:
        config.state_dir = None
    elif config.state_dir is None:
        config.state_dir = str(default_state_dir())
    if args.trace or args.stations:
        if not (args.trace and args.stations):
            print("fjords-gateway: --trace and --stations go together", file=sys.stderr)
            return 2
        config.trace, config.stations = args.trace, args.stations
    if args.speedup is not None and (not 0 < args.speedup < math.inf or not config.trace):
        print("fjords-gateway: --speedup needs --trace and a value > 0", file=sys.stderr)
        return 2
    try:
        config.validate()  # again: the command line may have changed what the file said
        config.check_paths()
    except ConfigError as e:
        print(f"fjords-gateway: {e}", file=sys.stderr)
        return 2
    if args.check_config:
        print(
            f"fjords-gateway: configuration {args.config or '(defaults)'} is valid", file=sys.stderr
        )
        return 0
    if config.exposed_without_token():
        log.warning(
            "HTTP API on %s without a token (allow_unauthenticated = true): anyone who can "
            "reach this address can read every query and register new ones",
            config.http.host,
        )
    if config.state_dir is None:
        log.warning(
            "no state directory (--no-state): registered queries are not kept and vanish when "
            "the gateway stops"
        )
    else:
        log.info(
            "registered queries are kept in %s (change with --state-dir or [state] dir; "
            "--no-state keeps none)",
            Path(config.state_dir).expanduser(),
        )

    async def main() -> int:
        from gateway.daemon import Gateway  # not before: --check-config needs none of it
        from gateway.sources import configure_sources

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        gw = Gateway(config)
        configure_sources(
            gw, trace_speedup=args.speedup if args.speedup is not None else config.replay_speedup
        )
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

    if args.archive and args.engine != "spark":
        print(
            "fjords-gateway replay: --archive replays a fleet's archive on Spark: add "
            "--engine spark (the Fjord engine replays a --trace)",
            file=sys.stderr,
        )
        return 2
    if args.gateway and not args.archive:
        print("fjords-gateway replay: --gateway filters an --archive's gateways", file=sys.stderr)
        return 2
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
    body = {"sql": args.sql, "dry_run": dry_run}
    if getattr(args, "since", None) is not None:
        body["since"] = _number_or_text(args.since)
    r = await http.post("/queries", json=body, headers=_headers(args))
    return r.status, await r.json()


def _number_or_text(value: str) -> float | str:
    try:
        return float(value)
    except ValueError:
        return value  # ISO-8601: the gateway reads it


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
                params = {"format": "ndjson"}
                if args.since is not None:  # from its first row: those emitted on registering
                    params["since"] = "0"
                async with http.get(
                    f"/queries/{qid}/results", params=params, headers=_headers(args)
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
                            print("\t".join(cell_text(row.get(c), c) for c in columns), flush=True)
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.shield(http.delete(f"/queries/{qid}", headers=_headers(args)))
            return 0

    return _run_client(run)


def cmd_explain(args: argparse.Namespace) -> int:
    import aiohttp

    async def run() -> int:
        async with aiohttp.ClientSession(args.url) as http:
            status, body = await _post_query(http, args, dry_run=True)
        if status != 200:
            _print_error(body)
            return 2
        print(json.dumps(body, indent=2) if args.json else explain_text(args.sql, body))
        return 0

    return _run_client(run)


def cmd_snapshot(args: argparse.Namespace) -> int:
    """A snapshot's rows (POST /snapshot): a table with its range on stderr, or NDJSON."""
    import aiohttp

    async def run() -> int:
        async with aiohttp.ClientSession(args.url) as http:
            body = {"sql": args.sql, "partial": args.partial}
            if args.engine != "fjords":
                body["engine"] = args.engine
            async with http.post("/snapshot", json=body, headers=_headers(args)) as r:
                status, answer = r.status, await r.json()
        if status != 200:
            _print_error(answer)
            return 2
        columns = answer["columns"]
        if args.json:
            for row in answer["rows"]:
                print(json.dumps(row))
            return 0
        print("\t".join(columns))
        for row in answer["rows"]:
            print("\t".join(cell_text(row.get(c), c) for c in columns))
        span = f"{cell_text(answer['from'], 'time') or '-'} to {cell_text(answer['to'], 'time') or '-'}"
        done = "complete" if answer["complete"] else "may be incomplete"
        print(f"# {len(answer['rows'])} rows over {span} ({done})", file=sys.stderr)
        return 0

    return _run_client(run)


def cmd_sensors(args: argparse.Namespace) -> int:
    import aiohttp

    async def run() -> int:
        sensors: list[dict[str, Any]] = []
        async with aiohttp.ClientSession(args.url) as http:
            path: str | None = "/sensors"
            while path is not None:  # the catalog comes a page at a time
                r = await http.get(path, headers=_headers(args))
                body = await r.json()
                if r.status != 200:
                    _print_error(body)
                    return 2
                sensors += body.get("sensors", [])
                path = body.get("next")
        if args.json:
            print(json.dumps(sensors, indent=2))
            return 0
        from rich.console import Console
        from rich.table import Table

        t = Table(title=f"{len(sensors)} sensors")
        for header, _, _ in SENSOR_COLUMNS:
            t.add_column(
                header,
                justify="left" if header in ("id", "stream", "status", "program") else "right",
            )
        for s in sensors:
            t.add_row(*[fmt(s.get(key)) for _, key, fmt in SENSOR_COLUMNS])
        Console().print(t)
        return 0

    return _run_client(run)


def _number(digits: int) -> Callable[[Any], str]:
    def fmt(v: Any) -> str:
        if v is None or isinstance(v, bool) or not isinstance(v, int | float):
            return "" if v is None else str(v)
        return "forever" if v == float("inf") else f"{v:.{digits}f}"

    return fmt


def _rate(v: Any) -> str:
    """180.0, but a slow sensor's 1/300 Hz as 0.00333 (not 0.0)."""
    if isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < 1:
        return f"{v:.3g}"
    return _number(1)(v)


def _percent(v: Any) -> str:
    return f"{100 * v:.0f} %" if isinstance(v, int | float) else ""


#: (header, catalog key, formatter): one list, so a header always sits over its own value.
SENSOR_COLUMNS: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("id", "id", cell_text),
    ("stream", "stream", cell_text),
    ("status", "status", cell_text),
    ("program", "program", cell_text),
    ("rate (Hz)", "sample_rate_hz", _rate),
    ("power (mW)", "power_mw_estimate", _number(3)),
    ("battery", "battery_estimate", _percent),
    ("lifetime (days)", "lifetime_days_estimate", _number(1)),
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
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
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
    state = run.add_mutually_exclusive_group()
    state.add_argument(
        "--state-dir",
        help="where registered queries are kept across restarts (default: [state] dir, else "
        "$XDG_DATA_HOME/fjords-gateway or ~/.local/share/fjords-gateway)",
    )
    state.add_argument(
        "--no-state", action="store_true", help="keep no queries: they vanish when it stops"
    )
    run.add_argument(
        "--trace",
        "--readings",
        dest="trace",
        metavar="FILE",
        help="add an in-process replay fleet from this trace (CSV)",
    )
    run.add_argument("--stations", metavar="FILE", help="station attributes for --trace (CSV)")
    run.add_argument(
        "--speedup",
        type=float,
        help="replay --trace N times real time (default: as fast as it goes)",
    )
    run.add_argument(
        "--check-config",
        action="store_true",
        help="check the configuration (and the files it names) and exit: 0 if valid, else 2",
    )
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    run.add_argument("--log-format", default="text", choices=["text", "json"])
    run.set_defaults(func=cmd_run)

    q = sub.add_parser("query", help="register a query on a running gateway and print its results")
    q.add_argument("sql")
    q.add_argument("--json", action="store_true", help="NDJSON rows instead of a table")
    q.add_argument(
        "--since",
        metavar="TIME",
        help="first every window from TIME on (epoch seconds or ISO-8601), from the history",
    )
    _client_args(q)
    q.set_defaults(func=cmd_query)

    e = sub.add_parser("explain", help="show a query's plan without installing it")
    e.add_argument("sql")
    e.add_argument("--json", action="store_true", help="the plan as JSON instead of text")
    _client_args(e)
    e.set_defaults(func=cmd_explain)

    n = sub.add_parser("snapshot", help="answer a query once from a running gateway's history")
    n.add_argument("sql")
    n.add_argument("--json", action="store_true", help="NDJSON rows instead of a table")
    n.add_argument("--partial", action="store_true", help="include readings past the watermark too")
    n.add_argument(
        "--engine",
        choices=("fjords", "spark"),
        default="fjords",
        help="spark: the archive's part aggregated by a Spark job",
    )
    _client_args(n)
    n.set_defaults(func=cmd_snapshot)

    s = sub.add_parser("sensors", help="list the sensor catalog of a running gateway")
    s.add_argument("--json", action="store_true")
    _client_args(s)
    s.set_defaults(func=cmd_sensors)

    r = sub.add_parser(
        "replay", help="replay a recorded trace through motes, proxies and the Fjord"
    )
    source = r.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--trace",
        "--readings",
        dest="readings",
        metavar="FILE",
        help="the trace (CSV): time, station, value (--readings is the same option)",
    )
    source.add_argument(
        "--archive",
        action="append",
        metavar="ROOT",
        help="a fleet's archive root instead of a trace (every gateway under it; repeatable; "
        "--engine spark)",
    )
    r.add_argument(
        "--gateway", action="append", default=[], metavar="ID",
        help="with --archive: read only this gateway; repeatable",
    )  # fmt: skip
    r.add_argument(
        "--stations", metavar="FILE", help="station attributes joined onto each row (CSV)"
    )
    r.add_argument("--stream", default="traffic")
    r.add_argument("--table", action="append", default=[], type=_table, metavar="NAME=FILE")
    r.add_argument("--query", action="append", required=True, metavar="SQL")
    r.add_argument("--speedup", type=float, help="N times real time (default: as fast as possible)")
    r.add_argument(
        "--json", action="store_true",
        help="NDJSON rows (the default form); with --archive, the summary too (last line)",
    )  # fmt: skip
    r.add_argument("--engine", choices=("fjords", "spark"), default="fjords")
    from gateway.spark.cli import add_spark_options

    add_spark_options(r)
    r.set_defaults(func=cmd_replay)

    for add in feature_commands():
        add(sub)
    return parser


def feature_commands() -> list[Callable[[Any], None]]:
    """Subcommands that live with their feature (each module has `add_commands(subparsers)`)."""
    from gateway.compaction import add_commands as archive_commands
    from gateway.spark.cli import add_commands as spark_commands
    from sensors.cli import add_commands as sensor_commands

    return [sensor_commands, spark_commands, archive_commands]


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
