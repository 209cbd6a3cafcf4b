"""`fjords-power calibrate`: the cost model's prediction (`model.predict` for the protocol
wire) within 1% on average and 2% worst case of the energy the firmware itself accounts for
in the loop, and nothing but the model behind the prediction."""

from __future__ import annotations

import dataclasses
import json

import pytest
from firmware_sim import calibrate as cal
from firmware_sim import measure, model
from firmware_sim.cycles import CycleTable, load_cycle_table

from tests.support import require, require_binary

pytestmark = [pytest.mark.needs_avr, pytest.mark.timeout(300)]


def _require_toolchain() -> None:
    require_binary("avr-gcc", "gcc-avr")
    require_binary("simavr", "simavr")
    from firmware_sim.loop import toolchain_missing

    missing = toolchain_missing()
    require(not missing, f"{', '.join(missing)} (Debian packages libsimavr-dev, gcc)")


def test_calibrate_json_meets_the_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    _require_toolchain()
    from firmware_sim.cli import main

    assert main(["calibrate", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    programs = {r["program"] for r in result["rows"]}
    assert programs == {"raw", "filter", "deadband", "aggregate", "count", "vehicle"}
    assert len({r["rate_hz"] for r in result["rows"]}) >= 3
    assert all(r["measured_j"] > 0 for r in result["rows"])
    assert result["mean_abs_error"] <= 0.01, result["rows"]
    assert result["max_abs_error"] <= 0.02, result["rows"]


def _perturbed(program: str, **change: float) -> CycleTable:
    table = load_cycle_table("protocol")
    programs = dict(table.programs)
    programs[program] = dataclasses.replace(programs[program], **change)
    return dataclasses.replace(table, programs=programs)


def test_the_prediction_is_the_models_and_moves_with_the_cycles_table() -> None:
    """A cycles entry perturbed moves the calibration's prediction by exactly what the model's
    arithmetic says, and a prediction equals model.predict_run on the same workload."""
    from firmware_sim.profiles import resolve_profile

    paper = resolve_profile("paper")
    counts = measure.trace_counts("filter", 50, cal.TEST_SEED, cal.SECONDS)
    base, work = cal.predicted("filter", 20.0, counts, paper)
    assert base == model.predict_run(
        "filter",
        20.0,
        cal.SECONDS,
        paper,
        mote=model.Mote(sensor_id=cal.SENSOR),
        tail_s=cal.SHUTDOWN_S,
        listen_ms_per_s=20.0,
        listen_every_ms=1000,
        **work,
    )
    extra = 1000.0  # cycles per sample
    table = _perturbed("filter", sample=load_cycle_table().programs["filter"].sample + extra)
    moved, _ = cal.predicted("filter", 20.0, counts, paper, cycles=table)
    # those cycles are active instead of idle
    per_cycle = paper.joules_per_cycle - paper.cpu_idle_mw * 1e-3 / paper.clock_hz
    assert moved - base == pytest.approx(len(counts) * extra * per_cycle, rel=1e-6)
    # and the steady-state prediction moves the same way
    p0 = model.predict("filter", 20.0, paper, wire="protocol", **work)
    p1 = model.predict("filter", 20.0, paper, wire="protocol", cycles=table, **work)
    assert p1.cycles_per_s - p0.cycles_per_s == pytest.approx(20.0 * extra)


def test_listen_windows_follow_the_firmware_rule() -> None:
    # a message every sample: a window each listen period, never a bare listen
    assert model.listen_windows(0.1, 1.0, every=1) == pytest.approx((1.0, 0.0))
    # no messages at all: a bare listen every two listen periods
    assert model.listen_windows(0.1, 1.0, burst_p=0.0) == pytest.approx((0.5, 0.5))
    # a message every 3 s (samples 0, 30, 60, ...): bare at 2 s, riding at 3 s, bare at 5 s...
    assert model.listen_windows(0.1, 1.0, every=30) == pytest.approx((2 / 3, 1 / 3))


def test_whole_second_times() -> None:
    assert model.whole_fraction(100) == pytest.approx(0.1)
    assert model.whole_fraction(20, every=50) == 1.0
    assert model.whole_fraction(6) == pytest.approx(1 / 500)
