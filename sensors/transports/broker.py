"""How an MQTT client reaches its broker: one frozen :class:`BrokerSettings` for every client.

The gateway's sensor transports, its plain-device transport, the results bridge and the result
sinks, and the simulated motes of ``simulate-motes`` all connect through
:meth:`BrokerSettings.client`, built once from the ``[mqtt]`` section, a broker URL or the
command line. A setting added here (TLS client certificates, say) therefore reaches every
client. What differs between clients is theirs to pass: the client id, a last will, session
persistence, an inbound queue. :meth:`BrokerSettings.explain` turns a failed connection into
what an operator can act on (refused credentials, a certificate that did not verify, nothing
listening), so every client logs and reports the same words.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import ssl
import stat
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, urlsplit

from fjords.supervision import Backoff

if TYPE_CHECKING:
    import aiomqtt

__all__ = [
    "NO_DELAY",
    "BrokerSettings",
    "broker_address",
    "connect_refusal",
    "file_problem",
    "read_secret",
    "refused",
    "topic_problem",
]

#: Every client's socket sends at once: Nagle's algorithm would hold a small packet (a sample
#: packet, a control, a result row) until the previous one is acknowledged, and the receiver
#: delays its acknowledgement by up to 40 ms.
NO_DELAY = ((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),)

#: Certificates, keys and password files are small: a larger one is a wrong path (a log, a disk).
MAX_SECRET_FILE_BYTES = 1024 * 1024


#: A host name's characters (an IP literal is checked by `ipaddress`).
_HOST = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,252})")


def broker_address(text: str) -> tuple[str, int, bool]:
    """(host, port, tls) of `mqtt://host:port`, `mqtts://host` (TLS), `host`, `host:port`,
    `[v6]:port` or a bare v6 address. Anything else is a ValueError saying what is wrong: an
    empty address, no host, a port outside 1-65535, a path, credentials (they are settings of
    their own), another scheme."""
    if not text.strip():
        raise ValueError("empty MQTT broker address (e.g. mqtt://127.0.0.1:1883)")
    if "://" not in text:
        if text.count(":") > 1 and not text.startswith("["):
            return _ip6(text), 1883, False  # a bare IPv6 address
        text = f"mqtt://{text}"
    u = urlsplit(text)
    if u.scheme not in ("mqtt", "mqtts", "tcp", "ssl"):
        raise ValueError(f"unsupported MQTT URL scheme {u.scheme!r} (use mqtt:// or mqtts://)")
    tls = u.scheme in ("mqtts", "ssl")
    if u.username is not None or u.password is not None:
        raise ValueError(f"credentials in the MQTT URL {_redacted(u)!r}: set username/password")
    if u.path not in ("", "/") or u.query or u.fragment:
        raise ValueError(f"MQTT broker address {text!r} has a path or query: only host:port")
    try:
        port = u.port
    except ValueError:
        raise ValueError(f"bad port in MQTT broker address {text!r} (1-65535)") from None
    if port == 0 or (port is None and u.netloc.endswith(":")):
        raise ValueError(f"bad port in MQTT broker address {text!r} (1-65535)")
    host = u.hostname
    if not host:
        raise ValueError(f"no host in MQTT broker address {text!r}")
    if u.netloc.split("@")[-1].startswith("["):
        host = _ip6(host)
    elif not _HOST.fullmatch(host):
        raise ValueError(f"bad host {host!r} in MQTT broker address {text!r}")
    return host, port or (8883 if tls else 1883), tls


def _ip6(text: str) -> str:
    try:
        return str(ipaddress.IPv6Address(text))
    except ValueError:
        raise ValueError(f"bad IPv6 address {text!r} in MQTT broker address") from None


def _redacted(u: SplitResult) -> str:
    return u._replace(netloc=f"***@{u.netloc.rpartition('@')[2]}").geturl()


def topic_problem(prefix: str) -> str | None:
    """Why `prefix` cannot start topics that are published and subscribed to (the gateway's
    `{prefix}/sensors/+/data`, `{prefix}/results/...`), or None: wildcards, NUL, empty levels
    (a leading, trailing or double '/'), too long for MQTT."""
    if not prefix:
        return "empty (e.g. 'fjords')"
    if "#" in prefix or "+" in prefix:
        return (
            f"{prefix[:80]!r} contains an MQTT wildcard ('#' or '+'), which cannot be published to"
        )
    if "\0" in prefix:
        return "contains a NUL character"
    if "" in prefix.split("/"):
        return f"{prefix[:80]!r} has an empty topic level (a leading, trailing or double '/')"
    if len(prefix.encode("utf-8", "surrogatepass")) > 1024:
        return "longer than 1024 bytes"
    return None


def file_problem(path: str) -> str | None:
    """Why `path` cannot serve as a certificate, key or password file (None: it can): checked
    when the configuration is read, so a wrong path is named at start, not at each reconnect."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"file not found: {path}"
    except OSError as e:
        return f"cannot read {path}: {e.strerror or e}"
    if not stat.S_ISREG(st.st_mode):
        return f"not a regular file: {path}"
    if st.st_size > MAX_SECRET_FILE_BYTES:
        return f"{path} is too large for a certificate, key or password file ({st.st_size} bytes)"
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as e:
        return f"cannot read {path}: {e.strerror or e}"
    return None


def read_secret(path: str) -> str:
    """A password file's secret: its first line, without the line end (OSError, ValueError)."""
    with open(path, encoding="utf-8") as f:
        text = f.read(MAX_SECRET_FILE_BYTES)
    lines = text.splitlines()
    if not lines or not lines[0]:
        raise ValueError(f"{path} is empty (the password is its first line)")
    return lines[0]


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """A broker and how to connect to it; the defaults suit the sensor links (a lost broker is
    noticed within 15 s, and tried again from 0.1 s up to every 5 s)."""

    host: str = "127.0.0.1"
    port: int = 1883
    tls: bool = False
    #: CA bundle the broker's certificate is checked against (None: the system's)
    ca_file: str | None = None
    #: PEM client certificate (mutual TLS); `keyfile` its private key, unless `certfile` has it
    certfile: str | None = None
    keyfile: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    #: where `password` was read from (named when the broker refuses it)
    password_file: str | None = None
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
        """The TLS context of a connection (None without TLS); OSError or ssl.SSLError when a
        file cannot be read or loaded (the config checks that at load)."""
        if not self.tls:
            return None
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if self.certfile is not None:
            ctx.load_cert_chain(self.certfile, self.keyfile)
        return ctx

    def explain(self, exc: BaseException) -> str:
        """Why a connection to this broker failed, naming what to check: the credentials the
        broker refused, the CA file a certificate did not verify against, the client
        certificate, or that nothing answered at the address."""
        who = f"user {self.username!r}" if self.username else "no username"
        if self.password_file:
            who += f", password from {self.password_file}"
        elif self.password is None:
            who += ", no password"
        refusal = connect_refusal(exc)
        if refusal is not None:
            return f"broker {self.address} refused the connection: {refusal} ({who})"
        cause = _root(exc)
        if isinstance(cause, ssl.SSLCertVerificationError):
            against = f"CA file {self.ca_file}" if self.ca_file else "the system's CA certificates"
            detail = cause.verify_message or cause.reason or str(cause)
            return (
                f"TLS: the certificate of broker {self.host} did not verify against {against}:"
                f" {detail}"
            )
        if isinstance(cause, ssl.SSLError):
            mine = (
                f"client certificate {self.certfile}" if self.certfile else "no client certificate"
            )
            return f"TLS with broker {self.address} failed ({mine}): {cause.reason or cause}"
        if isinstance(cause, ConnectionRefusedError):
            return f"connection to broker {self.address} refused (is the broker listening there?)"
        if isinstance(cause, socket.gaierror):
            return f"broker host {self.host!r} not found: {cause.strerror or cause}"
        if isinstance(cause, TimeoutError) or "timed out" in str(exc):
            if self.tls and self.certfile is None:  # TLS 1.3: the refusal comes after the handshake
                return (
                    f"broker {self.address} did not answer in time (TLS without a client"
                    " certificate: a broker that requires one drops the connection)"
                )
            return f"broker {self.address} did not answer in time"
        if isinstance(cause, OSError):
            return f"broker {self.address} unreachable: {cause.strerror or cause}"
        text = str(exc)
        if self.tls and ("EOF" in text or "reset" in text.lower()):
            mine = (
                f"client certificate {self.certfile}" if self.certfile else "no client certificate"
            )
            return f"broker {self.address} closed the TLS connection ({mine}): {text}"
        return f"broker {self.address}: {text or repr(exc)}"

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


#: MQTT 3.1.1 CONNACK return codes and their MQTT 5 reason codes, as refusals
_REFUSALS = {
    1: "unsupported protocol version",
    2: "client id rejected",
    3: "server unavailable",
    4: "bad username or password",
    5: "not authorised",
    0x84: "unsupported protocol version",
    0x85: "client id rejected",
    0x86: "bad username or password",
    0x87: "not authorised",
    0x88: "server unavailable",
    0x8A: "client banned",
}


def connect_refusal(exc: BaseException) -> str | None:
    """The broker's reason for refusing a connection (its CONNACK code), None when the
    failure was something else (TLS, the network)."""
    from aiomqtt.exceptions import MqttConnectError

    if not isinstance(exc, MqttConnectError):
        return None
    rc = exc.rc
    code = getattr(rc, "value", rc)
    if not isinstance(code, int):
        return str(exc)
    return f"{_REFUSALS.get(code, str(rc))} (CONNACK code {code})"


def refused(exc: BaseException) -> bool:
    """The broker refused the credentials, or TLS failed: the same attempt will fail again."""
    return connect_refusal(exc) is not None or isinstance(_root(exc), ssl.SSLError)


def _root(exc: BaseException) -> BaseException:
    """The OS or TLS error under aiomqtt's MqttError (it raises from within its except)."""
    seen = exc
    for _ in range(5):
        if isinstance(seen, OSError):  # ssl.SSLError is one too
            return seen
        nxt = seen.__cause__ or seen.__context__
        if nxt is None:
            break
        seen = nxt
    return exc
