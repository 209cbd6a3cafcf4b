"""Hardware profiles: energy parameters as data files (profiles/*.toml, package data), each citing its source."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any


@dataclass(frozen=True, slots=True)
class Profile:
    """One mote's energy parameters (SI-ish units as named)."""

    name: str
    description: str
    cpu_active_mw: float
    cpu_idle_mw: float
    clock_hz: float
    cycles_scale: float
    adc_mw: float
    adc_latch_us: float
    tx_joules_per_bit: float
    rx_mw: float
    packet_overhead_bits: int
    bit_rate_bps: float
    battery_mah: float
    battery_v: float
    listen_ms_per_s: float
    vehicles_per_second: float
    #: What the model puts on the air by default: "packed" (the paper's 16-bit format) or
    #: "protocol" (the protocol image's msgpack frames; firmware_sim.wire).
    wire: str = "packed"
    assumptions: dict[str, str] = field(default_factory=dict)

    @property
    def joules_per_cycle(self) -> float:
        return self.cpu_active_mw * 1e-3 / self.clock_hz

    @property
    def adc_joules(self) -> float:
        """Energy of one conversion: A-to-D power over its latch time."""
        return self.adc_mw * 1e-3 * self.adc_latch_us * 1e-6


def _folder():
    return resources.files("firmware_sim.profiles")


def list_profiles() -> list[str]:
    """Names of the bundled profiles."""
    return sorted(
        p.name.removesuffix(".toml") for p in _folder().iterdir() if p.name.endswith(".toml")
    )


def parse_profile(data: dict[str, Any]) -> Profile:
    """A Profile from parsed TOML; ValueError naming the missing or bad field."""
    try:
        cpu, adc, radio = data["cpu"], data["adc"], data["radio"]
        battery, workload = data["battery"], data.get("workload", {})
        profile = Profile(
            name=str(data["name"]),
            description=str(data.get("description", "")),
            cpu_active_mw=float(cpu["active_mw"]),
            cpu_idle_mw=float(cpu["idle_mw"]),
            clock_hz=float(cpu["clock_hz"]),
            cycles_scale=float(cpu.get("cycles_scale", 1.0)),
            adc_mw=float(adc["power_mw"]),
            adc_latch_us=float(adc["latch_us"]),
            tx_joules_per_bit=float(radio["tx_joules_per_bit"]),
            rx_mw=float(radio.get("rx_mw", 0.0)),
            packet_overhead_bits=int(radio.get("packet_overhead_bits", 0)),
            bit_rate_bps=float(radio.get("bit_rate_bps", 0.0)),
            battery_mah=float(battery["capacity_mah"]),
            battery_v=float(battery["voltage_v"]),
            listen_ms_per_s=float(workload.get("listen_ms_per_s", 0.0)),
            vehicles_per_second=float(workload.get("vehicles_per_second", 5.0)),
            wire=str(radio.get("wire", "packed")),
            assumptions={str(k): str(v) for k, v in data.get("assumptions", {}).items()},
        )
    except KeyError as exc:
        raise ValueError(f"profile {data.get('name', '?')!r}: missing field {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"profile {data.get('name', '?')!r}: bad value: {exc}") from None
    positive = {
        "cpu.active_mw": profile.cpu_active_mw,
        "cpu.clock_hz": profile.clock_hz,
        "battery.capacity_mah": profile.battery_mah,
        "battery.voltage_v": profile.battery_v,
    }
    if profile.wire not in ("packed", "protocol"):
        raise ValueError(f"profile {profile.name!r}: radio.wire must be 'packed' or 'protocol'")
    for key, value in positive.items():
        if not value > 0:
            raise ValueError(f"profile {profile.name!r}: {key} must be > 0, not {value}")
    return profile


@cache
def load_profile(name: str = "paper") -> Profile:
    """A bundled profile by name; ValueError listing the known ones."""
    if not isinstance(name, str) or name not in list_profiles():
        raise ValueError(f"unknown profile {name!r}; expected one of {list_profiles()}")
    text = _folder().joinpath(f"{name}.toml").read_text()
    return parse_profile(tomllib.loads(text))


def resolve_profile(profile: str | Profile) -> Profile:
    return profile if isinstance(profile, Profile) else load_profile(profile)
