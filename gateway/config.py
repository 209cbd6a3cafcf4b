"""The gateway's configuration: a TOML file (see gateway.example.toml), or embedded defaults.

Every section is optional. Errors name the key and what was wrong, so an operator can fix the
file without reading code.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fjords.errors import FjordsError


class ConfigError(FjordsError):
    """A configuration file that is missing, malformed, or has a bad value."""


@dataclass
class HttpConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    token: str | None = None
    max_body_bytes: int = 64 * 1024
    client_buffer_rows: int = 10_000


@dataclass
class MqttConfig:
    url: str = "mqtt://127.0.0.1:1883"
    username: str | None = None
    password: str | None = None
    tls: bool = False
    ca_file: str | None = None
    topic_prefix: str = "fjords"
    home_assistant_discovery: bool = False


@dataclass
class SerialConfig:
    device: str
    baud: int = 115200


@dataclass
class ArchiveConfig:
    dir: str | None = None
    segment_rows: int = 50_000
    segment_seconds: float = 300.0


@dataclass
class SimulationConfig:
    traffic_pair: bool = True
    stations: int = 40
    segments: int = 8
    speedup: float = 60.0


@dataclass
class Config:
    http: HttpConfig = field(default_factory=HttpConfig)
    state_dir: str | None = None
    queue_bound: int = 65_536
    max_lag_seconds: float = 60.0
    tables: dict[str, str] = field(default_factory=dict)
    queries: list[dict[str, Any]] = field(default_factory=list)
    mqtt: MqttConfig | None = None
    serial: list[SerialConfig] = field(default_factory=list)
    archive: ArchiveConfig = field(default_factory=ArchiveConfig)
    simulation: SimulationConfig | None = field(default_factory=SimulationConfig)
    trace: str | None = None
    stations: str | None = None
    spark: dict[str, Any] = field(default_factory=dict)  # [spark]: master, memory, extra conf

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Config:
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {p}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: not valid TOML: {e}") from None
        return cls.from_dict(data, base=p.parent)

    @classmethod
    def from_dict(cls, data: dict[str, Any], base: Path | None = None) -> Config:
        known = {
            "http",
            "state",
            "runtime",
            "tables",
            "queries",
            "mqtt",
            "serial",
            "archive",
            "simulation",
            "replay",
        }
        unknown = set(data) - known
        if unknown:
            raise ConfigError(
                f"unknown section(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}"
            )
        cfg = cls()
        base = base or Path.cwd()
        cfg.http = _section(HttpConfig, data.get("http", {}), "http")
        state = data.get("state", {})
        cfg.state_dir = _path(state.get("dir"), base)
        runtime = data.get("runtime", {})
        cfg.queue_bound = _int(
            runtime.get("queue_bound", cfg.queue_bound), "runtime.queue_bound", minimum=1
        )
        cfg.max_lag_seconds = float(runtime.get("max_lag_seconds", cfg.max_lag_seconds))
        tables = data.get("tables", {})
        if not isinstance(tables, dict):
            raise ConfigError("[tables] maps table names to CSV or Parquet files")
        cfg.tables = {name: _path(p, base) for name, p in tables.items()}  # type: ignore[misc]
        queries = data.get("queries", [])
        if not isinstance(queries, list) or not all(
            isinstance(q, dict) and "sql" in q for q in queries
        ):
            raise ConfigError("[[queries]] entries need an 'sql' key")
        cfg.queries = queries
        if "mqtt" in data:
            cfg.mqtt = _section(MqttConfig, data["mqtt"], "mqtt")
        cfg.serial = [_section(SerialConfig, s, "serial") for s in data.get("serial", [])]
        cfg.archive = _section(ArchiveConfig, data.get("archive", {}), "archive")
        cfg.archive.dir = _path(cfg.archive.dir, base)
        sim = data.get("simulation")
        if sim is not None:
            cfg.simulation = (
                None
                if sim.get("enabled") is False
                else _section(
                    SimulationConfig, {k: v for k, v in sim.items() if k != "enabled"}, "simulation"
                )
            )
        elif cfg.mqtt is not None or cfg.serial:
            cfg.simulation = None  # real devices configured: no simulated ones unless asked
        spark = data.get("spark", {})
        if not isinstance(spark, dict):
            raise ConfigError("[spark] must be a table (master, driver_memory, conf, ...)")
        cfg.spark = spark
        replay = data.get("replay", {})
        cfg.trace = _path(replay.get("trace"), base)
        cfg.stations = _path(replay.get("stations"), base)
        return cfg


def _section(kind: type, values: dict[str, Any], name: str) -> Any:
    if not isinstance(values, dict):
        raise ConfigError(f"[{name}] must be a table")
    fields = kind.__dataclass_fields__
    unknown = set(values) - set(fields)
    if unknown:
        raise ConfigError(
            f"[{name}]: unknown key(s) {', '.join(sorted(unknown))}; known: {', '.join(fields)}"
        )
    try:
        return kind(**values)
    except TypeError as e:
        raise ConfigError(f"[{name}]: {e}") from None


def _int(v: Any, key: str, minimum: int | None = None) -> int:
    if not isinstance(v, int) or (minimum is not None and v < minimum):
        raise ConfigError(
            f"{key} must be an integer{'' if minimum is None else f' >= {minimum}'}, got {v!r}"
        )
    return v


def _path(v: Any, base: Path) -> str | None:
    if v is None or v == "":
        return None
    p = Path(os.path.expanduser(str(v)))
    return str(p if p.is_absolute() else base / p)
