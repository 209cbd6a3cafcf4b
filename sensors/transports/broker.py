"""How an MQTT client reaches its broker: one frozen :class:`BrokerSettings` for every client.

The gateway's sensor transports, its plain-device transport, the results bridge and the result
sinks, and the simulated motes of ``simulate-motes`` all connect through
:meth:`BrokerSettings.client`, built once from the ``[mqtt]`` section, a broker URL or the
command line. A setting added here (TLS client certificates, say) therefore reaches every
client. What differs between clients is theirs to pass: the client id, a last will, session
persistence, an inbound queue.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from fjords.supervision import Backoff

if TYPE_CHECKING:
    import aiomqtt

__all__ = ["NO_DELAY", "BrokerSettings", "broker_address"]

#: Every client's socket sends at once: Nagle's algorithm would hold a small packet (a sample
#: packet, a control, a result row) until the previous one is acknowledged, and the receiver
#: delays its acknowledgement by up to 40 ms.
NO_DELAY = ((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),)


def broker_address(text: str) -> tuple[str, int, bool]:
    """(host, port, tls) of `mqtt://host:port`, `mqtts://host` (TLS), `host`, `host:port`,
    `[v6]:port` or a bare v6 address."""
    if "://" not in text:
        if text.count(":") > 1 and not text.startswith("["):
            return text, 1883, False  # a bare IPv6 address
        text = f"mqtt://{text}"
    u = urlsplit(text)
    if u.scheme not in ("mqtt", "mqtts", "tcp", "ssl"):
        raise ValueError(f"unsupported MQTT URL scheme {u.scheme!r} (use mqtt:// or mqtts://)")
    tls = u.scheme in ("mqtts", "ssl")
    try:
        port = u.port
    except ValueError:
        raise ValueError(f"bad port in MQTT broker address {text!r}") from None
    return u.hostname or "127.0.0.1", port or (8883 if tls else 1883), tls


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """A broker and how to connect to it; the defaults suit the sensor links (a lost broker is
    noticed within 15 s, and tried again from 0.1 s up to every 5 s)."""

    host: str = "127.0.0.1"
    port: int = 1883
    tls: bool = False
    #: CA bundle the broker's certificate is checked against (None: the system's)
    ca_file: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    #: The configured client id prefix: a client that uses it says `{client_id}-{role}`.
    client_id: str | None = None
    #: Seconds between keep-alive pings; the broker drops a client silent for 1.5 times this.
    keepalive: int = 10
    reconnect_initial: float = 0.1
    reconnect_max: float = 5.0

    @classmethod
    def from_url(cls, url: str, *, tls: bool = False, **settings: Any) -> BrokerSettings:
        """Settings for the broker at `url` (see `broker_address`); `tls` asks for TLS even
        when the URL's scheme does not."""
        host, port, url_tls = broker_address(url)
        return cls(host, port, tls=tls or url_tls, **settings)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def backoff(self) -> Backoff:
        """A fresh backoff for one client's reconnects (each client keeps its own delay)."""
        return Backoff(self.reconnect_initial, self.reconnect_max)

    def identifier(self, role: str, default: str) -> str:
        """The client id of the client doing `role`: `{client_id}-{role}` when a prefix is
        configured, else `default`."""
        return f"{self.client_id}-{role}" if self.client_id else default

    def tls_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        return ssl.create_default_context(cafile=self.ca_file)

    def client(self, identifier: str, **options: Any) -> aiomqtt.Client:
        """An aiomqtt client for one session with this broker; `options` are the client's
        own (`will`, `clean_session`, its inbound queue...)."""
        import aiomqtt  # here: the settings are parsed with the config, often without MQTT

        return aiomqtt.Client(
            self.host,
            self.port,
            identifier=identifier,
            username=self.username,
            password=self.password,
            tls_context=self.tls_context(),
            keepalive=self.keepalive,
            socket_options=NO_DELAY,
            **options,
        )
