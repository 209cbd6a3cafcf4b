"""Issue 29: keyed AVR firmware motes in simavr against a keyed gateway over a pseudo-terminal.

The real daemon (`[serial] device`, `[sensors] keys_file`) and `simulate-motes --firmware avr
--transport serial --keys-file`: each mote's key goes into its EEPROM, the firmware seals what
it sends and obeys only controls its gateway sealed, and the base station passes both ways'
bytes through unchanged (a re-encoded control would lose its seal). Two motes hold their
keys: their results flow, nothing of theirs is refused, and they obey the gateway's filter.
Forged sleeps written on the serial line for one of them (unsigned, a bad tag, a genuine tag
with a used counter) are ignored by its firmware, which counts them, and it keeps sending.
The third mote holds a wrong key: the gateway refuses every frame of it as `bad_mac`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from sensors.auth import seal
from sensors.framing import frame_payload
from sensors.protocol import Control, encode_message
from tests.daemon import Daemon
from tests.firmware_sim.test_loop_gateway import _env
from tests.support import ROOT, ResultRows, eventually, require, require_binary

pytestmark = [pytest.mark.needs_avr, pytest.mark.timeout(180)]

KEYS = {"901": bytes(range(16)), "902": bytes(range(16, 32)), "903": bytes(range(32, 48))}
WRONG = bytes(range(48, 64))  # what mote 903 holds instead of its key
VICTIM = "901"
READINGS = 56  # a mote's readings, 300 s apart: 14 s of wall time at 1200x
SPEEDUP = 1200
NO_REJECTIONS = {"unsigned": 0, "bad_mac": 0, "replay": 0}


def _files(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """(stations CSV, readings CSV, the gateway's keys file, the motes' keys file)."""
    stations = tmp_path / "stations.csv"
    stations.write_text(
        "station,latitude,longitude,segment\n"
        + "".join(f"{sid},34.1,-118.3,S{n}\n" for n, sid in enumerate(KEYS))
    )
    t0 = 1_700_000_000
    readings = tmp_path / "readings.csv"
    readings.write_text(
        "time,station,speed\n"
        + "".join(
            f"{t0 + 300 * i},{sid},{(30.0, 40.0, 45.0, 60.0)[i % 4]}\n"
            for i in range(READINGS)
            for sid in KEYS
        )
    )
    gateway_keys = tmp_path / "gateway.keys"
    gateway_keys.write_text("".join(f"{sid} {key.hex()}\n" for sid, key in KEYS.items()))
    mote_keys = tmp_path / "motes.keys"
    mote_keys.write_text(
        "".join(f"{sid} {(WRONG if sid == '903' else key).hex()}\n" for sid, key in KEYS.items())
    )
    return stations, readings, gateway_keys, mote_keys


def _rejected(gw: Daemon) -> dict[str, float]:
    """fjords_auth_rejected_total by reason."""
    text = urllib.request.urlopen(f"{gw.url}/metrics", timeout=10).read().decode()
    return {
        m.group(1): float(m.group(2))
        for m in re.finditer(r'^fjords_auth_rejected_total\{reason="(\w+)"\} (\S+)$', text, re.M)
    }


def _forged_sleeps(key: bytes) -> list[bytes]:
    """Three sleeps for VICTIM an intruder on the serial line could write: unsigned, a bad
    tag, and a genuine tag on a counter long used (the gateway's counters are microseconds)."""
    unsigned = encode_message(Control.sleep(VICTIM, 3_600_000, seq=201))
    bad_tag = bytearray(
        seal(encode_message(Control.sleep(VICTIM, 3_600_000, seq=202)), key, 1 << 62)
    )
    bad_tag[-1] ^= 0x01
    replayed = seal(encode_message(Control.sleep(VICTIM, 3_600_000, seq=203)), key, 1)
    return [frame_payload(m) for m in (unsigned, bytes(bad_tag), replayed)]


def test_keyed_avr_motes_against_a_keyed_gateway_over_a_pty(tmp_path: Path) -> None:
    require_binary("avr-gcc", "gcc-avr")
    require_binary("simavr", "simavr")
    from firmware_sim.loop import toolchain_missing

    missing = toolchain_missing()
    require(not missing, f"{', '.join(missing)} (Debian packages libsimavr-dev, gcc)")
    stations, readings, gateway_keys, mote_keys = _files(tmp_path)
    device = tmp_path / "ttyMOTES"
    gw = Daemon(
        tmp_path,
        f'[state]\ndir = "{tmp_path / "state"}"\n[[serial]]\ndevice = "{device}"\n'
        f'[sensors]\nkeys_file = "{gateway_keys}"\n',
    )
    report = tmp_path / "report.json"
    motes_log = tmp_path / "motes.log"
    motes: subprocess.Popen[bytes] | None = None
    try:
        gw.start()
        qid = gw.post("/queries", {"sql": "SELECT station, speed FROM traffic WHERE speed < 50"})[
            "id"
        ]
        rows = ResultRows(f"{gw.url}/queries/{qid}/results?format=ndjson")
        rows.start()
        motes = subprocess.Popen(
            [
                sys.executable, "-m", "gateway.cli", "simulate-motes", "--firmware", "avr",
                "--transport", "serial", "--device", str(device), "--trace", str(readings),
                "--stations", str(stations), "--speedup", str(SPEEDUP),
                "--keys-file", str(mote_keys), "--report", str(report),
            ],
            cwd=ROOT,
            env=_env(tmp_path),
            stderr=motes_log.open("w"),
        )  # fmt: skip

        def sensors() -> dict[str, dict[str, Any]]:
            assert motes is not None and motes.poll() is None, motes_log.read_text()
            return {s["id"]: s for s in gw.get("/sensors")["sensors"]}

        # (b) The gateway's filter, sealed by it, reaches the firmware intact and is obeyed
        # (acknowledged by the mote: /sensors shows the program it acked).
        got = eventually(
            sensors,
            lambda s: all(s.get(sid, {}).get("program") == "filter" for sid in ("901", "902")),
            message=lambda: f"filter on 901 and 902\n{gw.tail()}\n{motes_log.read_text()}",
            timeout=60,
            interval=0.3,
        )
        assert "903" not in got, got["903"]  # (d) never spoke for itself
        # (c) Forged sleeps on the line: the victim's firmware hears them in its next window.
        before = rows.of(VICTIM)
        fd = os.open(device, os.O_WRONLY | os.O_NOCTTY)
        try:
            for frame in _forged_sleeps(KEYS[VICTIM]):
                os.write(fd, frame)
        finally:
            os.close(fd)
        eventually(
            lambda: (rows.of(VICTIM), sensors()[VICTIM]["status"]),
            lambda got: got[0] >= before + 6 and got[1] != "asleep",
            message=lambda: f"{VICTIM} keeps sending\n{motes_log.read_text()}",
            timeout=60,
            interval=0.2,
        )
        assert motes.wait(timeout=120) == 0, motes_log.read_text()
        per_mote = json.loads(report.read_text())
        # (d) the mote with a wrong key refused as a forger, frame after frame (those it sent
        # before the gateway had opened the new pty are lost), and nothing refused otherwise
        sent = per_mote["903"]["frames"]
        rejected = eventually(
            lambda: _rejected(gw),
            lambda got: got.get("bad_mac", 0) > sent / 2,
            message=lambda: f"most of 903's {sent} frames refused\n{gw.tail()}",
            timeout=30,
        )
        final = {s["id"]: s for s in gw.get("/sensors")["sensors"]}
    finally:
        if motes is not None and motes.poll() is None:
            motes.kill()
            motes.wait(timeout=10)
        gw.kill()
    assert rejected["bad_mac"] <= sent
    assert {r: rejected.get(r, 0) for r in ("unsigned", "replay", "unknown_key")} == dict.fromkeys(
        ("unsigned", "replay", "unknown_key"), 0
    )
    # (c) ignored and counted by the victim's firmware, one per kind of forgery; the genuine
    # controls of the gateway were all taken (nothing else ignored, by either keyed mote).
    assert per_mote[VICTIM]["controls_ignored"] == {"unsigned": 1, "bad_mac": 1, "replay": 1}
    assert per_mote["902"]["controls_ignored"] == NO_REJECTIONS
    # (b) the filter ran on the firmware: readings of 50 mph or more were not sent once it did
    for sid in ("901", "902"):
        assert per_mote[sid]["taken"] == READINGS
        assert per_mote[sid]["sent"]["samples"] < READINGS - 5, per_mote[sid]
    # (a) the keyed motes: results flowed (the filter's rows only) and nothing was refused
    for sid in ("901", "902"):
        assert rows.of(sid) > 0
        assert {k: final[sid]["counters"][k] for k in NO_REJECTIONS} == NO_REJECTIONS, final[sid]
    assert all(r["speed"] < 50 for r in list(rows.rows) if "speed" in r)
    assert "903" not in final
