"""The configuration is decoded into typed sections: every mistake is a ConfigError naming its key."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from gateway.config import Config, ConfigError, is_loopback
from gateway.spark.session import SparkConfig
from tests.support import ROOT


def load(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    return Config.load(path)


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[http]\nport = "abc"', "[http] port: expected int, got str"),
        ("[http]\nport = 70000", "[http] port: expected int <= 65535"),
        (
            '[runtime]\nmax_lag_seconds = "x"',
            "[runtime] max_lag_seconds: expected float | null, got str",
        ),
        ("[runtime]\nqueue_bound = 0", "[runtime] queue_bound: expected int >= 1"),
        ("[http]\nprot = 1", "[http] unknown key 'prot'; known: host, port"),
        ("[htp]\nport = 1", "unknown section [htp]; known: http"),
        ("http = 5", "[http]: expected object, got int"),
        ('[http]\ntoken = ""', "[http] token: an empty token would disable authentication"),
        ('[http]\ntoken = "  "', "[http] token: an empty token"),
        ('[http]\ntoken = "a"\nread_token = ""', "[http] read_token: an empty token"),
        ('[http]\nread_token = "r"', "[http] read_token needs a token"),
        ('[http]\ntoken = "a"\nread_token = "a"', "read_token must differ from token"),
        ('[http]\nhost = "0.0.0.0"', "[http] host '0.0.0.0' is reachable from other machines"),
        ('[http]\nhost = "gateway.lan"', "no token is set"),
        ("[http]\nallowed_origins = [1]", "[http] allowed_origins[0]: expected str, got int"),
        ("[mqtt]\nqos = 3", "[mqtt] qos: invalid enum value 3"),
        ('[mqtt]\nclean_session = "no"', "[mqtt] clean_session: expected bool, got str"),
        ("[[serial]]\nbaud = 9600", "[[serial]] #1: missing required key device"),
        ('[[serial]]\ndevice = "/dev/a"\n[[serial]]\ndevice = 5', "[[serial]] #2 device: expected"),
        ("[[queries]]\nid = 'x'", "[[queries]] #1: missing required key sql"),
        ("[[queries]]\nsql = 'SELECT'\npublish = 'kafka'", "[[queries]] #1 publish: invalid enum"),
        ("[tables]\nincidents = 1", "[tables] (a value): expected str, got int"),
        ('[spark]\nmastr = "local"', "[spark] unknown key 'mastr'; known: master"),
        ('[spark]\nshuffle_partitions = "8"', "[spark] shuffle_partitions: expected int"),
        ("[limits]\nmax_queries = -1", "[limits] max_queries: expected int >= 1"),
        ("[sensors]\nforget_offline_after_s = 0", "[sensors] forget_offline_after_s: expected"),
        ("[runtime]\nmax_future_seconds = 'soon'", "[runtime] max_future_seconds: expected float"),
        ('[runtime]\nscheduler = "fifo"', "[runtime] scheduler: invalid enum value 'fifo'"),
        ('[replay]\ntrace = "a.csv"', "[replay] trace and stations go together"),
        ("[http\n", "not valid TOML"),
    ],
)
def test_mistakes_name_the_key(tmp_path: Path, toml: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(tmp_path, toml)
    assert message in str(e.value)


def test_defaults_and_the_keys_other_modules_read(tmp_path: Path) -> None:
    cfg = load(tmp_path, "")
    assert (cfg.http.host, cfg.http.port, cfg.http.token) == ("127.0.0.1", 8080, None)
    assert cfg.queue_bound == 65_536 and cfg.max_lag_seconds is None
    assert cfg.limits.max_queries == 1000 and cfg.limits.max_sql_chars == 16_384
    assert cfg.limits.max_in_list == 1000 and cfg.limits.max_panes_per_window == 10_000
    assert cfg.limits.max_windows_per_pane == 10_000 and cfg.limits.max_rows_window == 100_000
    assert cfg.limits.max_groups_per_window == 10_000

    from fjords.limits import Limits

    assert (
        Limits.from_mapping(msgspec.structs.asdict(cfg.limits)) == Limits()
    )  # one set of defaults
    assert cfg.limits.max_state_bytes_per_query == 64 * 1024 * 1024
    assert cfg.sensors.max_sensors == 10_000 and cfg.sensors.forget_offline_after_s == 86_400
    assert cfg.runtime.max_future_seconds == 300 and cfg.runtime.idle_timeout_s == 30
    assert cfg.runtime.scheduler == "ticket" and cfg.sensors.retry_after_s == 2.0
    assert cfg.mqtt is None and cfg.simulation is not None and cfg.spark == {}
    assert cfg.state_dir is None and cfg.archive.dir is None and cfg.tables == {}
    assert Config() == cfg


def test_values_paths_and_sections(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """
[http]
token = "t"
read_token = "r"
host = "0.0.0.0"
allowed_origins = ["https://dash.example"]
[state]
dir = "state"
[runtime]
max_lag_seconds = 3600
[mqtt]
qos = 1
client_id = "gw-1"
[tables]
incidents = "incidents.csv"
[[queries]]
id = "q"
sql = "SELECT * FROM traffic"
publish = "mqtt"
[spark]
master = "local[2]"
driver_memory = "2g"
[spark.conf]
"spark.sql.adaptive.enabled" = true
""",
    )
    assert cfg.http.read_token == "r" and cfg.http.allowed_origins == ["https://dash.example"]
    assert cfg.state_dir == str(tmp_path / "state")
    assert cfg.tables == {"incidents": str(tmp_path / "incidents.csv")}
    assert cfg.max_lag_seconds == 3600.0 and isinstance(cfg.max_lag_seconds, float)
    assert cfg.mqtt is not None and cfg.mqtt.qos == 1 and cfg.mqtt.clean_session is False
    assert cfg.mqtt.client_id == "gw-1"
    assert cfg.simulation is None  # real devices configured: no simulated ones unless asked
    assert cfg.queries == [{"id": "q", "sql": "SELECT * FROM traffic", "publish": "mqtt"}]
    spark = SparkConfig.from_mapping(cfg.spark)  # what the daemon does with it
    assert spark.master == "local[2]" and spark.driver_memory == "2g"
    assert spark.settings()["spark.sql.adaptive.enabled"] == "true"
    assert spark.shuffle_partitions == SparkConfig().shuffle_partitions  # unset stays unset


def test_simulation_switch(tmp_path: Path) -> None:
    assert load(tmp_path, "[simulation]\nenabled = false").simulation is None
    sim = load(tmp_path, "[mqtt]\n[simulation]\nstations = 3").simulation
    assert sim is not None and sim.stations == 3


def test_exposure(tmp_path: Path) -> None:
    cfg = load(tmp_path, '[http]\nhost = "0.0.0.0"\nallow_unauthenticated = true')
    assert cfg.exposed_without_token()
    assert not load(tmp_path, '[http]\nhost = "::"\ntoken = "t"').exposed_without_token()
    cfg = Config()
    cfg.http.host = "192.168.1.2"  # as `--http` does; validate() runs again after it
    with pytest.raises(ConfigError, match="reachable from other machines"):
        cfg.validate()


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.0.0.1", False),
        ("gateway.lan", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_the_example_config_documents_every_key() -> None:
    text = (ROOT / "gateway.example.toml").read_text()
    cfg = Config.load(ROOT / "gateway.example.toml")
    assert cfg.http.port == 8080
    sections = {
        "http": cfg.http,
        "runtime": cfg.runtime,
        "limits": cfg.limits,
        "sensors": cfg.sensors,
        "archive": cfg.archive,
    }
    from gateway.config import MqttConfig, SimulationConfig, SparkSection

    for name, section in [
        *sections.items(),
        ("mqtt", MqttConfig()),
        ("simulation", SimulationConfig()),
        ("spark", SparkSection()),
    ]:
        start = re.search(rf"^(# )?\[{name}\]$", text, re.M)
        assert start, f"[{name}] is not documented"
        block = text[start.end() :].split("\n[", 1)[0]
        for key in section.__struct_fields__:
            assert re.search(rf"\b{key} =|\[{name}\.{key}\]", block), f"[{name}] {key} undocumented"


def test_replay_speedup_state_persist_and_publish_needs_mqtt() -> None:
    cfg = Config.from_dict(
        {
            "replay": {"trace": "r.csv", "stations": "s.csv", "speedup": 600},
            "state": {"persist": False},
        }
    )
    assert cfg.replay_speedup == 600.0 and cfg.persist_state is False
    with pytest.raises(ConfigError, match=r'#1: publish = "mqtt" needs an \[mqtt\] section'):
        Config.from_dict({"queries": [{"sql": "SELECT * FROM traffic", "publish": "mqtt"}]})
    Config.from_dict({"queries": [{"sql": "SELECT * FROM traffic", "publish": "mqtt"}], "mqtt": {}})


def test_sinks_section_replay_rows_and_query_sinks(tmp_path: Path) -> None:
    from gateway.daemon import Gateway
    from gateway.sinks.spec import SinkSettings

    cfg = load(
        tmp_path,
        '[sinks]\nmax_per_query = 2\ndir = "out"\nwebhook_max_attempts = 3\n'
        "[http]\nreplay_rows = 5\n"
        '[[queries]]\nsql = "SELECT * FROM traffic"\n'
        'sinks = [{ type = "file", format = "ndjson", path = "all" }]\n',
    )
    settings = SinkSettings.from_config(cfg)
    assert settings.max_per_query == 2 and settings.webhook_max_attempts == 3
    assert settings.dir == str(tmp_path / "out")
    assert cfg.http.replay_rows == 5
    assert cfg.queries[0]["sinks"] == [{"type": "file", "format": "ndjson", "path": "all"}]
    assert Gateway(cfg).sinks.settings.max_per_query == 2
    with pytest.raises(ConfigError, match=r"\[sinks\] max_per_query"):
        load(tmp_path, "[sinks]\nmax_per_query = 0")


def test_sensor_control_timing_reaches_the_proxies(tmp_path: Path) -> None:
    from gateway.sources import _power_settings

    cfg = load(tmp_path, "[sensors]\nwake_check_s = 10\nretry_after_s = 5")
    assert _power_settings(cfg) == {"sleep_s": 10.0, "retry_after_s": 5.0}


def test_share_group_filters_reaches_the_fjord(tmp_path: Path) -> None:
    from gateway.daemon import Gateway

    assert Gateway(load(tmp_path, "")).engine.share_group_filters is True
    off = load(tmp_path, "[runtime]\nshare_group_filters = false")
    assert Gateway(off).engine.share_group_filters is False


def test_hierarchies_reach_the_catalog(tmp_path: Path) -> None:
    """`[[hierarchies]]` of a plain MQTT stream and the built-in traffic hierarchy are the
    catalog's, naming where each comes from."""
    from gateway.daemon import Gateway

    cfg = load(
        tmp_path,
        '[mqtt]\nurl = "mqtt://127.0.0.1:1"\n'
        '[[mqtt.streams]]\nname = "climate"\ntopic = "tele/+/SENSOR"\nsensor_id_level = 1\n'
        '[mqtt.streams.columns]\nfloor = { path = "f", type = "str" }\n'
        'room = { path = "r", type = "str" }\n'
        '[[hierarchies]]\nstream = "climate"\nlevels = ["floor", "room"]\n'
        '[[hierarchies]]\nstream = "vehicles"\nlevels = ["pair", "length"]\n',
    )
    streams = Gateway(cfg).fjord.catalog.streams
    assert [(h.levels, h.source) for h in streams["climate"].hierarchies] == [
        (("floor", "room"), "[[hierarchies]] #1")
    ]
    assert [str(h) for h in streams["vehicles"].hierarchies] == ["pair > length"]
    assert [(str(h), h.source) for h in streams["traffic"].hierarchies] == [
        ("segment > station", "the built-in traffic stream")
    ]


def test_gateway_id_defaults_to_the_host_name_made_to_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from gateway.archive_layout import GATEWAY_ID, default_gateway_id

    cfg = load(tmp_path, "")
    assert cfg.gateway.id == default_gateway_id() and GATEWAY_ID.match(cfg.gateway.id)
    assert load(tmp_path, '[gateway]\nid = "cabinet-12.site_b"').gateway.id == "cabinet-12.site_b"
    for host, want in [
        ("edge-1.example.org", "edge-1.example.org"),
        ("-weird host!", "weird-host-"),
        ("x" * 100, "x" * 63),
        ("!!!", "gateway"),
    ]:
        monkeypatch.setattr(socket, "gethostname", lambda h=host: h)
        assert default_gateway_id() == want


@pytest.mark.parametrize("gid", ["", "a b", "../up", "a/b", ".hidden", "-x", "x" * 64, "é"])
def test_a_gateway_id_that_names_no_directory_is_refused(tmp_path: Path, gid: str) -> None:
    with pytest.raises(ConfigError, match=r"^\[gateway\] id: .* is not a gateway id"):
        load(tmp_path, f'[gateway]\nid = "{gid}"')
    with pytest.raises(ConfigError, match=r"\[gateway\] id: expected str"):
        load(tmp_path, "[gateway]\nid = 7")


@pytest.mark.parametrize(
    "url",
    [
        "file:///srv/archive",
        "hdfs://namenode:8020/fjords/archive",
        "s3://bucket/fleet",
        "s3a://bucket/fleet/archive",
    ],
)
def test_archive_dir_urls_stay_urls(tmp_path: Path, url: str) -> None:
    cfg = load(tmp_path, f'[archive]\ndir = "{url}"')
    assert cfg.archive.dir == url
    if not url.startswith("file:"):
        cfg.check_paths()  # nothing local to check


def test_a_plain_archive_dir_is_still_resolved_against_the_config(tmp_path: Path) -> None:
    assert load(tmp_path, '[archive]\ndir = "arch"').archive.dir == str(tmp_path / "arch")


@pytest.mark.parametrize(
    "value, message",
    [
        ("ftp://host/x", "[archive] dir: unsupported URL scheme 'ftp'"),
        ("gs://bucket/x", "[archive] dir: unsupported URL scheme 'gs'"),
        ("s3a:/bucket/x", "[archive] dir: 's3a:/bucket/x' looks like a s3a: URL without '//'"),
        ("file://host/x", "[archive] dir: 'file://host/x': a file:// URL names a local path"),
        ("s3a:///x", "[archive] dir: 's3a:///x' names no host or bucket"),
    ],
)
def test_an_archive_url_the_archive_cannot_write_is_refused(
    tmp_path: Path, value: str, message: str
) -> None:
    with pytest.raises(ConfigError) as e:
        load(tmp_path, f'[archive]\ndir = "{value}"')
    assert message in str(e.value)
