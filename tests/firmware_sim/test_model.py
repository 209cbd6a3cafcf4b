"""The paper's scenarios, power against rate, and the proxy's choice."""

from __future__ import annotations

import pytest
from firmware_sim.energy import EnergyAccount
from firmware_sim.model import choose, predict
from firmware_sim.programs import make_program
from firmware_sim.traces import vehicle_pair_trace

DAY = 86_400.0


@pytest.mark.parametrize(
    ("program", "paper_mw"), [("raw", 13.0), ("vehicle", 1.1), ("count", 0.38)]
)
def test_paper_figures_within_15_percent(program, paper_mw):
    p = predict(program, 180)
    assert abs(p.power_mw - paper_mw) / paper_mw <= 0.15


def test_paper_lifetimes_in_paper_terms():
    assert 1.0 <= predict("raw", 180).lifetime_days <= 2.0  # "about a day and a half"
    assert 14.0 <= predict("vehicle", 180).lifetime_days <= 21.0  # "two and a half weeks"
    assert predict("raw", 180).current_ma == pytest.approx(predict("raw", 180).power_mw / 5.0)


def test_raw_is_radio_dominated_and_linear():
    a, b, c = (predict("raw", r) for r in (50, 100, 200))
    assert b.power_mw - a.power_mw == pytest.approx((c.power_mw - b.power_mw) / 2)
    assert all(p.breakdown_mw["radio"] > 0.9 * p.power_mw for p in (a, b, c))


def test_vehicle_and_count_become_cpu_dominated():
    count = predict("count", 400)
    assert count.breakdown_mw["cpu"] + count.breakdown_mw["adc"] > count.breakdown_mw["radio"]
    vehicle = predict("vehicle", 1000)
    assert vehicle.breakdown_mw["cpu"] + vehicle.breakdown_mw["adc"] > vehicle.breakdown_mw["radio"]
    # the radio part does not grow with rate, the CPU part does
    lo, hi = predict("vehicle", 100), predict("vehicle", 400)
    assert lo.breakdown_mw["radio"] == pytest.approx(hi.breakdown_mw["radio"])
    assert hi.breakdown_mw["cpu"] > 3 * lo.breakdown_mw["cpu"]


def test_ordering_and_listen_window():
    at = {p: predict(p, 180).power_mw for p in ("raw", "vehicle", "count")}
    assert at["raw"] > at["vehicle"] > at["count"]
    listening = predict("count", 180, listen_ms_per_s=20)
    assert listening.breakdown_mw["listen"] == pytest.approx(0.02 * 5.4)


def test_prediction_agrees_with_exact_simulation():
    """predict() and a per-sample EnergyAccount over a trace use the same arithmetic."""
    trace = vehicle_pair_trace(60.0, rate_hz=180, vehicles_per_second=1.5, seed=11)
    program = make_program("vehicle")
    account = EnergyAccount("paper")
    for t, v in trace.samples():
        program.feed(t, v)
        c = program.last
        account.charge(1 / 180, cycles=c.cycles, adc=c.adc, bits=c.bits, messages=c.messages)
    seen = len(trace.vehicles) / 60.0
    p = predict("vehicle", 180, vehicles_per_second=seen)
    assert account.power_mw == pytest.approx(p.power_mw, rel=0.01)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"program": "nope", "rate_hz": 10}, "unknown program"),
        ({"program": "raw", "rate_hz": 0}, "positive"),
        ({"program": "raw", "rate_hz": float("nan")}, "positive"),
        ({"program": "raw", "rate_hz": 10, "profile": "nokia"}, "unknown profile"),
        ({"program": "vehicle", "rate_hz": 5}, "too slow"),
        ({"program": "raw", "rate_hz": 100_000}, "cycles/s"),
        ({"program": "filter", "rate_hz": 10, "selectivity": 2}, "selectivity"),
    ],
)
def test_predict_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        predict(**kwargs)


def test_choose_cheapest_program_highest_rate():
    c = choose("counts", 30 * DAY)
    assert c.program == "count"
    assert c.prediction.lifetime_s >= 30 * DAY
    assert predict("count", c.rate_hz + 1).lifetime_s < 30 * DAY
    assert c.candidates[0]["chosen"] and c.candidates[0]["program"] == "count"


def test_choose_vehicles_and_none_does():
    short = choose("vehicles", 10 * DAY)
    assert short.program == "vehicle" and short.rate_hz >= 180
    none = choose("vehicles", 60 * DAY)
    assert none.program is None and none.reason.startswith("none does")
    assert choose("raw", 1 * DAY).program == "raw"


def test_choose_errors():
    with pytest.raises(ValueError, match="unknown need"):
        choose("gossip", DAY)
    with pytest.raises(ValueError, match="lifetime"):
        choose("counts", -1)
    with pytest.raises(ValueError, match="reaches"):
        choose("vehicles", DAY, rates=[1, 2, 3])
