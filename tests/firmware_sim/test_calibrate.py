"""`fjords-power calibrate`: the cost model within 1% on average and 2% worst case of the
energy the firmware itself accounts for in the loop (issue 12, item 3)."""

from __future__ import annotations

import json

import pytest

from tests.support import require, require_binary

pytestmark = [pytest.mark.needs_avr, pytest.mark.timeout(120)]


def test_calibrate_json_meets_the_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    require_binary("avr-gcc", "gcc-avr")
    require_binary("simavr", "simavr")
    from firmware_sim.cli import main
    from firmware_sim.loop import toolchain_missing

    missing = toolchain_missing()
    require(not missing, f"{', '.join(missing)} (Debian packages libsimavr-dev, gcc)")
    assert main(["calibrate", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    programs = {r["program"] for r in result["rows"]}
    assert programs == {"raw", "filter", "deadband", "aggregate", "count", "vehicle"}
    assert len({r["rate_hz"] for r in result["rows"]}) >= 3
    assert all(r["measured_j"] > 0 for r in result["rows"])
    assert result["mean_abs_error"] <= 0.01, result["rows"]
    assert result["max_abs_error"] <= 0.02, result["rows"]
