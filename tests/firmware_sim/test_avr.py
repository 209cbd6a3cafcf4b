"""Rebuild the AVR programs, re-run them in simavr and fail if the stored table drifted.

The measurement also checks that every firmware image sends exactly the bytes its
Python model sends on the same trace.
"""

from __future__ import annotations

import pytest
from firmware_sim.cycles import load_cycle_table, parse_cycle_table
from firmware_sim.measure import compare, measure

from tests.support import require, require_binary

pytestmark = pytest.mark.needs_avr


def test_stored_cycles_match_a_fresh_measurement(tmp_path):
    require_binary("avr-gcc", "gcc-avr")
    require_binary("simavr", "simavr")
    from firmware_sim.measure import toolchain_missing

    missing = toolchain_missing()
    require(not missing, f"{', '.join(missing)} (Debian packages libsimavr-dev, gcc)")
    fresh = parse_cycle_table(measure(tmp_path / "build"))
    drift = compare(load_cycle_table(), fresh)
    assert not drift, "cycles.json drifted; run `fjords-power measure --write`: " + "; ".join(drift)
