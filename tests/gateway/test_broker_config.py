"""The [mqtt] section becomes the one BrokerSettings every MQTT client of the gateway uses."""

from __future__ import annotations

import pytest

from gateway.config import MqttConfig
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
