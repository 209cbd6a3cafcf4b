"""`fjords-power simulate --mac`: the measured cost of authentication in the mote's budget."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from firmware_sim.cli import main
from firmware_sim.cycles import load_auth_cycles, load_cycle_table
from firmware_sim.wire import hmac_blocks


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


ARGS = ("simulate", "--program", "count", "--rate", "60")


def test_mac_adds_the_measured_cost_and_shortens_the_lifetime(
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, plain, _ = run(capsys, *ARGS, "--json")
    code, sealed, _ = run(capsys, *ARGS, "--json", "--mac", "--controls-per-day", "48")
    assert code == 0
    base, mac = json.loads(plain), json.loads(sealed)["mac"]
    assert "mac" not in base
    assert mac["mj_per_message"] > 0 and mac["mj_per_control"] > 0
    assert mac["power_mw"] > base["power_mw"]
    assert mac["lifetime_days"] < base["lifetime_days"] and mac["lifetime_change_days"] < 0
    assert mac["mj_per_day"] == pytest.approx(
        (mac["sealed_messages_per_s"] * 86400 * mac["mj_per_message"]) + 48 * mac["mj_per_control"]
    )
    # From the measured table, not assumed: one compression costs what simavr counted.
    auth = load_auth_cycles()
    assert mac["cycles_per_message"] == pytest.approx(
        auth.message + auth.block * hmac_blocks(mac["sealed_message_bytes"])
    )


def test_mac_on_the_protocol_wire_and_in_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, *ARGS, "--profile", "telosb", "--mac")
    assert code == 0
    assert "with --mac" in out and "per message" in out and "mJ" in out and "lifetime" in out
    code, out, _ = run(capsys, *ARGS, "--mac", "--json", "--profile", "paper")
    assert json.loads(out)["mac"]["hmac_blocks_per_message"] >= 2


def test_mac_errors_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "simulate", "--program", "raw", "--rate", "180", "--mac")
    assert code == 2 and "cannot seal" in err
    code, _, err = run(capsys, *ARGS, "--mac", "--trace-seconds", "5")
    assert code == 2 and "--trace-seconds" in err
    code, _, err = run(capsys, *ARGS, "--controls-per-day", "3")
    assert code == 2 and "needs --mac" in err


def test_help_documents_mac() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "firmware_sim.cli", "simulate", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--mac" in out and "HMAC-SHA256" in out and "--controls-per-day" in out


def test_the_auth_table_is_measured_on_the_image() -> None:
    table = load_cycle_table("protocol")
    auth = table.meta["auth"]
    assert auth["fit_worst_error"] < 0.02
    assert auth["seal_bytes"] == 19 and auth["tag_bytes"] == 8
    assert 20_000 < auth["block"] < 200_000  # a SHA-256 compression on the 8-bit AVR
