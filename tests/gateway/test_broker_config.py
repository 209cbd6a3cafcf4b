"""The [mqtt] section becomes the one BrokerSettings every MQTT client of the gateway uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import Config, ConfigError, MqttConfig
from sensors.transports.broker import broker_address, topic_problem


def test_every_connection_key_reaches_the_settings() -> None:
    cfg = MqttConfig(
        url="mqtt://broker:1884",
        username="gw",
        password="secret",
        tls=True,
        ca_file="/etc/ca.pem",
        client_id="site-1",
    )
    s = cfg.broker()
    assert (s.host, s.port, s.tls, s.ca_file) == ("broker", 1884, True, "/etc/ca.pem")
    assert (s.username, s.password, s.client_id) == ("gw", "secret", "site-1")
    assert (s.keepalive, s.reconnect_initial, s.reconnect_max) == (10, 0.1, 5.0)


def test_the_result_publishers_reconnect_more_patiently() -> None:
    s = MqttConfig(url="mqtts://broker").publisher_broker()
    assert (s.host, s.port, s.tls) == ("broker", 8883, True)
    assert (s.keepalive, s.reconnect_initial, s.reconnect_max) == (60, 0.5, 30.0)


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("mqtt://broker:1884", ("broker", 1884, False)),
        ("mqtts://broker", ("broker", 8883, True)),
        ("mqtt://broker/", ("broker", 1883, False)),
        ("tcp://10.0.0.5", ("10.0.0.5", 1883, False)),
        ("broker.lan:1884", ("broker.lan", 1884, False)),
        ("[::1]:1884", ("::1", 1884, False)),
        ("fd00::1", ("fd00::1", 1883, False)),
    ],
)
def test_broker_addresses_that_parse(url: str, address: tuple[str, int, bool]) -> None:
    assert broker_address(url) == address


@pytest.mark.parametrize(
    "url",
    [
        "",
        " ",
        "mqtt://",
        "mqtt://:1883",
        "mqtt://h:0",
        "mqtt://h:",
        "mqtt://h:99999",
        "mqtt://h:-1",
        "ftp://h",
        "mqtt://u:p@h",
        "mqtt://h/topic",
        "mqtt://h?x=1",
        "mqtt://h#frag",
        "mqtt://a b",
        "mqtt://[::zz]",
        "fd00::zz",
    ],
)
def test_broker_addresses_that_do_not(url: str) -> None:
    with pytest.raises(ValueError):
        broker_address(url)


def test_credentials_in_a_url_are_not_repeated_in_the_error() -> None:
    with pytest.raises(ValueError) as e:
        broker_address("mqtt://gw:s3cret@broker")
    assert "s3cret" not in str(e.value)


@pytest.mark.parametrize("prefix", ["fj/#", "fj/+", "#", "/fj", "fj/", "a//b", "", "a\0b"])
def test_no_transport_is_built_on_a_prefix_it_cannot_subscribe_with(prefix: str) -> None:
    from sensors.transports.mqtt import MqttTransport, Topics

    assert topic_problem(prefix) is not None
    with pytest.raises(ValueError, match="MQTT topic prefix"):
        Topics(prefix)
    with pytest.raises(ValueError, match="MQTT topic prefix"):
        MqttTransport(prefix=prefix)
    assert topic_problem("site-1/fjords") is None


def _load(tmp_path: Path, mqtt: str) -> Config:
    cfg = tmp_path / "gateway.toml"
    cfg.write_text(f"[mqtt]\n{mqtt}")
    return Config.load(cfg)


def test_the_password_comes_from_its_file_relative_to_the_config(tmp_path: Path) -> None:
    (tmp_path / "gw.password").write_text("s3cret\n")
    cfg = _load(tmp_path, 'username = "gateway"\npassword_file = "gw.password"\n')
    assert cfg.mqtt is not None
    s = cfg.mqtt.broker()
    assert (s.username, s.password, s.password_file) == (
        "gateway", "s3cret", str(tmp_path / "gw.password"),
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"\[mqtt\] password and password_file"):
        _load(tmp_path, 'password = "x"\npassword_file = "gw.password"\n')
    (tmp_path / "empty").write_text("")
    with pytest.raises(ConfigError, match=r"\[mqtt\] password_file: .*empty"):
        _load(tmp_path, 'password_file = "empty"\n')


@pytest.mark.parametrize("key", ["password_file", "ca_file", "certfile", "keyfile"])
def test_a_missing_file_names_its_key_and_path(tmp_path: Path, key: str) -> None:
    extra = 'certfile = "c.pem"\n' if key == "keyfile" else ""
    (tmp_path / "c.pem").write_text("x")
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, f'url = "mqtts://broker"\n{extra}{key} = "gone/nope.pem"\n')
    assert str(e.value) == f"[mqtt] {key}: file not found: {tmp_path / 'gone' / 'nope.pem'}"


def test_files_that_cannot_serve(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[mqtt\] certfile: not a regular file"):
        _load(tmp_path, f'url = "mqtts://broker"\ncertfile = "{tmp_path}"\n')
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=r"\[mqtt\] certfile: cannot load the client cert"):
        _load(tmp_path, 'url = "mqtts://broker"\ncertfile = "junk.pem"\n')
    with pytest.raises(ConfigError, match=r"\[mqtt\] ca_file: no CA certificate in"):
        _load(tmp_path, 'url = "mqtts://broker"\nca_file = "junk.pem"\n')
    with pytest.raises(ConfigError, match=r"\[mqtt\] keyfile: needs certfile"):
        _load(tmp_path, 'url = "mqtts://broker"\nkeyfile = "junk.pem"\n')
    with pytest.raises(ConfigError, match=r"\[mqtt\] certfile: needs TLS"):
        _load(tmp_path, 'url = "mqtt://broker"\ncertfile = "junk.pem"\n')


def test_a_client_certificate_reaches_every_client(tmp_path: Path) -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("gateway.example", common_name="gateway")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "gw.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "gw.key"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    cfg = _load(
        tmp_path,
        'url = "mqtts://broker"\nca_file = "ca.pem"\ncertfile = "gw.pem"\nkeyfile = "gw.key"\n',
    )
    assert cfg.mqtt is not None
    for s in (cfg.mqtt.broker(), cfg.mqtt.publisher_broker()):
        assert (s.certfile, s.keyfile) == (str(tmp_path / "gw.pem"), str(tmp_path / "gw.key"))
        assert s.tls_context() is not None
