"""Where a webhook may POST: the gateway's address policy against SSRF (sans-IO: no sockets here).

A write token must not turn the gateway into a proxy into the network it sits in, so by default
a webhook may reach public unicast addresses only: loopback, link-local (169.254/16, fe80::/10),
private (RFC 1918, fc00::/7), shared (100.64/10), unspecified, multicast, reserved and
documentation ranges are refused, and so are IPv6 forms that embed such an IPv4 address
(`::ffff:127.0.0.1`, `::127.0.0.1`, 6to4, NAT64). A host is read as the OS resolver reads it:
`inet_aton`'s spellings (`0x7f000001`, `2130706433`, `0177.0.0.1`, `127.1`, `0`) are the
addresses they stand for, `localhost` and `*.localhost` are loopback (RFC 6761), and anything
else must be a plain host name. The gateway's own HTTP port is refused on every address.

`[sinks] webhook_hosts` lists what is allowed instead, each entry a host name or shell pattern
(`hooks.example.com`, `*.lan`, `10.0.0.*`), an address or a network (`10.0.0.0/8`, `fd00::/8`),
optionally with a port (`hooks.lan:8443`, `127.0.0.1:8080`, `[::1]:9000`). When the list is
not empty a URL's host must match an entry: by name (then it may resolve to any address), or
through its addresses inside a listed network (only those are connected to). An entry without a port allows every
port but the gateway's own, which only an entry naming it allows.

The policy is asked twice: when a webhook is registered (the URL, its literal address, and the
addresses its name resolves to then), and for every address a connection is about to be made to
(`gateway.sinks.webhook`), since DNS can answer differently later.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import yarl

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")
_NUMERIC = re.compile(r"[0-9a-fx.]+")  # what inet_aton could read as an IPv4 address
_SENSITIVE = r"[^=&#;]*(?:token|key|pass|pwd|secret|sig|auth|credential|session)[^=&#;]*"


class Refused(ValueError):
    """A URL or an address the policy refuses; the message says why, never more."""


def redact_url(url: str) -> str:
    """`url` fit to show: userinfo and the values of query (and fragment) parameters named like
    credentials (`token=`, `api_key=`, `password=`, `secret=`, `sig=`, ...) become `***`. Works
    on text that does not parse too: nothing here may fail."""
    out = re.sub(r"^([a-zA-Z][a-zA-Z0-9+.-]*:)?//[^/?#]*@", r"\1//***@", url)
    return re.sub(rf"([?&;#]{_SENSITIVE}=)[^&#;]*", r"\1***", out, flags=re.IGNORECASE)


def parse_address(text: str) -> Address | None:
    """`text` as the OS resolver reads a numeric host: an IPv6 literal, or any IPv4 spelling
    `inet_aton` accepts (hex, octal, decimal, fewer than four parts); None for a name."""
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    if _NUMERIC.fullmatch(text) and text[0].isdigit():
        try:
            return ipaddress.IPv4Address(socket.inet_aton(text))
        except OSError:
            return None
    return None


def parse_host(text: str) -> Address | str:
    """A URL's host, strictly: an address (see `parse_address`) or a lowercase ASCII host name
    (IDNA-encoded when it is not ASCII); Refused for anything else."""
    host = text.strip("[]").lower()
    if host.endswith(".") and not host.endswith(".."):
        host = host[:-1]
    if not host:
        raise Refused("the URL has no host")
    if "%" in host and ":" in host:  # an IPv6 zone (fe80::1%eth0): link-local anyway
        host = host.split("%", 1)[0]
    addr = parse_address(host)
    if addr is not None:
        return addr
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise Refused(f"{text[:100]!r} is not a valid host name") from None
        addr = parse_address(host)
        if addr is not None:
            return addr
    labels = host.split(".")
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise Refused(f"{text[:100]!r} is not a valid host name")
    if all(label.isdigit() or label.startswith("0x") for label in labels):
        raise Refused(f"{text[:100]!r} is not a valid IPv4 address")
    return host


def _embedded(addr: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    """The IPv4 address an IPv6 one stands for or leads to, and how (mapped, compatible, 6to4,
    NAT64)."""
    if addr.ipv4_mapped is not None:
        return "IPv4-mapped", addr.ipv4_mapped
    if addr.sixtofour is not None:
        return "6to4", addr.sixtofour
    value = int(addr)
    if value >> 32 == 0 and value > 1:  # ::a.b.c.d, the deprecated IPv4-compatible form
        return "IPv4-compatible", ipaddress.IPv4Address(value & 0xFFFFFFFF)
    if value >> 32 == 0x64FF9B << 64:  # 64:ff9b::/96, NAT64
        return "NAT64", ipaddress.IPv4Address(value & 0xFFFFFFFF)
    return None


def _embedded_ipv4(addr: Address) -> ipaddress.IPv4Address | None:
    inner = _embedded(addr) if isinstance(addr, ipaddress.IPv6Address) else None
    return inner[1] if inner is not None else None


_SHARED = ipaddress.ip_network("100.64.0.0/10")


def classify(addr: Address) -> str | None:
    """Why `addr` is not a public unicast address ("loopback", "private", ...); None if it is."""
    if isinstance(addr, ipaddress.IPv6Address):
        inner = _embedded(addr)
        if inner is not None:
            kind = classify(inner[1])
            return f"{inner[0]} {kind}" if kind else None
        if addr.teredo is not None:
            return "reserved (Teredo)"
    if addr.is_unspecified:
        return "unspecified"
    if addr.is_loopback:
        return "loopback"
    if addr.is_link_local:
        return "link-local"
    if addr.is_multicast:
        return "multicast"
    if isinstance(addr, ipaddress.IPv4Address) and addr in _SHARED:
        return "shared (CGNAT)"
    if addr.is_reserved:
        return "reserved"
    if addr.is_private:
        return "private"
    if not addr.is_global:
        return "non-public"
    return None


def _article(kind: str) -> str:
    return "an" if kind[0].lower() in "aeiou" else "a"


@dataclass(frozen=True)
class Allowance:
    """One `webhook_hosts` entry: a name pattern or a network, and maybe a port."""

    entry: str
    pattern: str | None = None
    network: Network | None = None
    port: int | None = None

    @classmethod
    def parse(cls, entry: str) -> Allowance:
        """ValueError (saying what is wrong) for an entry that is neither."""
        text = entry.strip().lower()
        port: int | None = None
        if text.startswith("["):
            inner, sep, rest = text[1:].partition("]")
            if not sep or (rest and not rest.startswith(":")):
                raise ValueError(f"{entry!r}: expected [address]:port")
            text, port_text = inner, rest[1:] if rest else None
        elif text.count(":") == 1:
            text, port_text = text.split(":")
        else:
            port_text = None
        if port_text is not None:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                raise ValueError(f"{entry!r}: the port must be 1-65535")
            port = int(port_text)
        if not text:
            raise ValueError(f"{entry!r}: no host")
        try:
            return cls(entry, network=ipaddress.ip_network(text, strict=False), port=port)
        except ValueError:
            if "/" in text or ":" in text:
                raise ValueError(f"{entry!r}: not an address or network") from None
        if not re.fullmatch(r"[a-z0-9_.*?\[\]!-]+", text):
            raise ValueError(f"{entry!r}: not a host name, pattern, address or network")
        return cls(entry, pattern=text.rstrip("."), port=port)

    def port_ok(self, port: int, own_ports: set[int]) -> bool:
        return port == self.port if self.port is not None else port not in own_ports

    def names(self, host: str) -> bool:
        """Whether this entry allows the host by its name (or its literal's canonical text)."""
        if self.pattern is not None:
            return fnmatch.fnmatchcase(host, self.pattern)
        return False

    def holds(self, addr: Address) -> bool:
        if self.network is None:
            return False
        if addr.version == self.network.version and addr in self.network:
            return True
        inner = _embedded_ipv4(addr)
        return inner is not None and inner.version == self.network.version and inner in self.network


def _yarl_host(url: str) -> Address | str | None:
    """The host aiohttp will connect to for `url` (yarl parses it), as `parse_host` reads it."""
    try:
        host = yarl.URL(url).raw_host
        return parse_host(host) if host else None
    except (ValueError, Refused):
        return None


def parse_allowances(entries: Iterable[str]) -> list[Allowance]:
    return [Allowance.parse(e) for e in entries]


@dataclass(frozen=True)
class Target:
    """A checked URL: `url` is what to request (the host as the resolver reads it, no
    fragment), `host` its canonical host, `address` set when the host is a literal."""

    url: str
    host: str
    port: int
    address: Address | None
    named: bool  # a webhook_hosts entry allows it by name: any address it resolves to
    shown: str = ""  # the host as the URL spells it, for messages


@dataclass
class AddressPolicy:
    """`webhook_hosts` and the gateway's own HTTP ports (updated once the port is bound)."""

    allow: list[Allowance] = field(default_factory=list)
    own_ports: set[int] = field(default_factory=set)

    @classmethod
    def from_entries(cls, entries: Iterable[str], own_ports: Iterable[int] = ()) -> AddressPolicy:
        return cls(parse_allowances(entries), {p for p in own_ports if p})

    def check_url(self, url: str) -> Target:
        """What can be said before resolving a name; Refused with the reason."""
        if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url) or "\\" in url:
            raise Refused("the URL has spaces, control characters or backslashes")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise Refused("an http:// or https:// URL is required")
        try:
            given = parts.port
        except ValueError:
            given = 0
        if given == 0:
            raise Refused("the URL's port is not a number of 1-65535")
        port = given or (443 if parts.scheme == "https" else 80)
        raw = parts.netloc.rpartition("@")[2]
        raw = (
            raw[: raw.rindex("]") + 1] if raw.startswith("[") and "]" in raw else raw.split(":")[0]
        )
        parsed = parse_host(raw)
        host = parsed if isinstance(parsed, str) else str(parsed)
        address = None if isinstance(parsed, str) else parsed
        netloc = f"[{host}]" if ":" in host else host
        if given is not None:
            netloc = f"{netloc}:{port}"
        userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
        if userinfo:
            netloc = f"{userinfo}@{netloc}"
        request_url = urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
        if _yarl_host(request_url) != parsed:
            raise Refused("the URL's host is ambiguous")
        named = any(a.names(host) and a.port_ok(port, self.own_ports) for a in self.allow)
        target = Target(request_url, host, port, address, named, raw.strip("[]").lower())
        if named:
            return target
        if port in self.own_ports and not any(a.port == port for a in self.allow):
            raise Refused(
                f"refused by policy: port {port} is the gateway's own HTTP port "
                "(a [sinks] webhook_hosts entry naming the port can allow it)"
            )
        if address is not None:
            self.check_address(target, address)
        elif host == "localhost" or host.endswith(".localhost"):
            self.check_address(target, ipaddress.IPv4Address("127.0.0.1"))
        elif self.allow and not any(a.network is not None for a in self.allow):
            raise self._unlisted(host)
        return target

    def check_address(self, target: Target, addr: Address) -> None:
        """Whether a connection to `addr` (one address `target`'s host resolved to) may be
        made; Refused otherwise."""
        if target.named:
            return
        if target.port in self.own_ports and not any(a.port == target.port for a in self.allow):
            raise Refused(f"refused by policy: port {target.port} is the gateway's own HTTP port")
        listed = [a for a in self.allow if a.port_ok(target.port, self.own_ports)]
        if any(a.holds(addr) for a in listed):
            return
        if self.allow:
            raise self._unlisted(target.host)
        kind = classify(addr)
        if kind is not None:
            raise Refused(self._why(target.shown or target.host, kind, str(addr)))

    def allowed(self, target: Target, addresses: Iterable[Address]) -> list[Address]:
        """Those of the addresses a name resolved to that may be connected to; Refused (the
        first refusal) when none may. A name with both is used through its allowed ones only."""
        ok: list[Address] = []
        first: Refused | None = None
        for addr in addresses:
            try:
                self.check_address(target, addr)
            except Refused as e:
                first = first or e
            else:
                ok.append(addr)
        if not ok and first is not None:
            raise first
        return ok

    def _why(self, host: str, kind: str, addr: str) -> str:
        shown = "" if host == addr else f" ({addr})"
        return (
            f"refused by policy: {host} resolves to {_article(kind)} {kind} address{shown}; "
            "[sinks] webhook_hosts can allow it"
        )

    def _unlisted(self, host: str) -> Refused:
        listed = ", ".join(a.entry for a in self.allow)
        return Refused(
            f"refused by policy: host {host!r} is not in [sinks] webhook_hosts ({listed})"
        )
