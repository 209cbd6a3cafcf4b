"""BrokerSettings: one description of a broker connection, parsed from a URL or flags."""

from __future__ import annotations

import ssl

import pytest

from sensors.transports.broker import BrokerSettings, broker_address


def test_a_url_says_host_port_and_tls() -> None:
    s = BrokerSettings.from_url("mqtts://broker")
    assert (s.host, s.port, s.tls, s.address) == ("broker", 8883, True, "broker:8883")
    s = BrokerSettings.from_url("10.0.0.5:1884", tls=True)  # TLS asked for on a plain URL
    assert (s.host, s.port, s.tls) == ("10.0.0.5", 1884, True)
    assert not BrokerSettings.from_url("localhost").tls
    with pytest.raises(ValueError):
        BrokerSettings.from_url("http://broker")
    assert broker_address("[::1]:9") == ("::1", 9, False)


def test_tls_context_only_with_tls() -> None:
    assert BrokerSettings().tls_context() is None
    assert isinstance(BrokerSettings(tls=True).tls_context(), ssl.SSLContext)


def test_client_ids_and_a_hidden_password() -> None:
    s = BrokerSettings(username="gw", password="secret")
    assert s.identifier("sensors", "fjords-gateway-sensors") == "fjords-gateway-sensors"
    s = BrokerSettings(client_id="site-1", password="secret")
    assert s.identifier("sensors", "fjords-gateway-sensors") == "site-1-sensors"
    assert "secret" not in repr(s)


def test_each_client_gets_its_own_backoff() -> None:
    s = BrokerSettings(reconnect_initial=0.2, reconnect_max=0.8)
    a, b = s.backoff(), s.backoff()
    assert [a.next() for _ in range(4)] == [0.2, 0.4, 0.8, 0.8]
    assert b.next() == 0.2


async def test_the_client_is_made_from_the_settings() -> None:
    client = BrokerSettings("broker", 1884, keepalive=7, username="gw").client("id-1")
    assert client.identifier == "id-1"
    assert (client._hostname, client._port, client._keepalive) == ("broker", 1884, 7)
    assert client._client._username == b"gw"
