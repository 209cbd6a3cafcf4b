"""BrokerSettings: one description of a broker connection, parsed from a URL or flags."""

from __future__ import annotations

import socket
import ssl

import aiomqtt
import pytest
from aiomqtt.exceptions import MqttConnectError
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode

from sensors.transports.broker import (
    BrokerSettings,
    broker_address,
    file_problem,
    read_secret,
    refused,
)


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


def _raised_from(cause: BaseException) -> aiomqtt.MqttError:
    """An MqttError as aiomqtt raises it: from within the except of the OS or TLS error."""
    try:
        try:
            raise cause
        except OSError as exc:
            raise aiomqtt.MqttError(str(exc))  # noqa: B904 - as aiomqtt does
    except aiomqtt.MqttError as e:
        return e


def test_a_failed_connection_says_what_failed() -> None:
    s = BrokerSettings("broker", 8883, tls=True, ca_file="/etc/ca.pem", username="m1",
                       password="x", password_file="/etc/motes.passwd")  # fmt: skip
    text = s.explain(MqttConnectError(ReasonCode(PacketTypes.CONNACK, identifier=135)))
    assert text == (
        "broker broker:8883 refused the connection: not authorised (CONNACK code 135)"
        " (user 'm1', password from /etc/motes.passwd)"
    )
    assert "bad username or password (CONNACK code 4)" in s.explain(MqttConnectError(4))
    assert refused(MqttConnectError(5))
    verify = ssl.SSLCertVerificationError(1, "certificate verify failed")
    verify.verify_message = "unable to get local issuer certificate"
    text = s.explain(_raised_from(verify))
    assert text == (
        "TLS: the certificate of broker broker did not verify against CA file /etc/ca.pem:"
        " unable to get local issuer certificate"
    )
    assert refused(_raised_from(verify))
    plain = BrokerSettings("broker", 1883)
    refusal = plain.explain(_raised_from(ConnectionRefusedError(111, "Connection refused")))
    assert "connection to broker broker:1883 refused" in refusal
    assert not refused(_raised_from(ConnectionRefusedError(111, "Connection refused")))
    assert "not found" in plain.explain(_raised_from(socket.gaierror(-2, "Name unknown")))
    assert "did not answer" in plain.explain(_raised_from(TimeoutError()))


def test_file_problems(tmp_path) -> None:
    assert file_problem(str(tmp_path / "x")) == f"file not found: {tmp_path / 'x'}"
    assert file_problem(str(tmp_path)) == f"not a regular file: {tmp_path}"
    (tmp_path / "ok").write_text("pw\n")
    assert file_problem(str(tmp_path / "ok")) is None
    assert read_secret(str(tmp_path / "ok")) == "pw"
