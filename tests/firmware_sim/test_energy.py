"""The cost model's arithmetic against hand-computed cases, and the profiles."""

from __future__ import annotations

import math
import tomllib

import pytest
from firmware_sim.energy import Battery, EnergyAccount
from firmware_sim.profiles import list_profiles, load_profile, parse_profile


def test_paper_profile_is_table_1():
    p = load_profile("paper")
    assert p.tx_joules_per_bit == 4.31e-6
    assert p.battery_v == 5.0 and p.battery_mah == 100.0
    assert (p.cpu_active_mw, p.cpu_idle_mw, p.clock_hz) == (6.0, 0.030, 1e6)
    assert (p.adc_mw, p.adc_latch_us) == (0.6, 60.0)
    assert p.packet_overhead_bits == 0 and p.listen_ms_per_s == 0.0
    assert "bits_per_event" in p.assumptions


def test_profiles_cite_sources():
    from importlib import resources

    assert {"paper", "mica2", "telosb"} <= set(list_profiles())
    for name in list_profiles():
        text = resources.files("firmware_sim.profiles").joinpath(f"{name}.toml").read_text()
        assert "datasheet" in text.lower() or "table" in text.lower(), name
        load_profile(name)


def test_unknown_and_bad_profiles():
    with pytest.raises(ValueError, match="unknown profile 'nokia'"):
        load_profile("nokia")
    data = tomllib.loads(
        load_profile.__wrapped__.__globals__["_folder"]().joinpath("paper.toml").read_text()
    )
    del data["radio"]["tx_joules_per_bit"]
    with pytest.raises(ValueError, match="missing field"):
        parse_profile(data)
    data = tomllib.loads(
        "name='x'\n[cpu]\nactive_mw=0\nidle_mw=0\nclock_hz=1\n[adc]\npower_mw=0\n"
        "latch_us=0\n[radio]\ntx_joules_per_bit=0\n[battery]\ncapacity_mah=1\nvoltage_v=1"
    )
    with pytest.raises(ValueError, match="active_mw must be > 0"):
        parse_profile(data)


def test_each_term_by_hand():
    a = EnergyAccount("paper")
    assert a.add_cycles(1000) == pytest.approx(1e-3)  # 1000 cycles at 1 MHz
    assert a.joules["cpu"] == pytest.approx(1000 * 6e-3 / 1e6)  # 6 nJ per cycle
    a.add_adc(10)
    assert a.joules["adc"] == pytest.approx(10 * 0.6e-3 * 60e-6)  # 36 nJ per conversion
    a.add_bits_sent(100, messages=3)  # paper: no packet overhead
    assert a.joules["radio"] == pytest.approx(100 * 4.31e-6)
    a.add_idle(2.0)
    assert a.joules["idle"] == pytest.approx(2.0 * 30e-6)
    a.add_listen(0.5)
    assert a.joules["listen"] == pytest.approx(0.5 * 5.4e-3)
    a.add_bits_received(10_000)  # one second at 10 kbit/s
    assert a.joules["listen"] == pytest.approx(1.5 * 5.4e-3)
    assert a.total_j == pytest.approx(sum(a.joules.values()))


def test_packet_overhead_counts_per_message():
    a = EnergyAccount("mica2")
    a.add_bits_sent(40, messages=2)
    assert a.joules["radio"] == pytest.approx((40 + 2 * 216) * 1.5625e-6)


def test_charge_one_period():
    a = EnergyAccount("paper")
    a.charge(0.01, cycles=2000, adc=1, bits=16, listen_s=0.001)
    assert a.active_s == pytest.approx(0.002)
    assert a.joules["idle"] == pytest.approx(0.008 * 30e-6)
    assert a.elapsed_s == 0.01
    expected = 2000 * 6e-9 + 36e-9 + 16 * 4.31e-6 + 0.008 * 30e-6 + 0.001 * 5.4e-3
    assert a.total_j == pytest.approx(expected)
    assert a.power_mw == pytest.approx(expected / 0.01 * 1e3)
    a.charge(0.001, cycles=3000)  # 3 ms of work in a 1 ms period
    assert a.overrun_s == pytest.approx(0.002) and a.joules["idle"] == pytest.approx(0.008 * 30e-6)


def test_battery_model():
    b = Battery(100.0, 5.0)
    assert b.current_ma(13.0) == pytest.approx(2.6)  # the paper's 13 mW = 2.6 mA
    assert b.lifetime_s(13.0) == pytest.approx(100 / 2.6 * 3600)  # ~1.6 days
    assert b.capacity_j == pytest.approx(1800.0)
    assert math.isinf(b.lifetime_s(0.0))
    a = EnergyAccount("paper")
    a.add_bits_sent(100_000)
    assert a.battery_remaining == pytest.approx(1 - 0.431 / 1800)


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "3"])
def test_negative_or_bad_amounts_rejected(bad):
    with pytest.raises(ValueError, match="finite number >= 0"):
        EnergyAccount().add_cycles(bad)
