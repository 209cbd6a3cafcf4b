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
import ssl
import stat
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import msgspec
from msgspec import UNSET, Meta, UnsetType, field

from fjords.errors import FjordsError
from gateway.archive_layout import GATEWAY_ID, URL_SCHEMES, default_gateway_id
from sensors.auth import Keyring, load_keys
from sensors.plain_decoder import PlainStreamSpec, SpecError, topics_overlap
from sensors.transports.broker import BrokerSettings, file_problem, read_secret, topic_problem

MiB = 1024 * 1024

#: The longest duration a key may give (ten years): `inf` or `1e308` is a mistake, not "never",
#: and would overflow the deadlines computed from it.
MAX_SECONDS = 10 * 366 * 86_400.0
#: The largest count or size a key may give (2**40: a tebibyte of bytes, a trillion rows).
MAX_COUNT = 2**40
#: A speedup (times real time) past which a replay is simply as fast as it goes.
MAX_SPEEDUP = 1e6
#: a path that starts like a URL without its '//' ("s3a:/bucket"): a typo, not a folder
_SCHEME_ONLY = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):/(?!/)")

Positive = Annotated[int, Meta(ge=1, le=MAX_COUNT)]
NonNegative = Annotated[int, Meta(ge=0, le=MAX_COUNT)]
Seconds = Annotated[float, Meta(gt=0, le=MAX_SECONDS)]
NonNegativeSeconds = Annotated[float, Meta(ge=0, le=MAX_SECONDS)]
Speedup = Annotated[float, Meta(gt=0, le=MAX_SPEEDUP)]


class ConfigError(FjordsError):
    """A configuration file that is missing, malformed, or has a bad value."""


class Section(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A TOML table: typed keys with defaults; unknown keys are errors (a typo is not ignored)."""


class GatewayConfig(Section):
    """Who this gateway is: `id` names it in every archived row, in the archive's `gateway=`
    directories and on /status (default: the host name, made to fit `GATEWAY_ID`)."""

    id: str = field(default_factory=default_gateway_id)


class HttpConfig(Section):
    host: str = "127.0.0.1"
    port: Annotated[int, Meta(ge=0, le=65535)] = 8080
    token: str | None = None  # every endpoint but /healthz needs it (writes need this one)
    read_token: str | None = None  # a second token that may only read (GET)
    allowed_origins: list[str] = []  # browser origins allowed besides the gateway's own
    allow_unauthenticated: bool = False  # bind a non-loopback address without a token
    max_body_bytes: Positive = 64 * 1024
    client_buffer_rows: Positive = 10_000
    replay_rows: NonNegative = 1000  # rows kept per query for ?since= (0: off)
    # What a client may hold before it is authenticated (gateway/http_guard.py, key for key).
    header_timeout_s: Annotated[float, Meta(gt=0, le=3600)] = 10.0  # a request's headers
    body_timeout_s: Annotated[float, Meta(gt=0, le=3600)] = 30.0  # a request's body
    keepalive_timeout_s: Annotated[float, Meta(gt=0, le=86_400)] = 75.0  # idle between requests
    max_requests_per_connection: Positive = 1000  # then `Connection: close`
    max_connections: Annotated[int, Meta(ge=1, le=1_000_000)] = 256  # open at once, overall
    max_connections_per_client: Positive = 32  # open at once from one client address
    write_rate_per_s: Annotated[float, Meta(ge=0, le=1_000_000)] = 20.0  # per client; 0: off
    write_burst: Annotated[int, Meta(ge=1, le=1_000_000)] = 100  # writes a client may send at once


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
    # What webhooks may reach besides public addresses (names, patterns, addresses, networks,
    # maybe :port); empty: public addresses only (gateway/sinks/address_policy.py)
    webhook_hosts: list[str] = field(default_factory=list)


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
    password_file: str | None = None  # the password is its first line (keeps it out of here)
    tls: bool = False
    ca_file: str | None = None
    certfile: str | None = None  # PEM client certificate: mutual TLS
    keyfile: str | None = None  # its private key (unset: in certfile)
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
            certfile=self.certfile,
            keyfile=self.keyfile,
            username=self.username,
            password=self.password,
            password_file=self.password_file,
            client_id=self.client_id,
        )

    def load_files(self, base: Path) -> None:
        """Resolve the certificate, key and password files against `base`, check that each can
        be read and loaded, and read the password: a ConfigError names the key and the path."""
        for key in ("password_file", "ca_file", "certfile", "keyfile"):
            path = _path(getattr(self, key), base)
            setattr(self, key, path)
            problem = path and file_problem(path)
            if problem:
                raise ConfigError(f"[mqtt] {key}: {problem}")
        if self.password_file is not None:
            if self.password is not None:
                raise ConfigError("[mqtt] password and password_file: set one of them")
            try:
                self.password = read_secret(self.password_file)
            except (OSError, ValueError) as e:
                raise ConfigError(f"[mqtt] password_file: {e}") from None
        if self.keyfile is not None and self.certfile is None:
            raise ConfigError("[mqtt] keyfile: needs certfile (the client certificate)")
        try:
            broker = self.broker()
        except ValueError as e:
            raise ConfigError(f"[mqtt] url: {e}") from None
        if not broker.tls:
            for key in ("ca_file", "certfile"):
                if getattr(self, key) is not None:
                    raise ConfigError(f"[mqtt] {key}: needs TLS (an mqtts:// url, or tls = true)")
            return
        try:
            ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"[mqtt] ca_file: no CA certificate in {self.ca_file}: {e}") from None
        try:
            broker.tls_context()
        except (OSError, ssl.SSLError) as e:
            key = "keyfile" if self.keyfile else "certfile"
            raise ConfigError(
                f"[mqtt] {key}: cannot load the client certificate {self.certfile}"
                f" with key {self.keyfile or self.certfile}: {e}"
            ) from None

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
    #: motes' keys (sensors.auth.load_keys: `<sensor_id> <32 hex>` lines, `*` the master key)
    keys_file: str | None = None
    #: refuse unsealed mote messages; default: true when keys_file is set, false otherwise
    require_mac: bool | None = None
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
    sample_period_s: NonNegativeSeconds | None = None
    #: how long SIGTERM's final flush may try a slow or failing disk; then the daemon exits,
    #: counting the rows it could not write (deploy/fjords-gateway.service's TimeoutStopSec
    #: must leave room for it)
    shutdown_timeout_s: Annotated[float, Meta(gt=0, le=3600)] = 10.0
    #: rewrite this gateway's closed days into few large files this often (gateway/compaction.py;
    #: unset: never, `fjords-gateway archive compact` does it when run)
    compact_every_s: Seconds | None = None


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
    speedup: Speedup = 60.0


class ReplayConfig(Section):
    trace: str | None = None
    stations: str | None = None
    speedup: Speedup | None = None  # x real time; unset: as fast as it goes


class SparkSection(Section, omit_defaults=True):
    """`[spark]`, checked here and handed on as a mapping to gateway.spark.session.SparkConfig
    (which owns the defaults: an unset key stays unset)."""

    master: str | UnsetType = UNSET
    remote: str | UnsetType = UNSET  # sc://host:port (Spark Connect); exclusive with master
    cores_max: Positive | UnsetType = UNSET  # spark.cores.max of the gateway's driver
    app_name: str | UnsetType = UNSET
    driver_memory: str | UnsetType = UNSET
    executor_memory: str | UnsetType = UNSET
    shuffle_partitions: Positive | UnsetType = UNSET
    ui: bool | UnsetType = UNSET
    conf: dict[str, str | int | float | bool] | UnsetType = UNSET
    max_restarts: NonNegative | UnsetType = UNSET
    restart_attempts: Positive | UnsetType = UNSET
    restart_backoff_s: NonNegativeSeconds | UnsetType = UNSET
    restart_backoff_max_s: NonNegativeSeconds | UnsetType = UNSET
    poll_s: Seconds | UnsetType = UNSET
    trigger: str | UnsetType = UNSET


class QueryEntry(Section, omit_defaults=True):
    """One `[[queries]]` entry, installed at start."""

    sql: str
    id: str | UnsetType = UNSET
    publish: Literal["mqtt"] | UnsetType = UNSET
    engine: Literal["fjords", "spark"] | UnsetType = UNSET
    sinks: list[dict[str, Any]] | UnsetType = UNSET  # as in POST /queries (checked at start)


class HierarchyEntry(Section):
    """One `[[hierarchies]]` entry: a stream's columns, coarse to fine (each value of a level
    lies under one value of the level before), so DRILLDOWN is checked against it."""

    stream: str
    levels: list[str]


class ConfigFile(Section):
    """The file's layout, section by section."""

    http: HttpConfig = field(default_factory=HttpConfig)
    state: StateConfig = field(default_factory=StateConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    sensors: SensorsConfig = field(default_factory=SensorsConfig)
    tables: dict[str, str] = {}
    queries: list[QueryEntry] = []
    hierarchies: list[HierarchyEntry] = []
    mqtt: MqttConfig | None = None
    serial: list[SerialConfig] = []
    archive: ArchiveConfig = field(default_factory=ArchiveConfig)
    history: HistoryConfig = field(default_factory=HistoryConfig)
    simulation: SimulationConfig | None = None
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    spark: SparkSection = field(default_factory=SparkSection)
    sinks: SinksConfig = field(default_factory=SinksConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)


class Config(msgspec.Struct, kw_only=True):
    """The daemon's settings, with the attribute names the rest of the code uses."""

    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    http: HttpConfig = field(default_factory=HttpConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    sensors: SensorsConfig = field(default_factory=SensorsConfig)
    state_dir: str | None = None
    tables: dict[str, str] = {}
    queries: list[dict[str, Any]] = []
    hierarchies: list[HierarchyEntry] = []
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
    #: the motes' keys, loaded from [sensors] keys_file by `validate` (None: no keys)
    keyring: Keyring | None = None

    @property
    def require_mac(self) -> bool:
        """Whether mote messages must be sealed ([sensors] require_mac, by default when keys
        are configured)."""
        wanted = self.sensors.require_mac
        return self.keyring is not None if wanted is None else wanted

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
            text = read_regular_file(p, MAX_CONFIG_BYTES).decode()
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {p}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"cannot read config file {p}: {e}") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: not valid TOML: {e}") from None
        except RecursionError:
            raise ConfigError(f"{p}: not valid TOML: arrays or tables nested too deeply") from None
        return cls.from_dict(data, base=p.parent)

    @classmethod
    def from_dict(cls, data: dict[str, Any], base: Path | None = None) -> Config:
        _check_values(data)
        _check_stream_columns(data)
        try:
            f = msgspec.convert(data, ConfigFile)
        except msgspec.ValidationError as e:
            raise ConfigError(_explain(str(e))) from None
        base = base or Path.cwd()
        sim = f.simulation
        if sim is None:  # real devices configured: no simulated ones unless asked
            sim = None if (f.mqtt is not None or f.serial) else SimulationConfig()
        f.archive.dir = _archive_root(f.archive.dir, base)
        if f.mqtt is not None:
            f.mqtt.load_files(base)
        f.sensors.keys_file = _path(f.sensors.keys_file, base)
        cfg = cls(
            gateway=f.gateway,
            http=f.http,
            runtime=f.runtime,
            limits=f.limits,
            sensors=f.sensors,
            state_dir=_path(f.state.dir, base),
            tables={name: _path(p, base) or "" for name, p in f.tables.items()},
            queries=[msgspec.to_builtins(q) for q in f.queries],
            hierarchies=f.hierarchies,
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
        gid = self.gateway.id
        if not GATEWAY_ID.match(gid):
            raise ConfigError(
                f"[gateway] id: {gid!r} is not a gateway id (1 to 63 letters, digits, '.', '_' "
                "or '-', starting with a letter or digit: it names a directory)"
            )
        arch = self.archive
        if arch.dir and arch.compact_every_s:
            from gateway.compaction import schedule_problem

            if why := schedule_problem(arch.dir):
                raise ConfigError(why)
        h = self.http
        for key in ("token", "read_token"):
            value = getattr(h, key)
            if value is not None and not value.strip():
                raise ConfigError(
                    f"[http] {key}: an empty token would disable authentication; "
                    "remove the key or set a secret"
                )
        if h.max_connections_per_client > h.max_connections:
            raise ConfigError(
                f"[http] max_connections_per_client ({h.max_connections_per_client}) is more "
                f"than max_connections ({h.max_connections})"
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
        self._load_keys()
        if (self.trace is None) != (self.stations is None):
            raise ConfigError("[replay] trace and stations go together")
        ids: dict[str, int] = {}
        for i, q in enumerate(self.queries):
            if q.get("publish") == "mqtt" and self.mqtt is None:
                raise ConfigError(f'[[queries]] #{i + 1}: publish = "mqtt" needs an [mqtt] section')
            qid = q.get("id")
            if qid is not None:
                if (problem := query_id_problem(qid)) is not None:
                    raise ConfigError(f"[[queries]] #{i + 1} id: {problem}")
                if qid in ids:
                    raise ConfigError(f"[[queries]] #{i + 1} id: {qid!r} is already #{ids[qid]}'s")
                ids[qid] = i + 1
        if self.mqtt is not None:
            try:
                self.mqtt.broker()
            except ValueError as e:
                raise ConfigError(f"[mqtt] url: {e}") from None
            if (problem := topic_problem(self.mqtt.topic_prefix)) is not None:
                raise ConfigError(f"[mqtt] topic_prefix: {problem}")
        prefix = self.sinks.mqtt_topic_prefix
        if prefix is not None and (problem := topic_problem(prefix)) is not None:
            raise ConfigError(f"[sinks] mqtt_topic_prefix: {problem}")
        self._check_webhooks()
        self.check_hierarchies(self.plain_streams())

    def check_hierarchies(self, plain: list[PlainStreamSpec]) -> None:
        """`[[hierarchies]]` against the streams the daemon will have: the built-in ones and
        `[[mqtt.streams]]`; a ConfigError names the entry."""
        if not self.hierarchies:
            return
        from fjords.catalog import hierarchy_problem
        from gateway.daemon import BUILTIN_STREAMS

        columns = {name: schema.names for name, schema in BUILTIN_STREAMS.items()}
        columns |= {spec.name: tuple(n for n, _, _ in spec.field_types()) for spec in plain}
        for i, h in enumerate(self.hierarchies):
            where = f"[[hierarchies]] #{i + 1} ({h.stream})"
            if h.stream not in columns:
                known = ", ".join(sorted(columns))
                raise ConfigError(f"{where} stream: unknown stream {h.stream!r}; known: {known}")
            if (problem := hierarchy_problem(h.levels, columns[h.stream])) is not None:
                raise ConfigError(f"{where} levels: {problem}")

    def check_paths(self) -> None:
        """The files and directories the settings name, as far as they can be checked before
        starting: a directory that exists is one, a file to read is a regular file (a FIFO
        would block the start for ever, a device never end)."""
        dirs = (
            ("[state] dir (--state-dir)", self.state_dir),
            ("[archive] dir", self.archive.dir),
            ("[sinks] dir", self.sinks.dir),
        )
        for key, d in dirs:
            if d is None:
                continue
            local = d
            if "://" in d:  # a URL: only a file:// one can be checked before starting
                if urlsplit(d).scheme != "file":
                    continue
                local = urlsplit(d).path
            p = Path(local).expanduser().absolute()
            while not p.exists() and p != p.parent:  # made at start: under a directory
                p = p.parent
            if not p.is_dir():
                raise ConfigError(f"{key} {d}: {p} is not a directory")
        files = [
            ("[replay] trace (--trace)", self.trace),
            ("[replay] stations (--stations)", self.stations),
            *((f"[tables] {name}", path) for name, path in self.tables.items()),
        ]
        for key, f in files:
            if f is not None:
                try:
                    check_regular_file(os.path.expanduser(f))
                except OSError as e:
                    raise ConfigError(f"{key} {f}: {e.strerror or e}") from None

    def _check_webhooks(self) -> None:
        """`[sinks] webhook_hosts` entries, and the configured webhooks against the address
        policy (what can be said without resolving names: they are checked at connect time)."""
        from gateway.sinks.address_policy import AddressPolicy, Refused, redact_url

        try:
            policy = AddressPolicy.from_entries(self.sinks.webhook_hosts, [self.http.port])
        except ValueError as e:
            raise ConfigError(f"[sinks] webhook_hosts: {e}") from None
        for i, q in enumerate(self.queries):
            for j, sink in enumerate(q.get("sinks") or []):
                if not isinstance(sink, dict) or sink.get("type") != "webhook":
                    continue
                url = sink.get("url")
                if not isinstance(url, str):
                    continue
                try:
                    policy.check_url(url)
                except Refused as e:
                    where = f"[[queries]] #{i + 1} sinks[{j}].url {redact_url(url[:200])!r}"
                    raise ConfigError(f"{where}: {e}") from None

    def _load_keys(self) -> None:
        path = self.sensors.keys_file
        if path is None:
            self.keyring = None
            if self.sensors.require_mac:
                raise ConfigError(
                    "[sensors] require_mac = true needs keys_file (the motes' keys to check)"
                )
            return
        try:
            self.keyring = load_keys(Path(path))
        except (ValueError, OSError) as e:
            raise ConfigError(f"[sensors] keys_file: {e}") from None
        if not self.keyring:
            raise ConfigError(f"[sensors] keys_file: {path} holds no keys")

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


#: A query id as the HTTP API, the state store, MQTT topics and file sinks' names can all
#: carry it: no '/', no wildcard, no '..', no leading dot.
QUERY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def query_id_problem(qid: str) -> str | None:
    """Why `qid` cannot be a query id, or None."""
    if QUERY_ID.fullmatch(qid) and ".." not in qid:
        return None
    return (
        f"{qid[:80]!r} is not a query id (1 to 64 letters, digits, '_', '.' or '-', "
        "starting with a letter or digit, no '..')"
    )


#: The largest configuration file read (a bigger one is a mistake: /dev/zero, a log file...).
MAX_CONFIG_BYTES = 4 * MiB
#: The longest string a key may hold (a query's text is the longest legitimate one).
MAX_STRING_CHARS = 1 * MiB
#: How deep tables and arrays may nest (the deepest key is `[[mqtt.streams]] columns.x.path`).
MAX_DEPTH = 16


def read_regular_file(path: Path, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most `max_bytes`. Its type is checked before it is
    opened and again on the open descriptor (opened non-blocking): a FIFO, a device or a
    directory is an OSError at once, never a read that blocks or never ends."""
    _check_regular(path, os.stat(path))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        _check_regular(path, st)  # replaced between the stat and the open
        if st.st_size > max_bytes:
            raise OSError(f"{st.st_size} bytes, more than {max_bytes}")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise OSError(f"more than {max_bytes} bytes")
    return data


def check_regular_file(path: str | os.PathLike[str]) -> None:
    """An OSError unless `path` is a regular file (one that can be read to its end at once)."""
    _check_regular(Path(path), os.stat(path))


def _check_regular(path: Path, st: os.stat_result) -> None:
    if stat.S_ISREG(st.st_mode):
        return
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    kind = next((name for test, name in kinds if test(st.st_mode)), "not a file")
    raise OSError(f"{kind}, not a regular file")


def _check_values(data: Any) -> None:
    """Before decoding: nesting, string lengths and NUL characters, each a ConfigError naming
    the key (walked without recursion, so depth is checked before anything recurses)."""
    todo: list[tuple[Any, tuple[str, ...]]] = [(data, ())]
    while todo:
        value, path = todo.pop()
        if len(path) > MAX_DEPTH:
            raise ConfigError(f"{_where(path[:MAX_DEPTH])}: nested more than {MAX_DEPTH} deep")
        if isinstance(value, str):
            if len(value) > MAX_STRING_CHARS:
                raise ConfigError(f"{_where(path)}: longer than {MAX_STRING_CHARS} characters")
            if "\0" in value:
                raise ConfigError(f"{_where(path)}: contains a NUL character")
        elif isinstance(value, dict):
            for k, v in value.items():
                if len(k) > 256 or "\0" in k:
                    raise ConfigError(f"{_where(path)}: a key is too long or contains NUL")
                todo.append((v, (*path, k)))
        elif isinstance(value, list):
            todo.extend((v, (*path, f"[{i}]")) for i, v in enumerate(value))


def _where(path: tuple[str, ...]) -> str:
    """`("http", "token")` as `[http] token`, `("queries", "[0]", "sql")` as
    `[[queries]] #1 sql` (as `_explain` names keys)."""
    if not path:
        return "configuration"
    head, tail = f"[{path[0]}]", path[1:]
    if tail and tail[0].startswith("["):
        head, tail = f"[[{path[0]}]] #{int(tail[0][1:-1]) + 1}", tail[1:]
    rest = "".join(p if p.startswith("[") else f".{p}" for p in tail).lstrip(".")
    return f"{head} {rest}" if rest else head


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
    from gateway.spark.session import SparkConfig  # (pyspark is imported only on first use)

    out: dict[str, Any] = msgspec.to_builtins(section)
    if "conf" in out:
        out["conf"] = {
            k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in out["conf"].items()
        }
    try:
        SparkConfig.from_mapping(out)  # keys that contradict each other (master and remote...)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return out


def _archive_root(v: str | None, base: Path) -> str | None:
    """`[archive] dir`: a plain path resolved as every path is; a URL kept as given (a scheme
    the archive cannot write to is a ConfigError now, not a local folder named `s3a:`)."""
    if v is None or v == "":
        return None
    if "://" not in v:
        if m := _SCHEME_ONLY.match(v):
            raise ConfigError(
                f"[archive] dir: {v!r} looks like a {m.group(1)}: URL without '//'; write "
                f"{m.group(1)}://..."
            )
        return _path(v, base)
    split = urlsplit(v)
    if split.scheme not in URL_SCHEMES:
        known = ", ".join(f"{s}://" for s in sorted(URL_SCHEMES))
        raise ConfigError(
            f"[archive] dir: unsupported URL scheme {split.scheme!r} (a path, or one of {known})"
        )
    if split.scheme == "file" and split.netloc not in ("", "localhost"):
        raise ConfigError(
            f"[archive] dir: {v!r}: a file:// URL names a local path (file:///abs/path)"
        )
    if split.scheme != "file" and not split.netloc:
        raise ConfigError(f"[archive] dir: {v!r} names no host or bucket")
    return v


def _path(v: Any, base: Path) -> str | None:
    if v is None or v == "":
        return None
    p = Path(os.path.expanduser(str(v)))
    return str(p if p.is_absolute() else base / p)
