"""The gateway's configuration: a TOML file (see gateway.example.toml), or embedded defaults.

Every section is optional. The file is decoded into typed msgspec Structs, so a wrong type or an
unknown key is a ConfigError naming the key (`[http] port: expected int, got str`) instead of a
failure deep inside the daemon. Adding a key is one typed field with its default in its section;
adding a section is one Struct and one field of `Config`.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType, field

from fjords.errors import FjordsError
from sensors.plain_decoder import PlainStreamSpec, SpecError, topics_overlap
from sensors.transports.broker import BrokerSettings

MiB = 1024 * 1024

Positive = Annotated[int, Meta(ge=1)]
NonNegative = Annotated[int, Meta(ge=0)]
Seconds = Annotated[float, Meta(gt=0)]
NonNegativeSeconds = Annotated[float, Meta(ge=0)]


class ConfigError(FjordsError):
    """A configuration file that is missing, malformed, or has a bad value."""


class Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A TOML table: typed keys with defaults; unknown keys are errors (a typo is not ignored)."""


class HttpConfig(Section):
    host: str = "127.0.0.1"
    port: Annotated[int, Meta(ge=0, le=65535)] = 8080
    token: str | None = None  # every endpoint but /healthz needs it (writes need this one)
    read_token: str | None = None  # a second token that may only read (GET)
    allowed_origins: list[str] = []  # browser origins allowed besides the gateway's own
    allow_unauthenticated: bool = False  # bind a non-loopback address without a token
    max_body_bytes: Positive = 64 * 1024
    client_buffer_rows: Positive = 10_000
    replay_rows: Annotated[int, Meta(ge=0)] = 1000  # rows kept per query for ?since= (0: off)


class SinksConfig(Section):
    """Gateway-wide limits of the result sinks (gateway/sinks/spec.py SinkSettings, key for key)."""

    dir: str | None = None  # file sinks' root; unset: <state dir>/sinks (none: no file sinks)
    max_per_query: Positive = 8
    max_queue_rows: Positive = 100_000
    webhook_timeout_s: Seconds = 10.0
    webhook_max_attempts: Positive = 5
    webhook_backoff_initial_s: Seconds = 0.5
    webhook_backoff_max_s: Seconds = 30.0
    mqtt_max_groups: Positive = 10_000
    mqtt_topic_prefix: str | None = None  # unset: [mqtt] topic_prefix
    webhook_hosts: list[str] = field(default_factory=list)  # empty: any host


class StateConfig(Section):
    dir: str | None = None
    persist: bool = True  # false: keep no queries across restarts (as `run --no-state`)


class RuntimeConfig(Section):
    queue_bound: Positive = 65_536
    max_lag_seconds: Seconds | None = None  # optional event-time cap (off: idleness decides)
    max_future_seconds: Seconds = 300.0  # a sample dated further ahead of the clock is rejected
    idle_timeout_s: Seconds = 30.0  # wall-clock idleness that releases a quiet sensor
    scheduler: Literal["ticket", "round-robin"] = "ticket"  # ticket: PRIORITY n sets CPU shares
    # How the Fjord shares the event loop (gateway.run_loop.RunLoop, key for key).
    router_slice_rows: Annotated[int, Meta(ge=1, le=4096)] = 256
    gather_rows: Positive = 256
    gather_ms: Annotated[float, Meta(ge=0, le=1000)] = 0.0  # milliseconds; 0: off
    yield_for_results: bool = True
    yield_backlog_rows: Positive = 2048
    gc_freeze: bool = True  # long-lived objects out of the collector's full passes
    gc_quiet_s: Annotated[float, Meta(ge=0, le=3600)] = 5.0  # after the last query or sensor change
    # Time-window queries differing only in an IN / = condition on a GROUP BY column
    # share one aggregate of the groups they want (fjords.compile.planner._group_filters_last).
    share_group_filters: bool = True


class LimitsConfig(Section):
    """fjords.limits.Limits, key for key (the engine's defaults; see that module for meanings)."""

    max_panes_per_window: Positive = 10_000
    max_windows_per_pane: Positive = 10_000
    max_windows_per_transition: Positive = 64
    max_rows_window: Positive = 100_000
    max_groups_per_window: Positive = 10_000
    max_state_bytes_per_query: Positive = 64 * MiB
    max_in_list: Positive = 1000
    max_sql_chars: Positive = 16_384
    max_queries: Positive = 1000
    max_union_held_rows: Positive = 100_000
    max_join_rows: Positive = 100_000
    max_snapshot_readings: Positive = 2_000_000
    max_backfill_readings: Positive = 2_000_000


class MqttColumnConfig(Section):
    """One column of a plain MQTT stream: where its value is in the device's document."""

    path: str  # dotted keys, e.g. "AM2301.Temperature"; a list item is a number ("a.0.b")
    type: Literal["float", "int", "str", "bool"] = "float"
    optional: bool = False  # true: a missing value is NULL; false: the reading is dropped
    unit: str | None = None  # of measurement, shown to Home Assistant


class MqttStreamConfig(Section):
    """One `[[mqtt.streams]]`: plain devices (Tasmota, Zigbee2MQTT...) publishing JSON."""

    name: str
    topic: str  # an MQTT topic filter, e.g. "tele/+/SENSOR"
    sensor_id_level: NonNegative  # which level (from 0) names the sensor; it must be a '+'
    columns: dict[str, MqttColumnConfig]  # name -> where its value is, and its type
    format: Literal["json", "msgpack"] = "json"
    time_path: str | None = None  # epoch seconds or ISO-8601; unset: arrival time
    time_zone: str = "UTC"  # of ISO-8601 times without an offset (Tasmota's); "local": ours
    max_payload_bytes: Positive = 64 * 1024
    max_depth: Annotated[int, Meta(ge=1, le=64)] = 16


class MqttConfig(Section):
    url: str = "mqtt://127.0.0.1:1883"
    username: str | None = None
    password: str | None = None
    tls: bool = False
    ca_file: str | None = None
    topic_prefix: str = "fjords"
    home_assistant_discovery: bool = False
    qos: Literal[0, 1, 2] = 1  # sensor data; 0 loses (and counts) what arrives while away
    clean_session: bool = False
    client_id: str | None = None
    streams: list[MqttStreamConfig] = []

    def broker(self) -> BrokerSettings:
        """The broker as every MQTT client of the gateway connects to it (each with its own
        client id)."""
        return BrokerSettings.from_url(
            self.url,
            tls=self.tls,
            ca_file=self.ca_file,
            username=self.username,
            password=self.password,
            client_id=self.client_id,
        )

    def publisher_broker(self) -> BrokerSettings:
        """The same broker for the result publishers (the MQTT bridge and sinks): they
        reconnect more patiently (0.5 s up to 30 s; what they send waits in bounded buffers)
        and ping every 60 s, where the sensor links want a lost broker noticed within 15 s."""
        return dataclasses.replace(
            self.broker(), keepalive=60, reconnect_initial=0.5, reconnect_max=30.0
        )


class SensorsConfig(Section):
    max_sensors: Positive = 10_000
    forget_offline_after_s: Seconds = 86_400.0
    wake_check_s: Seconds = 30.0  # a sleeping sensor's receive window comes this often
    retry_after_s: Seconds = 2.0  # wall time a control waits for its ack before it is re-sent
    #: a sensor whose data stops while its program should send is stalled after this many of
    #: its expected periods (or windows) without data, and at least stall_min_s of wall clock
    stall_after: Seconds = 3.0
    stall_min_s: NonNegativeSeconds = 10.0
    #: new sensor ids each source (transport) may introduce per minute; past it they are dropped
    max_new_per_minute: Positive = 600
    #: ids that send data but no hello are forgotten after this long without a message ...
    forget_unknown_after_s: Seconds = 300.0
    #: ... and at most this many are held (the oldest forgotten first); apart from max_sensors
    max_unknown: Positive = 1024


class SerialConfig(Section):
    device: str
    baud: Positive = 115200


class ArchiveConfig(Section):
    dir: str | None = None
    segment_rows: Positive = 50_000
    segment_seconds: Seconds = 300.0
    #: rows waiting for the disk at which the gateway stops reading its links
    max_pending_rows: Positive = 200_000
    #: the archive's own demand: every sensor of an archived stream samples at least this
    #: often (unset: at its own period; 0: no demand, the archive holds what queries take)
    sample_period_s: Annotated[float, Meta(ge=0)] | None = None


class HistoryConfig(Section):
    """The streams' transient segment (fjords.runtime.history): what snapshots answer from."""

    keep_s: NonNegativeSeconds = 3600.0  # event time kept behind the newest reading; 0: none
    max_rows: Positive = 10_000_000  # about 20 bytes each for `traffic`; past it the oldest go
    bucket_s: Seconds = 60.0  # time buckets of its per-sensor aggregates


class SimulationConfig(Section):
    enabled: bool = True
    traffic_pair: bool = True
    stations: NonNegative = 40
    segments: Positive = 8
    speedup: Seconds = 60.0


class ReplayConfig(Section):
    trace: str | None = None
    stations: str | None = None
    speedup: Annotated[float, Meta(gt=0)] | None = None  # x real time; unset: as fast as it goes


class SparkSection(Section, omit_defaults=True):
    """`[spark]`, checked here and handed on as a mapping to gateway.spark.session.SparkConfig
    (which owns the defaults: an unset key stays unset)."""

    master: str | UnsetType = UNSET
    app_name: str | UnsetType = UNSET
    driver_memory: str | UnsetType = UNSET
    executor_memory: str | UnsetType = UNSET
    shuffle_partitions: Positive | UnsetType = UNSET
    ui: bool | UnsetType = UNSET
    conf: dict[str, str | int | float | bool] | UnsetType = UNSET


class QueryEntry(Section, omit_defaults=True):
    """One `[[queries]]` entry, installed at start."""

    sql: str
    id: str | UnsetType = UNSET
    publish: Literal["mqtt"] | UnsetType = UNSET
    engine: Literal["fjords", "spark"] | UnsetType = UNSET
    sinks: list[dict[str, Any]] | UnsetType = UNSET  # as in POST /queries (checked at start)


class ConfigFile(Section):
    """The file's layout, section by section."""

    http: HttpConfig = field(default_factory=HttpConfig)
    state: StateConfig = field(default_factory=StateConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    sensors: SensorsConfig = field(default_factory=SensorsConfig)
    tables: dict[str, str] = {}
    queries: list[QueryEntry] = []
    mqtt: MqttConfig | None = None
    serial: list[SerialConfig] = []
    archive: ArchiveConfig = field(default_factory=ArchiveConfig)
    history: HistoryConfig = field(default_factory=HistoryConfig)
    simulation: SimulationConfig | None = None
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    spark: SparkSection = field(default_factory=SparkSection)
    sinks: SinksConfig = field(default_factory=SinksConfig)


class Config(msgspec.Struct, kw_only=True):
    """The daemon's settings, with the attribute names the rest of the code uses."""

    http: HttpConfig = field(default_factory=HttpConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    sensors: SensorsConfig = field(default_factory=SensorsConfig)
    state_dir: str | None = None
    tables: dict[str, str] = {}
    queries: list[dict[str, Any]] = []
    mqtt: MqttConfig | None = None
    serial: list[SerialConfig] = []
    archive: ArchiveConfig = field(default_factory=ArchiveConfig)
    history: HistoryConfig = field(default_factory=HistoryConfig)
    simulation: SimulationConfig | None = field(default_factory=SimulationConfig)
    trace: str | None = None
    stations: str | None = None
    replay_speedup: float | None = None
    persist_state: bool = True
    spark: dict[str, Any] = {}  # [spark] as given (checked), for SparkConfig.from_mapping
    sinks: SinksConfig = field(default_factory=SinksConfig)

    @property
    def queue_bound(self) -> int:
        return self.runtime.queue_bound

    @queue_bound.setter
    def queue_bound(self, value: int) -> None:
        self.runtime.queue_bound = value

    @property
    def max_lag_seconds(self) -> float | None:
        return self.runtime.max_lag_seconds

    @max_lag_seconds.setter
    def max_lag_seconds(self, value: float | None) -> None:
        self.runtime.max_lag_seconds = value

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Config:
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {p}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"cannot read config file {p}: {e}") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: not valid TOML: {e}") from None
        return cls.from_dict(data, base=p.parent)

    @classmethod
    def from_dict(cls, data: dict[str, Any], base: Path | None = None) -> Config:
        _check_stream_columns(data)
        try:
            f = msgspec.convert(data, ConfigFile)
        except msgspec.ValidationError as e:
            raise ConfigError(_explain(str(e))) from None
        base = base or Path.cwd()
        sim = f.simulation
        if sim is None:  # real devices configured: no simulated ones unless asked
            sim = None if (f.mqtt is not None or f.serial) else SimulationConfig()
        f.archive.dir = _path(f.archive.dir, base)
        cfg = cls(
            http=f.http,
            runtime=f.runtime,
            limits=f.limits,
            sensors=f.sensors,
            state_dir=_path(f.state.dir, base),
            tables={name: _path(p, base) or "" for name, p in f.tables.items()},
            queries=[msgspec.to_builtins(q) for q in f.queries],
            mqtt=f.mqtt,
            serial=f.serial,
            archive=f.archive,
            history=f.history,
            simulation=sim if sim is None or sim.enabled else None,
            trace=_path(f.replay.trace, base),
            stations=_path(f.replay.stations, base),
            replay_speedup=f.replay.speedup,
            persist_state=f.state.persist,
            spark=_spark(f.spark),
            sinks=f.sinks,
        )
        cfg.sinks.dir = _path(cfg.sinks.dir, base)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Checks across keys; run again after command-line overrides (e.g. `--http`)."""
        h = self.http
        for key in ("token", "read_token"):
            value = getattr(h, key)
            if value is not None and not value.strip():
                raise ConfigError(
                    f"[http] {key}: an empty token would disable authentication; "
                    "remove the key or set a secret"
                )
        if h.read_token is not None and h.token is None:
            raise ConfigError("[http] read_token needs a token (the one that may write)")
        if h.read_token is not None and h.read_token == h.token:
            raise ConfigError("[http] read_token must differ from token")
        if h.token is None and not h.allow_unauthenticated and not is_loopback(h.host):
            raise ConfigError(
                f"[http] host {h.host!r} is reachable from other machines and no token is set: "
                "set [http] token, bind 127.0.0.1, or set allow_unauthenticated = true"
            )
        if (self.trace is None) != (self.stations is None):
            raise ConfigError("[replay] trace and stations go together")
        for i, q in enumerate(self.queries):
            if q.get("publish") == "mqtt" and self.mqtt is None:
                raise ConfigError(f'[[queries]] #{i + 1}: publish = "mqtt" needs an [mqtt] section')
        self.plain_streams()

    def plain_streams(self) -> list[PlainStreamSpec]:
        """`[[mqtt.streams]]`, checked: a ConfigError names the entry and the key at fault."""
        if self.mqtt is None:
            return []
        taken = {"traffic", "vehicles", *self.tables}
        own = f"{self.mqtt.topic_prefix}/#"
        specs = []
        for i, st in enumerate(self.mqtt.streams):
            where = f"[[mqtt.streams]] #{i + 1} ({st.name})"
            try:
                spec = PlainStreamSpec.build(
                    name=st.name,
                    topic=st.topic,
                    sensor_id_level=st.sensor_id_level,
                    columns={k: msgspec.structs.asdict(c) for k, c in st.columns.items()},
                    format=st.format,
                    time_path=st.time_path,
                    time_zone=st.time_zone,
                    max_payload_bytes=st.max_payload_bytes,
                    max_depth=st.max_depth,
                    reserved=taken,
                )
            except SpecError as e:
                raise ConfigError(f"{where} {e}") from None
            if topics_overlap(st.topic, own):
                raise ConfigError(
                    f"{where} topic: {st.topic!r} overlaps the gateway's own topics ({own}): "
                    "its results and motes' messages would be read as readings"
                )
            taken.add(st.name)
            specs.append(spec)
        return specs

    def exposed_without_token(self) -> bool:
        """True when anyone on the network may use the API (allowed by allow_unauthenticated)."""
        return self.http.token is None and not is_loopback(self.http.host)


def is_loopback(host: str) -> bool:
    """Whether `host` only accepts connections from this machine (names other than localhost
    are treated as reachable: they may resolve to anything)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<key>[^`]*)`")
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")


def _explain(message: str) -> str:
    """msgspec's `Expected `int`, got `str` - at `$.http.port`` as `[http] port: expected int,
    got str`, and unknown keys with the known ones."""
    m = _AT.match(message)
    assert m is not None
    msg, path = m["msg"], m["path"] or ""
    steps = [(name, idx) for name, idx in _STEP.findall(path)]
    where: list[str] = []
    kind: Any = ConfigFile
    section = ""
    for name, idx in steps:
        if idx == "...":  # a table's key: msgspec does not say which
            where.append("(a value)")
            continue
        if idx and where:  # an item of a key's list
            where[-1] += f"[{idx}]"
            continue
        if idx:  # an [[array]] table
            section = f"[[{section.strip('[]')}]] #{int(idx) + 1}" if section else f"#{idx}"
            continue
        if not section:
            section = f"[{name}]"
        else:
            where.append(name)
        kind = _field_type(kind, name)
    text = msg.replace("`", "")
    unknown = _UNKNOWN.match(msg)
    if unknown:
        is_struct = isinstance(kind, type) and issubclass(kind, msgspec.Struct)
        known = ", ".join(kind.__struct_fields__) if is_struct else ""
        if not section:
            return f"unknown section [{unknown['key']}]; known: {known}"
        return f"{section} unknown key {unknown['key']!r}" + (f"; known: {known}" if known else "")
    text = text[:1].lower() + text[1:]
    text = text.replace("object missing required field", "missing required key")
    key = ".".join(where)
    if not section:
        return f"configuration: {text}"
    return f"{section} {key}: {text}" if key else f"{section}: {text}"


def _check_stream_columns(data: Any) -> None:
    """Each `[mqtt.streams.columns]` entry on its own first, so an error names the column
    (msgspec's message for a table's value does not)."""
    mqtt = data.get("mqtt") if isinstance(data, dict) else None
    streams = mqtt.get("streams") if isinstance(mqtt, dict) else None
    if not isinstance(streams, list):
        return
    for i, st in enumerate(streams):
        cols = st.get("columns") if isinstance(st, dict) else None
        if not isinstance(cols, dict):
            continue
        for name, col in cols.items():
            try:
                msgspec.convert(col, MqttColumnConfig)
            except msgspec.ValidationError as e:
                m = _AT.match(str(e))
                assert m is not None
                text = m["msg"].replace("`", "")
                text = text[:1].lower() + text[1:]
                text = text.replace("object missing required field", "missing required key")
                text = text.replace("object contains unknown field", "unknown key")
                key = f"columns.{name}" + (f"{m['path']}" if m["path"] else "")
                if m["path"] == ".type":
                    text += " (known: float, int, str, bool)"
                elif "unknown key" in text or "missing required key" in text:
                    text += " (keys: path, type, optional, unit)"
                raise ConfigError(
                    f"[[mqtt.streams]] #{i + 1} ({st.get('name', '?')}) {key}: {text}"
                ) from None


def _field_type(kind: Any, name: str) -> Any:
    """The Struct type of field `name` of Struct `kind` (through lists and optionals), if any."""
    if not (isinstance(kind, type) and issubclass(kind, msgspec.Struct)):
        return None
    info = msgspec.inspect.type_info(kind)
    for f in getattr(info, "fields", ()):
        if f.name == name:
            t = f.type
            while True:
                if isinstance(t, msgspec.inspect.UnionType):
                    t = next((x for x in t.types if not isinstance(x, msgspec.inspect.NoneType)), t)
                    if isinstance(t, msgspec.inspect.UnionType):
                        return None
                elif isinstance(t, msgspec.inspect.ListType):
                    t = t.item_type
                elif isinstance(t, msgspec.inspect.StructType):
                    return t.cls
                else:
                    return None
    return None


def _spark(section: SparkSection) -> dict[str, Any]:
    """[spark] as set; TOML booleans in `conf` as Spark spells them ("true", not "True")."""
    out: dict[str, Any] = msgspec.to_builtins(section)
    if "conf" in out:
        out["conf"] = {
            k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in out["conf"].items()
        }
    return out


def _path(v: Any, base: Path) -> str | None:
    if v is None or v == "":
        return None
    p = Path(os.path.expanduser(str(v)))
    return str(p if p.is_absolute() else base / p)
