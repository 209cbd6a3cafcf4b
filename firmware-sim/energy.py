"""A mote's exact running energy account and the battery model.

energy = active cycles x energy per cycle + idle power x idle time
       + conversions x A-to-D energy + bits sent x energy per bit
       + listen (receive) time x receive power
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from firmware_sim.profiles import Profile, resolve_profile

COMPONENTS = ("radio", "cpu", "adc", "idle", "listen")


@dataclass(frozen=True, slots=True)
class Battery:
    """Ideal battery: constant voltage, all of its rated capacity usable."""

    capacity_mah: float
    voltage_v: float

    @classmethod
    def of(cls, profile: Profile) -> Battery:
        return cls(profile.battery_mah, profile.battery_v)

    @property
    def capacity_j(self) -> float:
        return self.capacity_mah * 3.6 * self.voltage_v

    def current_ma(self, power_mw: float) -> float:
        return power_mw / self.voltage_v

    def lifetime_s(self, power_mw: float) -> float:
        """Seconds until empty at a constant average power (inf at zero power)."""
        if power_mw <= 0:
            return math.inf
        return self.capacity_mah / self.current_ma(power_mw) * 3600.0


class EnergyAccount:
    """Joules spent so far, by component, and the time they were spent over."""

    def __init__(self, profile: str | Profile = "paper", battery: Battery | None = None):
        self.profile = resolve_profile(profile)
        self.battery = battery or Battery.of(self.profile)
        self.joules = dict.fromkeys(COMPONENTS, 0.0)
        self.elapsed_s = 0.0
        self.active_s = 0.0
        self.overrun_s = 0.0  # work that did not fit in its period (the mote cannot keep up)

    # -- the five terms -------------------------------------------------------------
    def add_cycles(self, cycles: float) -> float:
        """Active CPU cycles (of the measured AVR); returns the active seconds."""
        _non_negative("cycles", cycles)
        scaled = cycles * self.profile.cycles_scale
        self.joules["cpu"] += scaled * self.profile.joules_per_cycle
        seconds = scaled / self.profile.clock_hz
        self.active_s += seconds
        return seconds

    def add_adc(self, conversions: int = 1) -> None:
        _non_negative("conversions", conversions)
        self.joules["adc"] += conversions * self.profile.adc_joules

    def add_bits_sent(self, bits: int, messages: int = 0) -> None:
        """Payload bits plus the profile's per-packet overhead for `messages` packets."""
        _non_negative("bits", bits)
        _non_negative("messages", messages)
        total = bits + messages * self.profile.packet_overhead_bits
        self.joules["radio"] += total * self.profile.tx_joules_per_bit

    def add_listen(self, seconds: float) -> None:
        """Receiver on for `seconds` (listen windows)."""
        _non_negative("seconds", seconds)
        self.joules["listen"] += seconds * self.profile.rx_mw * 1e-3

    def add_bits_received(self, bits: int) -> None:
        """Receive time of `bits` at the profile's bit rate."""
        _non_negative("bits", bits)
        if self.profile.bit_rate_bps <= 0:
            raise ValueError(f"profile {self.profile.name!r} has no bit_rate_bps")
        self.add_listen(bits / self.profile.bit_rate_bps)

    def add_idle(self, seconds: float) -> None:
        _non_negative("seconds", seconds)
        self.joules["idle"] += seconds * self.profile.cpu_idle_mw * 1e-3

    def advance(self, seconds: float) -> None:
        """Wall time passes (the denominator of the average power)."""
        _non_negative("seconds", seconds)
        self.elapsed_s += seconds

    # -- one period at a time -------------------------------------------------------
    def charge(
        self,
        period_s: float,
        *,
        cycles: float = 0.0,
        adc: int = 0,
        bits: int = 0,
        messages: int = 0,
        listen_s: float = 0.0,
    ) -> None:
        """A period of `period_s` seconds: the CPU idles whenever it is not active."""
        active = self.add_cycles(cycles)
        self.add_adc(adc)
        self.add_bits_sent(bits, messages)
        self.add_listen(listen_s)
        idle = period_s - active
        if idle < 0:
            self.overrun_s += -idle
            idle = 0.0
        self.add_idle(idle)
        self.advance(period_s)

    # -- results --------------------------------------------------------------------
    @property
    def total_j(self) -> float:
        return sum(self.joules.values())

    def breakdown_mw(self) -> dict[str, float]:
        if self.elapsed_s <= 0:
            return dict.fromkeys(COMPONENTS, 0.0)
        return {k: v / self.elapsed_s * 1e3 for k, v in self.joules.items()}

    @property
    def power_mw(self) -> float:
        return self.total_j / self.elapsed_s * 1e3 if self.elapsed_s > 0 else 0.0

    @property
    def current_ma(self) -> float:
        return self.battery.current_ma(self.power_mw)

    @property
    def lifetime_s(self) -> float:
        return self.battery.lifetime_s(self.power_mw)

    @property
    def battery_remaining_j(self) -> float:
        return max(0.0, self.battery.capacity_j - self.total_j)

    @property
    def battery_remaining(self) -> float:
        """Fraction of the battery left."""
        return self.battery_remaining_j / self.battery.capacity_j


def _non_negative(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, not {value!r}")
