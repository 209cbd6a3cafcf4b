"""The shipped broker setup (deploy/mosquitto/): a real Mosquitto with exactly its ACL file, TLS
and one password per client; the real daemon (mutual TLS, its own user) and a simulated fleet
(each mote its own user) deliver results to a dashboard; a client holding a mote's or a
dashboard's credentials cannot speak for another mote, command it, publish a result or the
gateway's status: the broker drops each publish and the gateway never sees it.

And the failures an operator meets setting it up: a wrong password, an untrusted CA, a missing
certificate file, each said in words that name what to fix.
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import getpass
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiomqtt
import pytest

from sensors.protocol import Hello, Samples, encode_message
from sensors.transports.broker import BrokerSettings
from tests.daemon import Daemon
from tests.support import (
    ROOT,
    Broker,
    async_eventually,
    eventually,
    fleet_command,
    require_binary,
    shared_file,
)

pytestmark = [pytest.mark.needs_mosquitto, pytest.mark.timeout(180)]

DEPLOY = ROOT / "deploy" / "mosquitto"
MOTES = 4
QUERY = "SELECT segment, COUNT(*) AS n FROM traffic [RANGE 1 HOURS] GROUP BY segment"


@dataclass
class SecuredBroker:
    """The shipped config rendered for this test: its port, its files, one password a user."""

    broker: Broker
    dir: Path
    ca: Path  # the CA that signed the broker's and the gateway's certificates
    other_ca: Path  # a CA nobody here uses
    gateway_cert: Path
    gateway_key: Path
    passwords: dict[str, str]

    @property
    def url(self) -> str:
        return f"mqtts://{self.broker.host}:{self.broker.port}"

    def settings(self, user: str | None, password: str | None = None) -> BrokerSettings:
        pw = self.passwords.get(user or "") if password is None else password
        return BrokerSettings(
            self.broker.host, self.broker.port, tls=True, ca_file=str(self.ca),
            username=user, password=pw, reconnect_initial=0.05, reconnect_max=0.5,
        )  # fmt: skip

    def denied(self) -> list[str]:
        return [ln for ln in self.broker.log.read_text().splitlines() if "Denied PUBLISH" in ln]


def mote_ids() -> list[str]:
    with shared_file("data/metr-la/stations.csv").open() as f:
        return [row["station"] for row in csv.DictReader(f)][:MOTES]


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[SecuredBroker]:
    yield from secured_broker(tmp_path, certificates_as_identity=False)


@pytest.fixture
def by_certificate(tmp_path: Path) -> Iterator[SecuredBroker]:
    """The shipped config's other identity: each client's certificate (its CN the username)."""
    yield from secured_broker(tmp_path, certificates_as_identity=True)


def secured_broker(tmp_path: Path, *, certificates_as_identity: bool) -> Iterator[SecuredBroker]:
    trustme = pytest.importorskip("trustme", reason="trustme (pip install -e '.[dev]')")
    binary = require_binary("mosquitto", "mosquitto")
    hasher = require_binary("mosquitto_passwd", "mosquitto")
    d = tmp_path / "mosquitto"
    (d / "certs").mkdir(parents=True)
    ca, other = trustme.CA(), trustme.CA()
    ca.cert_pem.write_to_path(str(d / "certs" / "ca.pem"))
    other.cert_pem.write_to_path(str(d / "other-ca.pem"))
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.cert_chain_pems[0].write_to_path(str(d / "certs" / "broker.pem"))
    server.private_key_pem.write_to_path(str(d / "certs" / "broker.key"))
    for user in ("gateway", *(mote_ids() if certificates_as_identity else ())):
        cert = ca.issue_cert(f"{user}.fjords.example", common_name=user)
        cert.cert_chain_pems[0].write_to_path(str(d / f"{user}.pem"))
        cert.private_key_pem.write_to_path(str(d / f"{user}.key"))
    passwords = {"gateway": "gw-secret", "dashboard": "dash-secret"}
    passwords |= {sid: f"mote-{sid}-secret" for sid in mote_ids()}
    pwfile = d / "passwd"
    pwfile.write_text("".join(f"{u}:{p}\n" for u, p in passwords.items()))
    subprocess.run([hasher, "-U", str(pwfile)], check=True, capture_output=True)
    assert "gw-secret" not in pwfile.read_text()
    (d / "fjords.acl").write_text((DEPLOY / "fjords.acl").read_text())  # exactly as shipped

    b = Broker(binary, d)
    shipped = (DEPLOY / "mosquitto.conf").read_text()
    assert "listener 8883\n" in shipped and "acl_file /etc/mosquitto/fjords/fjords.acl" in shipped
    if certificates_as_identity:  # as its comment says: both lines, and no password file
        shipped = shipped.replace("require_certificate false\n", "").replace(
            "\n#require", "\nrequire"
        )
        shipped = shipped.replace("#use_identity", "use_identity")
        shipped = shipped.replace("password_file /etc/mosquitto/fjords/passwd\n", "")
        assert "use_identity_as_username true" in shipped and "password_file /" not in shipped
    b.config.write_text(
        shipped.replace("/etc/mosquitto/fjords/", f"{d}/").replace(
            "listener 8883\n", f"listener {b.port} {b.host}\n"
        )
        # this test's own: run as us, log the refusals, keep nothing on disk
        + f"user {getpass.getuser()}\nlog_dest file {b.log}\nlog_type all\npersistence false\n"
    )
    b.start()
    try:
        yield SecuredBroker(
            b, d, d / "certs" / "ca.pem", d / "other-ca.pem", d / "gateway.pem",
            d / "gateway.key", passwords,
        )  # fmt: skip
    finally:
        b.stop()


def gateway_config(s: SecuredBroker, tmp: Path, password: str = "gw-secret") -> str:
    (tmp / "gateway.password").write_text(password + "\n")
    return (
        f'[mqtt]\nurl = "{s.url}"\nusername = "gateway"\npassword_file = "gateway.password"\n'
        f'ca_file = "{s.ca}"\ncertfile = "{s.gateway_cert}"\nkeyfile = "{s.gateway_key}"\n'
        f'[state]\ndir = "{tmp / "state"}"\n'
        f'[[queries]]\nid = "q1"\nsql = "{QUERY}"\npublish = "mqtt"\n'
    )


def motes_password_file(s: SecuredBroker, tmp: Path) -> Path:
    path = tmp / "motes.passwd"
    path.write_text("# sensor id, password\n" + "".join(
        f"{sid} {s.passwords[sid]}\n" for sid in mote_ids()
    ))  # fmt: skip
    return path


def run_fleet(s: SecuredBroker, *flags: str) -> subprocess.CompletedProcess[str]:
    cmd = fleet_command(
        s.broker,
        shared_file("data/metr-la/readings.csv"),
        shared_file("data/metr-la/stations.csv"),
        "--limit", str(MOTES), *flags,
    )  # fmt: skip
    cmd[cmd.index("--broker") + 1] = s.url
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=150)


class Watcher:
    """A client with the given rights that keeps everything it receives."""

    def __init__(self, settings: BrokerSettings, *topics: str) -> None:
        self.settings, self.topics = settings, topics
        self.got: list[aiomqtt.Message] = []
        self._task: asyncio.Task[None] | None = None
        self.ready = asyncio.Event()

    async def _run(self) -> None:
        async with self.settings.client(f"watch-{id(self)}") as c:
            for t in self.topics:
                await c.subscribe(t, qos=1)
            self.ready.set()
            async for m in c.messages:
                self.got.append(m)

    async def __aenter__(self) -> Watcher:
        self._task = asyncio.create_task(self._run())
        await asyncio.wait_for(self.ready.wait(), 20)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    def payloads(self, topic_part: str = "") -> list[bytes]:
        return [bytes(m.payload) for m in self.got if topic_part in m.topic.value]  # type: ignore[arg-type]


async def test_fleet_and_gateway_under_the_shipped_acl_and_a_spoofer_refused(
    secured: SecuredBroker, tmp_path: Path
) -> None:
    s = secured
    a, b = mote_ids()[:2]
    with Daemon(tmp_path, gateway_config(s, tmp_path)) as gw:
        await async_eventually(
            lambda: gw.get("/healthz"), lambda h: h["status"] == "ok",
            message="the daemon connected with mutual TLS and its password", timeout=30,
        )  # fmt: skip
        dashboard = Watcher(s.settings("dashboard"), "fjords/results/#", "fjords/gateway/status")
        async with dashboard:
            fleet = await asyncio.to_thread(
                run_fleet, s, "--username", "{sensor_id}",
                "--password-file", str(motes_password_file(s, tmp_path)), "--ca-file", str(s.ca),
            )  # fmt: skip
            assert fleet.returncode == 0, fleet.stderr
            assert f"{MOTES} motes sent" in fleet.stderr
            await async_eventually(
                lambda: dashboard.payloads("fjords/results/q1"),
                message="result rows reach the dashboard", timeout=60,
            )  # fmt: skip
            assert dashboard.payloads("fjords/gateway/status")[-1] == b"online"
            sensors = {x["id"]: x for x in gw.get("/sensors")["sensors"]}
            assert {a, b} <= set(sensors), sensors.keys()
            segment_b = sensors[b]["attributes"]["segment"]

            # Nothing may change what the gateway counts from here on.
            before = {
                m: gw.metric(m)
                for m in ("fjords_transport_seq_gaps_total", "fjords_transport_dropped_total")
            }
            forged_hello = encode_message(
                Hello(
                    sensor_id=b,
                    seq=9_999_999,
                    schema=(("speed", "float"),),
                    attributes={"segment": "HACKED"},
                )
            )
            forged_data = encode_message(
                Samples(sensor_id=b, seq=9_999_998, times=(0.0,), rows=((1.0,),))
            )
            gateway_rights = Watcher(
                s.settings("gateway"), "fjords/sensors/+/hello", "fjords/sensors/+/data",
                "fjords/sensors/+/status", "fjords/results/#", "fjords/gateway/#",
            )  # fmt: skip
            b_rights = Watcher(s.settings(b), f"fjords/sensors/{b}/control")
            async with gateway_rights, b_rights:
                for spoofer in (a, "dashboard"):
                    async with s.settings(spoofer).client(f"spoof-{spoofer}") as c:
                        await c.publish(f"fjords/sensors/{b}/data", forged_data, qos=1)
                        await c.publish(
                            f"fjords/sensors/{b}/hello", forged_hello, qos=1, retain=True
                        )
                        await c.publish(f"fjords/sensors/{b}/control", b"FORGED", qos=1)
                        await c.publish("fjords/results/q1", b'{"FORGED": 1}', qos=1)
                        await c.publish("fjords/gateway/status", b"offline", qos=1, retain=True)
                # The broker refused each of the ten publishes (and says so in its log)...
                denied = await async_eventually(
                    s.denied, lambda d: len(d) >= 10, message="ten publishes denied", timeout=20
                )
                assert {f"spoof-{a}", "spoof-dashboard"} == {ln.split()[4] for ln in denied}
                # ...so a sentinel sent after them arrives with nothing forged before it.
                async with s.settings("gateway").client("sentinel") as c:
                    await c.publish("fjords/gateway/sentinel", b"end", qos=1)
                await async_eventually(lambda: gateway_rights.payloads("fjords/gateway/sentinel"))
            seen = gateway_rights.payloads() + b_rights.payloads() + dashboard.payloads()
            assert not [p for p in seen if b"FORGED" in p or p in (forged_data, forged_hello)]
            assert b"offline" not in dashboard.payloads("fjords/gateway/status")
            # Retained state is the gateway's and the mote's own.
            async with (
                Watcher(s.settings("dashboard"), "fjords/gateway/status") as fresh,
                Watcher(s.settings("gateway"), f"fjords/sensors/{b}/hello") as hello,
            ):
                await async_eventually(lambda: fresh.payloads() and hello.payloads())
                assert fresh.payloads() == [b"online"]
                assert b"HACKED" not in hello.payloads()[0]
            after = {m: gw.metric(m) for m in before}
            assert after == before
            assert (
                gw.get("/sensors")["sensors"]
                and next(x for x in gw.get("/sensors")["sensors"] if x["id"] == b)["attributes"][
                    "segment"
                ]
                == segment_b
            )
            # A mote reads nothing but its own controls: Mosquitto grants any subscription
            # and checks each message against the ACL as it would deliver it.
            eavesdropper = Watcher(
                s.settings(a), "fjords/results/#", f"fjords/sensors/{b}/control", "fjords/#"
            )
            async with eavesdropper:
                async with s.settings("gateway").client("gateway-probe") as c:
                    await c.publish("fjords/results/q1", b'{"secret": 1}', qos=1)
                    await c.publish(f"fjords/sensors/{b}/control", b"for b", qos=1)
                    await c.publish(f"fjords/sensors/{a}/control", b"for a", qos=1)
                await async_eventually(eavesdropper.payloads, message="a's own control")
                assert eavesdropper.payloads() == [b"for a"]


async def test_no_credentials_no_broker(secured: SecuredBroker) -> None:
    anonymous = secured.settings(None)
    with pytest.raises(aiomqtt.MqttError) as e:
        async with anonymous.client("anon"):
            pass
    assert "refused the connection: not authorised" in anonymous.explain(e.value)
    assert "no username" in anonymous.explain(e.value)


async def test_an_untrusted_ca_is_named(secured: SecuredBroker) -> None:
    s = secured
    wrong = BrokerSettings(s.broker.host, s.broker.port, tls=True, ca_file=str(s.other_ca))
    with pytest.raises(aiomqtt.MqttError) as e:
        async with wrong.client("x"):
            pass
    text = wrong.explain(e.value)
    assert text.startswith("TLS: the certificate of broker 127.0.0.1 did not verify against")
    assert str(s.other_ca) in text


def test_the_daemon_says_its_password_was_refused(secured: SecuredBroker, tmp_path: Path) -> None:
    with Daemon(tmp_path, gateway_config(secured, tmp_path, password="wrong")) as gw:
        reasons = eventually(
            lambda: gw.get("/healthz")["reasons"],
            lambda r: any("refused the connection" in x for x in r),
            timeout=30,
        )
    text = next(x for x in reasons if "refused the connection" in x)
    assert "not authorised" in text and "user 'gateway'" in text
    assert "gateway.password" in text  # the file the password came from
    assert "MqttConnectError()" not in " ".join(reasons)
    log = gw.tail(20_000)
    assert "not authorised" in log


def test_simulate_motes_names_a_refused_password_and_an_untrusted_ca(
    secured: SecuredBroker, tmp_path: Path
) -> None:
    s = secured
    one = tmp_path / "one.passwd"
    one.write_text("not-the-password\n")  # one password for every mote: the wrong one
    bad = run_fleet(
        s, "--username", "{sensor_id}", "--password-file", str(one), "--ca-file", str(s.ca)
    )
    assert bad.returncode == 1, bad.stderr
    assert "refused the connection: not authorised" in bad.stderr and str(one) in bad.stderr
    untrusted = run_fleet(
        s, "--username", "{sensor_id}", "--password-file", str(motes_password_file(s, tmp_path)),
        "--ca-file", str(s.other_ca),
    )  # fmt: skip
    assert untrusted.returncode == 1, untrusted.stderr
    assert "did not verify against CA file" in untrusted.stderr
    assert str(s.other_ca) in untrusted.stderr


def test_missing_files_exit_2_naming_the_key_and_the_path(tmp_path: Path) -> None:
    gone = tmp_path / "nope.pem"
    cfg = tmp_path / "gateway.toml"
    cfg.write_text(f'[mqtt]\nurl = "mqtts://127.0.0.1:1"\ncertfile = "{gone}"\n')
    run = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "run", "--config", str(cfg)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert "[mqtt] certfile" in run.stderr and str(gone) in run.stderr
    assert "Traceback" not in run.stderr
    stations = tmp_path / "stations.csv"
    stations.write_text("station,latitude,longitude,segment\ns1,0,0,S1\n")
    trace = tmp_path / "readings.csv"
    trace.write_text("time,station,speed\n0,s1,50\n")
    for flag in ("--certfile", "--ca-file", "--password-file"):
        extra = [flag, str(gone)] + (["--certfile", str(gone)] if flag == "--keyfile" else [])
        fleet = subprocess.run(
            [sys.executable, "-m", "gateway.cli", "simulate-motes", "--broker",
             "mqtts://127.0.0.1:1", "--trace", str(trace), "--stations", str(stations), *extra],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert fleet.returncode == 2, (flag, fleet.stderr)
        assert flag in fleet.stderr and str(gone) in fleet.stderr, fleet.stderr


async def test_certificates_as_identity(by_certificate: SecuredBroker, tmp_path: Path) -> None:
    """Each mote presents its own certificate: it connects as its sensor id and the ACL holds
    it to its own topics; without a certificate there is no connection, said as such."""
    s = by_certificate
    a, b = mote_ids()[:2]
    d = s.dir
    gateway = dataclasses.replace(
        s.settings(None), certfile=str(s.gateway_cert), keyfile=str(s.gateway_key)
    )
    async with Watcher(gateway, "fjords/sensors/+/hello", "fjords/gateway/sentinel") as hellos:
        fleet = await asyncio.to_thread(
            run_fleet, s, "--ca-file", str(s.ca),
            "--certfile", f"{d}/{{sensor_id}}.pem", "--keyfile", f"{d}/{{sensor_id}}.key",
        )  # fmt: skip
        assert fleet.returncode == 0, fleet.stderr
        topics = await async_eventually(
            lambda: {m.topic.value for m in hellos.got}, lambda t: len(t) >= MOTES
        )
        assert topics == {f"fjords/sensors/{sid}/hello" for sid in mote_ids()}
        as_a = dataclasses.replace(
            s.settings(None), certfile=f"{d}/{a}.pem", keyfile=f"{d}/{a}.key"
        )
        async with as_a.client("spoof-by-cert") as c:
            await c.publish(f"fjords/sensors/{b}/hello", b"FORGED", qos=1, retain=True)
        await async_eventually(s.denied, message="the forged hello denied", timeout=20)
        async with gateway.client("sentinel") as c:
            await c.publish("fjords/gateway/sentinel", b"end", qos=1)
        await async_eventually(lambda: hellos.payloads("fjords/gateway/sentinel"))
    assert b"FORGED" not in hellos.payloads()
    no_cert = s.settings(None)
    with pytest.raises(aiomqtt.MqttError) as e:
        async with no_cert.client("no-cert", timeout=3):
            pass
    assert "without a client certificate" in no_cert.explain(e.value), no_cert.explain(e.value)
