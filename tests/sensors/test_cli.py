"""`fjords-gateway simulate-motes` end to end against the fixture's broker."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys

import pytest

from sensors.cli import mote_identities
from sensors.protocol import Hello
from sensors.transports.broker import BrokerSettings
from sensors.transports.mqtt import MqttTransport
from tests.support import ROOT, Broker, fleet_command, shared_file

pytestmark = [pytest.mark.needs_mosquitto, pytest.mark.timeout(120)]


async def test_simulate_motes_over_mqtt_leaves_a_retained_hello_per_station(broker: Broker) -> None:
    readings = shared_file("data/metr-la/readings.csv")
    stations = shared_file("data/metr-la/stations.csv")
    cmd = fleet_command(broker, readings, stations, "--limit", "3")
    proc = await asyncio.create_subprocess_exec(
        *cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    _, err = await asyncio.wait_for(proc.communicate(), 100)
    assert proc.returncode == 0, err.decode()
    assert "3 motes sent 6048 samples" in err.decode()
    async with MqttTransport(BrokerSettings(broker.host, broker.port)) as gw:
        hellos: dict[str, Hello] = {}

        async def take() -> None:
            async for sid, m in gw.messages():
                if isinstance(m, Hello):
                    hellos[sid] = m
                    if len(hellos) == 3:
                        return

        await asyncio.wait_for(take(), 20)
    assert all("segment" in h.attributes and "latitude" in h.attributes for h in hellos.values())


def test_simulate_motes_reports_a_bad_trace(tmp_path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("nope\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "simulate-motes",
            "--transport",
            "inprocess",
            "--trace",
            str(bad),
            "--stations",
            str(bad),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "missing column" in proc.stderr


def _identity_args(**kw: object) -> argparse.Namespace:
    base: dict[str, object] = {
        "broker": "mqtts://broker", "tls": False, "ca_file": None, "username": None,
        "password_file": None, "certfile": None, "keyfile": None,
    }  # fmt: skip
    return argparse.Namespace(**(base | kw))


def test_each_mote_connects_as_itself(tmp_path) -> None:
    per = tmp_path / "motes.passwd"
    per.write_text("# id password\n\ns1 one\ns2 two words\n")
    ids = mote_identities(
        _identity_args(username="{sensor_id}", password_file=str(per)), ["s1", "s2"]
    )
    assert [(b.username, b.password, b.tls) for b in ids.values()] == [
        ("s1", "one", True), ("s2", "two words", True),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="no password for mote 's3'"):
        mote_identities(_identity_args(password_file=str(per)), ["s3"])
    one = tmp_path / "one.passwd"
    one.write_text("shared\n")
    ids = mote_identities(_identity_args(username="fleet", password_file=str(one)), ["a", "b"])
    assert {(b.username, b.password) for b in ids.values()} == {("fleet", "shared")}
    with pytest.raises(ValueError, match=r"--username: .* may only name \{sensor_id\}"):
        mote_identities(_identity_args(username="{id}"), ["a"])
    with pytest.raises(ValueError, match=r"--certfile: file not found: .*/a\.pem"):
        mote_identities(_identity_args(certfile=str(tmp_path / "{sensor_id}.pem")), ["a"])
    with pytest.raises(ValueError, match="need TLS"):
        mote_identities(_identity_args(broker="mqtt://broker", ca_file=str(one)), ["a"])


async def test_simulate_motes_with_a_keys_file_seals_every_message(
    broker: Broker, tmp_path
) -> None:
    """A master key line is what a fleet uses: the retained hellos verify with derived keys."""
    from sensors.auth import Keyring
    from sensors.sealing import GatewayAuth

    master = bytes(range(16))
    keys = tmp_path / "motes.keys"
    keys.write_text(f"* {master.hex()}\n")
    readings = shared_file("data/metr-la/readings.csv")
    stations = shared_file("data/metr-la/stations.csv")
    cmd = fleet_command(broker, readings, stations, "--limit", "2", "--keys-file", str(keys))
    proc = await asyncio.create_subprocess_exec(
        *cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    _, err = await asyncio.wait_for(proc.communicate(), 100)
    assert proc.returncode == 0, err.decode()
    auth = GatewayAuth(Keyring(master=master))
    async with MqttTransport(BrokerSettings(broker.host, broker.port)) as gw:
        gw.auth = auth
        hellos: set[str] = set()

        async def take() -> None:
            async for sid, m in gw.messages():
                if isinstance(m, Hello):
                    hellos.add(sid)
                    if len(hellos) == 2:
                        return

        await asyncio.wait_for(take(), 20)
    assert sum(auth.rejected.values()) == 0 and auth.accepted >= 2
    keys.write_text("* 00\n")
    bad = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--keys-file" in bad.stderr and ":1:" in bad.stderr
