"""Webhooks without SSRF (issue 29, item 5): a write token must not make the gateway POST into the
network it sits in. The SSRF corpus (loopback, the gateway's own port, 169.254.169.254, `[::1]`,
inet_aton's spellings, an IPv4-mapped address, a name resolving to loopback) is refused by
default, with a 400 at registration or at connect time, counted; each is allowed only through
`[sinks] webhook_hosts`; a redirect is never followed; credentials in URLs never shown.

Against the real daemon (tests/daemon.py) for registration, delivery and what the API and the log
show; in process, with a resolver that answers what a test wants, for the check at connect time
(DNS that changes between registration and connection)."""

from __future__ import annotations

import functools
import ipaddress
import json
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
import pytest
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from gateway.config import Config
from gateway.daemon import Gateway
from gateway.drops import drop_counts
from gateway.sinks.address_policy import (
    AddressPolicy,
    Allowance,
    Refused,
    classify,
    parse_host,
    redact_url,
)
from gateway.sinks.spec import SinkSettings
from gateway.sinks.webhook import ConnectGuard, WebhookSink
from tests.daemon import Daemon
from tests.support import ROOT, async_eventually, eventually, free_port

SIM = "[simulation]\nstations = 4\nsegments = 2\nspeedup = 600\ntraffic_pair = false\n"
SQL = "SELECT station, speed FROM traffic"

#: URL host (and port) -> the webhook_hosts entry that allows it (`{own}`: the gateway's port)
CORPUS = {
    "127.0.0.1": "127.0.0.1",
    "127.0.0.1:{own}": "127.0.0.1:{own}",
    "169.254.169.254": "169.254.169.254",
    "[::1]": "::1",
    "0x7f000001": "127.0.0.1",
    "0": "0.0.0.0",
    "2130706433": "127.0.0.1",
    "0177.0.0.1": "127.0.0.0/8",
    "127.1": "127.0.0.1",
    "[::ffff:127.0.0.1]": "127.0.0.1",
    "localhost": "localhost",
    "10.1.2.3": "10.0.0.0/8",
    "100.64.0.1": "100.64.0.0/10",
    "[fe80::1]": "fe80::/10",
    "[fc00::1]": "fc00::/7",
    "[::]": "::",
    "224.0.0.1": "224.0.0.1",
}


# -- the policy, sans-IO -----------------------------------------------------------------------


@pytest.mark.parametrize("host", list(CORPUS))
def test_the_corpus_is_refused_by_default_and_allowed_only_by_its_entry(host: str) -> None:
    own = 8080
    url = f"http://{host.format(own=own)}/hook"
    with pytest.raises(Refused, match="refused by policy"):
        AddressPolicy.from_entries([], [own]).check_url(url)
    entry = CORPUS[host].format(own=own)
    AddressPolicy.from_entries([entry], [own]).check_url(url)
    with pytest.raises(Refused, match="refused by policy"):  # another entry does not allow it
        AddressPolicy.from_entries(["hooks.example.com"], [own]).check_url(url)


def test_hosts_read_as_the_resolver_reads_them() -> None:
    v4 = ipaddress.IPv4Address
    for spelling in ("0x7f000001", "2130706433", "0177.0.0.1", "127.1", "0x7f.1", "127.0.0.1."):
        assert parse_host(spelling) == v4("127.0.0.1"), spelling
    assert parse_host("0") == v4("0.0.0.0")
    assert parse_host("[::ffff:127.0.0.1]") == ipaddress.IPv6Address("::ffff:127.0.0.1")
    assert parse_host("Hooks.Example.COM.") == "hooks.example.com"
    assert (
        parse_host("\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54") == "localhost"
    )  # what yarl would turn it into
    for bad in ("%31%32%37.0.0.1", "1.2.3.4.5", "a..b", "-a.b", "a b"):
        with pytest.raises(Refused):
            parse_host(bad)
    for addr, kind in (
        ("::ffff:169.254.169.254", "IPv4-mapped link-local"),
        ("::127.0.0.1", "IPv4-compatible loopback"),
        ("2002:7f00:1::", "6to4 loopback"),
        ("64:ff9b::a00:1", "NAT64 private"),
        ("192.0.2.1", "private"),
        ("240.0.0.1", "reserved"),
    ):
        assert classify(ipaddress.ip_address(addr)) == kind, addr
    for public in ("93.184.216.34", "2606:4700::1111", "::ffff:93.184.216.34"):
        assert classify(ipaddress.ip_address(public)) is None


def test_urls_checked_strictly() -> None:
    policy = AddressPolicy.from_entries([])
    for bad in (
        "file:///etc/passwd",
        "gopher://hooks.example.com/",
        "http://hooks.example.com:0/",
        "http://hooks.example.com:99999/",
        "http://hooks.example.com\\@127.0.0.1/",
        "http://hooks.example.com /",
        "http:///x",
    ):
        with pytest.raises(Refused):
            policy.check_url(bad)
    t = policy.check_url("https://u:p@a@hooks.example.com:8443/x?y=1#frag")
    assert (t.host, t.port, t.url) == (
        "hooks.example.com",
        8443,
        "https://u:p@a@hooks.example.com:8443/x?y=1",
    )
    t = AddressPolicy.from_entries(["127.0.0.1"]).check_url("http://2130706433:81/h")
    assert t.url == "http://127.0.0.1:81/h"  # what is requested: the address it stands for
    for entry in ("10.0.0.0/33", "host:http", "[::1", "::1::2", ""):
        with pytest.raises(ValueError):
            Allowance.parse(entry)


def test_credentials_redacted() -> None:
    assert redact_url(
        "https://user:pw@h.example/x?a=1&token=t0&api_key=k&Signature=s#secret=z"
    ) == ("https://***@h.example/x?a=1&token=***&api_key=***&Signature=***#secret=***")
    assert redact_url("http://TOKEN@h/") == "http://***@h/"
    assert redact_url("not even a URL?password=pw") == "not even a URL?password=***"


# -- at connect time (a resolver that answers what the test says) --------------------------------


class Receiver:
    """A plain HTTP server on a loopback address in a thread: records each POST's body by path;
    `/redirect` answers 307 to `location`."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.posts: list[tuple[str, dict[str, Any]]] = []
        self.location = ""
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.startswith("/redirect"):
                    self.send_response(307)
                    self.send_header("Location", receiver.location)
                else:
                    receiver.posts.append((self.path, json.loads(body or b"{}")))
                    self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def rows(self, path_prefix: str = "") -> int:
        return sum(len(b.get("rows", [])) for p, b in self.posts if p.startswith(path_prefix))


class FakeDns(AbstractResolver):
    """Answers `answers[host]` (what a name resolves to *now*); other names as usual."""

    answers: ClassVar[dict[str, str]] = {}

    def __init__(self) -> None:
        self.real = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if host not in self.answers:
            return await self.real.resolve(host, port, family)
        addr = self.answers[host]
        fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
        return [
            {"hostname": host, "host": addr, "port": port, "family": fam, "proto": 0, "flags": 0}
        ]

    async def close(self) -> None:
        await self.real.close()


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    answers: ClassVar[dict[str, str]] = {}
    monkeypatch.setattr(FakeDns, "answers", answers)
    monkeypatch.setattr(WebhookSink, "make_resolver", FakeDns)
    yield answers


_until = functools.partial(async_eventually, timeout=30, interval=0.02)


def _config(tmp_path: Path) -> Config:
    cfg = Config()
    cfg.http.port = 0
    cfg.simulation = None
    cfg.state_dir = str(tmp_path / "state")
    return cfg


def _row(t: float) -> tuple:
    return (t, "st1", 50.0, 34.0, -118.0, "S1")


async def test_a_name_that_resolves_to_loopback_at_connect_time_is_refused_and_counted(
    tmp_path: Path, dns: dict[str, str]
) -> None:
    """DNS rebinding: public when registered, loopback when the sink connects. The receiver on
    loopback gets nothing; the batch is dropped `refused_by_policy`, counted; last_error says
    "refused by policy" and nothing about the port."""
    settings = SinkSettings(webhook_backoff_initial_s=0.01, webhook_backoff_max_s=0.05)
    with Receiver() as hook:
        dns["hooks.example.com"] = "93.184.216.34"
        async with Gateway(_config(tmp_path), sinks=settings) as gw:
            host, port = await gw.start_http()
            url = f"http://hooks.example.com:{hook.port}/hook"
            async with aiohttp.ClientSession(f"http://{host}:{port}") as http:
                sink = {"type": "webhook", "url": url, "batch_ms": 0}
                r = await http.post("/queries", json={"sql": SQL, "sinks": [sink]})
                assert r.status == 201, await r.text()
                qid = (await r.json())["id"]
                dns["hooks.example.com"] = "127.0.0.1"  # the name now points inside
                gw.fjord.push("traffic", _row(1.0))
                await _until(lambda: drop_counts(gw).get(("sink_webhook", "refused_by_policy")))
                state = (await (await http.get(f"/queries/{qid}")).json())["sinks"][0]
                assert state["last_error"].startswith("refused by policy: hooks.example.com ")
                assert (
                    "loopback" in state["last_error"] and str(hook.port) not in state["last_error"]
                )
                metrics = await (await http.get("/metrics")).text()
                assert 'fjords_webhook_refused_total{at="connect"} 1.0' in metrics
                assert 'reason="refused_by_policy",stage="sink_webhook"' in metrics
                # and a name resolving to loopback at registration is a 400 at once
                dns["inside.example.com"] = "127.0.0.2"
                sink = {"type": "webhook", "url": f"http://inside.example.com:{hook.port}/"}
                r = await http.post("/queries", json={"sql": SQL, "sinks": [sink]})
                assert r.status == 400
                assert (
                    "refused by policy: inside.example.com resolves to a loopback"
                    in (await r.json())["error"]
                )
        assert hook.posts == []


async def test_a_name_allowed_by_webhook_hosts_reaches_its_receiver(
    tmp_path: Path, dns: dict[str, str]
) -> None:
    dns["hooks.lan"] = "127.0.0.1"
    settings = SinkSettings(webhook_hosts=["hooks.lan"], webhook_backoff_initial_s=0.01)
    with Receiver() as hook:
        async with Gateway(_config(tmp_path), sinks=settings) as gw:
            url = f"http://hooks.lan:{hook.port}/hook"
            await gw.register(SQL, {"sinks": [{"type": "webhook", "url": url, "batch_ms": 0}]})
            for i in range(5):
                gw.fjord.push("traffic", _row(float(i)))
            await _until(lambda: hook.rows() >= 5)


async def test_the_socket_factory_refuses_the_address_it_would_connect_to() -> None:
    """The last gate: whatever the resolver or a cache said, no socket is made for a refused
    address, and the refusal is told apart from a failed connection."""
    policy = AddressPolicy.from_entries([])
    target = policy.check_url("http://hooks.example.com/")
    guard = ConnectGuard(policy, target, DefaultResolver())
    info = (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 80))
    with pytest.raises(OSError, match="refused by policy"):
        guard.socket(info)
    assert guard.refused is not None and "loopback" in guard.refused
    guard.refused = None
    info6 = (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::ffff:10.0.0.1", 80, 0, 0))
    with pytest.raises(OSError, match="refused by policy"):
        guard.socket(info6)
    with guard.socket((socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", 80))):
        pass  # a public address: a socket (not connected here)
    with pytest.raises(OSError, match="refused by policy"):
        await guard.resolver().resolve("localhost", 80, socket.AF_INET)
    await guard.inner.close()


async def test_a_name_with_refused_and_allowed_addresses_is_used_through_the_allowed_only() -> None:
    class TwoFaced(AbstractResolver):
        async def resolve(
            self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
        ) -> list[ResolveResult]:
            return [
                {"hostname": host, "host": a, "port": port, "family": socket.AF_INET, "proto": 0,
                 "flags": 0}
                for a in ("127.0.0.1", "93.184.216.34", "10.0.0.1")
            ]  # fmt: skip

        async def close(self) -> None:
            pass

    policy = AddressPolicy.from_entries([])
    guard = ConnectGuard(policy, policy.check_url("http://both.example.com/"), TwoFaced())
    found = await guard.resolver().resolve("both.example.com", 80)
    assert [r["host"] for r in found] == ["93.184.216.34"] and guard.refused is None
    policy = AddressPolicy.from_entries(["10.0.0.0/8"])
    guard = ConnectGuard(policy, policy.check_url("http://both.example.com/"), TwoFaced())
    assert [r["host"] for r in await guard.resolver().resolve("both.example.com", 80)] == [
        "10.0.0.1"
    ]


# -- the real daemon -------------------------------------------------------------------------------


def _call(
    gw: Daemon, method: str, path: str, body: object = None, token: str | None = None
) -> tuple[int, Any]:
    req = urllib.request.Request(
        f"{gw.url}{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json"},
    )
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_daemon_refuses_the_corpus_with_400_and_counts_it(tmp_path: Path) -> None:
    gw = Daemon(tmp_path, 'token = "w"\n' + SIM)
    with gw:
        for host in CORPUS:
            url = f"http://{host.format(own=gw.port)}/hook"
            status, body = _call(gw, "POST", "/queries", {"sql": SQL, "sinks": [
                {"type": "webhook", "url": url}]}, token="w")  # fmt: skip
            assert status == 400, (url, body)
            assert "refused by policy" in body["error"], body
        assert _call(gw, "GET", "/queries", token="w")[1]["queries"] == []
        assert gw_metric(gw, 'fjords_webhook_refused_total{at="registration"}') == len(CORPUS)
    assert "webhook refused at registration" in gw.tail(100_000)


def gw_metric(gw: Daemon, series: str) -> float:
    req = urllib.request.Request(f"{gw.url}/metrics", headers={"Authorization": "Bearer w"})
    for line in urllib.request.urlopen(req, timeout=10).read().decode().splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def test_allowed_by_webhook_hosts_delivered_redirect_not_followed_credentials_never_shown(
    tmp_path: Path,
) -> None:
    """With every corpus entry allowed: each registers; a real receiver on loopback gets its
    rows (the odd spellings too, requested as the address they stand for); a 307 from the
    receiver to 127.0.0.2 is not followed (the target gets nothing), dropped and counted; the
    password and token in the URLs appear in no answer (to the read-only token either) and no
    log line."""
    gw = Daemon(tmp_path)
    own = gw.port
    entries = sorted({v.format(own=own) for v in CORPUS.values()})
    with Receiver() as hook, Receiver("127.0.0.2") as target:
        hook.location = f"http://127.0.0.2:{target.port}/stolen"
        cfg = (
            f'token = "w"\nread_token = "r"\n[sinks]\nwebhook_hosts = {json.dumps(entries)}\n'
            "webhook_backoff_initial_s = 0.05\n" + SIM
        )
        gw.config.write_text(f"[http]\nport = {own}\n{cfg}")
        with gw:
            for host in CORPUS:  # each allowed (a dry run: checked, nothing connects)
                url = f"http://{host.format(own=own)}/hook"
                status, body = _call(gw, "POST", "/queries", {"sql": SQL, "dry_run": True,
                    "sinks": [{"type": "webhook", "url": url}]}, token="w")  # fmt: skip
                assert status == 200, (url, body)
            secret = f"http://alice:pw-hunter2@127.0.0.1:{hook.port}"
            sinks = {
                "plain": f"{secret}/hook/plain?token=tk-hunter3&a=1",
                "hex": f"http://0x7f000001:{hook.port}/hook/hex",
                "decimal": f"http://2130706433:{hook.port}/hook/decimal",
                "name": f"http://localhost:{hook.port}/hook/name",
                "redirect": f"{secret}/redirect?token=tk-hunter3",
            }
            ids = {}
            for name, url in sinks.items():
                sink = {"type": "webhook", "url": url, "batch_ms": 0, "batch_rows": 50}
                status, body = _call(gw, "POST", "/queries", {"sql": SQL, "sinks": [sink]}, "w")
                assert status == 201, body
                ids[name] = body["id"]
                assert "hunter" not in json.dumps(body)
            for name in ("plain", "hex", "decimal", "name"):
                eventually(lambda n=name: hook.rows(f"/hook/{n}"), lambda n: n >= 20,
                           message=f"the {name} webhook delivers rows", timeout=60)  # fmt: skip
            redirect = eventually(
                lambda: _call(gw, "GET", f"/queries/{ids['redirect']}", token="r")[1],
                lambda q: q["sinks"][0]["dropped_by_reason"].get("redirect", 0) > 0,
                message="the 307 is dropped as a redirect",
                timeout=60,
            )
            assert redirect["sinks"][0]["last_error"] == "HTTP 307: redirect not followed"
            assert gw_metric(gw, 'fjords_dropped_total{reason="redirect",stage="sink_webhook"}') > 0
            assert target.posts == []
            for token in ("r", "w"):
                shown = [
                    _call(gw, "GET", "/queries", token=token)[1],
                    *(_call(gw, "GET", f"/queries/{q}", token=token)[1] for q in ids.values()),
                    _call(gw, "GET", "/status", token=token)[1],
                ]
                text = json.dumps(shown)
                assert "hunter" not in text and "alice" not in text
                assert f"http://***@127.0.0.1:{hook.port}/hook/plain?token=***&a=1" in text
        assert target.posts == []
    log = gw.tail(1_000_000)
    assert "redirect not followed" in log and "hunter" not in log


def test_a_refused_webhook_in_the_config_exits_2_naming_the_key(tmp_path: Path) -> None:
    cases = {
        '[[queries]]\nsql = "SELECT speed FROM traffic"\n'
        'sinks = [{type = "webhook", url = "http://u:pw-hunter2@169.254.169.254/latest"}]\n': (
            "[[queries]] #1 sinks[0].url 'http://***@169.254.169.254/latest': refused by policy"
        ),
        '[sinks]\nwebhook_hosts = ["10.0.0.0/33"]\n': "[sinks] webhook_hosts: '10.0.0.0/33'",
    }
    for toml, message in cases.items():
        cfg = tmp_path / "g.toml"
        cfg.write_text(f"[http]\nport = {free_port()}\n{toml}")
        proc = subprocess.run(
            [sys.executable, "-m", "gateway.cli", "run", "--no-state", "--config", str(cfg)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr and "hunter" not in proc.stderr
        assert "Traceback" not in proc.stderr


async def test_the_gateway_port_is_its_own_once_bound(tmp_path: Path) -> None:
    """Port 0 in the config: the bound port is the gateway's own from then on."""
    settings = SinkSettings(webhook_hosts=["127.0.0.1"])
    async with Gateway(_config(tmp_path), sinks=settings) as g:
        _, port = await g.start_http()
        assert g.sinks.policy.check_url("http://127.0.0.1:9/").port == 9
        with pytest.raises(Refused, match="own HTTP port"):
            g.sinks.policy.check_url(f"http://127.0.0.1:{port}/")
