"""`fjords-gateway spark run|batch`, and the Spark side of `fjords-gateway replay --engine spark`.

gateway/cli.py calls `add_commands(sub)`; each parser's `func` runs the command here.
Spark settings come from the `[spark]` table of the gateway's TOML config (`--config`), with
`--master` and `--conf KEY=VALUE` on top; its `[[mqtt.streams]]` declare those streams' schemas.

`--archive ROOT` is a fleet's archive root (every gateway under it, per stream; legacy flat
segments too, their `gateway` NULL); several are several roots, read together; `--gateway ID`
(repeatable) reads only those gateways.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path
from typing import Any

ENGINES = ("fjords", "spark")


def _pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def add_spark_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="gateway TOML config; its [spark] table sets Spark up")
    p.add_argument("--master", help="Spark master URL (default: local[*] or the config's)")
    p.add_argument(
        "--conf", action="append", default=[], type=_pair, metavar="KEY=VALUE",
        help="extra Spark setting; repeatable",
    )  # fmt: skip


def add_archive_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--archive", action="append", required=True, metavar="ROOT",
        help="a fleet's archive root (every gateway under it); repeatable: several roots",
    )  # fmt: skip
    p.add_argument(
        "--gateway", action="append", default=[], metavar="ID",
        help="read only this gateway; repeatable (default: every gateway)",
    )  # fmt: skip


def declared_streams(args: argparse.Namespace) -> dict[str, Any]:
    """The `[[mqtt.streams]]` of `--config` as stream schemas (their declared columns)."""
    if not getattr(args, "config", None):
        return {}
    from fjords.schema import Field, Schema
    from gateway.config import Config

    out = {}
    for spec in Config.load(args.config).plain_streams():
        fields = [Field(n, t, unit=u) for n, t, u in spec.field_types()]
        out[spec.name] = Schema(fields, time="time")
    return out


def print_summary(summary: dict[str, Any], as_json: bool) -> None:
    """The run's per-gateway counts: JSON on stdout (the last line), else text on stderr."""
    import json

    if as_json:
        sys.stdout.write(json.dumps({"summary": summary}) + "\n")
        return
    late = summary.get("late_readings_dropped") or {}
    lines = [
        f"gateways: {', '.join(summary.get('gateways') or []) or '-'}",
        "late readings dropped: " + (", ".join(f"{g}={n}" for g, n in sorted(late.items())) or "-"),
        f"segments refused: {summary.get('segments_refused', 0)}",
    ]
    lines += [f"  {p}: {why}" for p, why in sorted((summary.get("refused_segments") or {}).items())]
    if summary.get("gateways_unread"):
        lines.append(f"gateways not read (new since the checkpoint): {summary['gateways_unread']}")
    print("\n".join(lines), file=sys.stderr)


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register `spark run` and `spark batch` on the gateway's subparsers (`replay --engine spark`
    is the gateway's `replay`, which calls `run_replay` here)."""
    spark = sub.add_parser("spark", help="run queries on Apache Spark")
    ssub = spark.add_subparsers(dest="spark_command", required=True)

    run = ssub.add_parser("run", help="a streaming job over the gateway's archive directory")
    run.add_argument("--query", required=True, metavar="SQL")
    add_archive_options(run)
    run.add_argument("--stream", default="traffic", help="stream name in the query")
    run.add_argument("--table", action="append", default=[], type=_pair, metavar="NAME=FILE")
    run.add_argument("--checkpoint", metavar="DIR", help="offsets and state (default: none)")
    run.add_argument(
        "--sink", default="console", help="console | parquet:DIR | mqtt://HOST[:PORT]/TOPIC"
    )
    run.add_argument("--watermark", default=None, help="allowed lateness, e.g. '5 minutes'")
    run.add_argument("--trigger", default="10 seconds", help="micro-batch interval")
    run.add_argument(
        "--available-now", action="store_true", help="process the archive as it is, then stop"
    )
    run.add_argument(
        "--json", action="store_true", help="the summary at the end as JSON (stdout, last line)"
    )
    add_spark_options(run)
    run.set_defaults(func=dispatch)

    batch = ssub.add_parser("batch", help="a query over a whole archive or trace, once")
    src = batch.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--archive", action="append", metavar="ROOT", help="a fleet's archive root; repeatable"
    )
    src.add_argument(
        "--trace", "--readings", dest="readings", metavar="FILE", help="trace file (CSV or Parquet)"
    )
    batch.add_argument("--stations", help="station attributes for a trace")
    batch.add_argument("--query", action="append", required=True, metavar="SQL")
    batch.add_argument("--stream", default="traffic")
    batch.add_argument("--table", action="append", default=[], type=_pair, metavar="NAME=FILE")
    batch.add_argument(
        "--gateway", action="append", default=[], metavar="ID", help="read only this gateway"
    )
    batch.add_argument(
        "--json", action="store_true", help="the summary at the end as JSON (stdout, last line)"
    )
    add_spark_options(batch)
    batch.set_defaults(func=dispatch)


def spark_config(args: argparse.Namespace) -> Any:
    from gateway.spark.session import SparkConfig

    section: dict[str, Any] = {}
    if getattr(args, "config", None):
        path = Path(args.config)
        try:
            section = dict(tomllib.loads(path.read_text()).get("spark", {}))
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ValueError(f"cannot read config {path}: {e}") from None
    if getattr(args, "master", None):
        section["master"] = args.master
    conf = dict(section.get("conf", {}))
    conf.update(dict(getattr(args, "conf", []) or []))
    if conf:
        section["conf"] = conf
    return SparkConfig.from_mapping(section)


def require_pyspark(what: str) -> None:
    """Spark commands need the optional [spark] extra: on a plain install say what to install
    (EngineUnavailable, a one-line error and exit 2) instead of a raw ImportError traceback."""
    from fjords.errors import EngineUnavailable

    try:
        import pyspark  # noqa: F401
    except ImportError as e:
        raise EngineUnavailable(what, "spark", "pyspark") from e


def dispatch(args: argparse.Namespace) -> int:
    """Run `spark run|batch` or `replay`; 2 with a one-line error for bad input."""
    from fjords.errors import FjordsError

    try:
        require_pyspark(f"fjords-gateway spark {args.spark_command}")
        if args.spark_command == "run":
            return _run(args)
        return _batch(args)
    except FjordsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


def run_replay(args: argparse.Namespace) -> int:
    """`fjords-gateway replay --engine spark`: the same NDJSON rows, computed by Spark, over a
    trace, or over a fleet's archive (`--archive ROOT [--gateway ID]`, as `spark batch`)."""
    require_pyspark("--engine spark")
    from gateway.spark.batch import replay

    if getattr(args, "archive", None):  # a fleet's archive: what `spark batch --archive` does
        return _batch(args)
    replay(
        args.readings,
        args.query,
        stations=args.stations,
        stream=args.stream,
        tables=args.table,
        config=spark_config(args),
    )
    return 0


def _batch(args: argparse.Namespace) -> int:
    import json

    from gateway.spark.batch import replay, result_rows, run_archive
    from gateway.spark.session import get_session
    from gateway.spark.sources import StaticTable

    if args.readings:
        replay(
            args.readings,
            args.query,
            stations=args.stations,
            stream=args.stream,
            tables=args.table,
            config=spark_config(args),
        )
        return 0
    from gateway.spark.sources import Refusals

    declared = declared_streams(args)
    spark = get_session(spark_config(args))
    tables = {n: StaticTable(n, p) for n, p in args.table}
    refusals = Refusals(args.stream)
    for i, sql in enumerate(args.query):
        q, df = run_archive(
            spark,
            sql,
            args.archive,
            stream=args.stream,
            tables=tables,
            gateways=args.gateway or None,
            declared=declared.get(args.stream),
            refusals=refusals,
        )
        for row in result_rows(df, q):
            sys.stdout.write(json.dumps({"query": i, **row}) + "\n")
    summary = {"segments_refused": refusals.count, "refused_segments": dict(refusals.paths)}
    print_summary(summary, args.json)
    return 0


def _run(args: argparse.Namespace) -> int:
    import tempfile

    from gateway.spark.session import get_session
    from gateway.spark.sinks import sink_from_spec
    from gateway.spark.sources import StaticTable
    from gateway.spark.streaming import DEFAULT_WATERMARK, StreamingJob

    sink = sink_from_spec(args.sink)
    declared = declared_streams(args)
    spark = get_session(spark_config(args))
    tables = {n: StaticTable(n, p) for n, p in args.table}
    with tempfile.TemporaryDirectory(prefix="fjords-spark-ckpt-") as tmp:
        # Without --checkpoint a run starts afresh each time (a throwaway checkpoint).
        job = StreamingJob(
            spark,
            args.query,
            args.archive,
            sink=sink,
            checkpoint=args.checkpoint or tmp,
            stream=args.stream,
            gateways=args.gateway or None,
            declared=declared,
            tables=tables,
            watermark=args.watermark or DEFAULT_WATERMARK,
            trigger=args.trigger,
            available_now=args.available_now,
        )
        job.start()
        try:
            job.await_termination()
        except KeyboardInterrupt:
            job.stop()
        summary = job.fleet_status()
    print_summary(summary, args.json)
    return 0
