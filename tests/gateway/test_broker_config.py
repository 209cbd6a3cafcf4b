"""The [mqtt] section becomes the one BrokerSettings every MQTT client of the gateway uses."""

from __future__ import annotations

from gateway.config import MqttConfig


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
