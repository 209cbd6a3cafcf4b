"""Rebuild the AVR firmware, re-run it in simavr and fail if a stored cycles table drifted.

Both tables: the protocol image's (cycles.json; the measurement also checks that the image
sends the data messages its Python model sends, and measures what authentication costs it) and the paper's packed-format programs'
(cycles-packed.json; checked byte for byte against their Python models).
"""

from __future__ import annotations

import pytest
from firmware_sim import measure, measure_packed
from firmware_sim.cycles import load_cycle_table, parse_cycle_table

from tests.support import require, require_binary

pytestmark = pytest.mark.needs_avr


def _require_toolchain() -> None:
    require_binary("avr-gcc", "gcc-avr")
    require_binary("simavr", "simavr")
    missing = measure.toolchain_missing()
    require(not missing, f"{', '.join(missing)} (Debian packages libsimavr-dev, gcc)")


@pytest.mark.parametrize(("wire", "module"), [("protocol", measure), ("packed", measure_packed)])
def test_stored_cycles_match_a_fresh_measurement(tmp_path, wire, module):
    _require_toolchain()
    fresh = parse_cycle_table(module.measure(tmp_path / "build"))
    drift = module.compare(load_cycle_table(wire), fresh)
    if wire == "protocol":  # and what authentication costs (measure_auth)
        stored, new = load_cycle_table(wire).meta["auth"], fresh.meta["auth"]
        drift += [
            f"auth.{k}: stored {stored[k]} measured {new[k]}"
            for k in ("boot", "message", "block", "control", "forgery")
            if abs(stored[k] - new[k]) > max(1.0, 0.02 * abs(stored[k]))
        ]
    assert not drift, "cycles table drifted; run `fjords-power measure --write --packed`: " + (
        "; ".join(drift)
    )


def test_the_protocol_table_records_the_toolchain():
    table = load_cycle_table("protocol")
    assert "protocol image" in table.meta["image"]
    assert {"avr-gcc", "avr-libc", "libsimavr-dev"} <= set(table.meta["toolchain"])
