"""The awake-cycles table of the protocol image, measured in simavr (package data cycles.json).

Each program's awake cycles are modelled as
    boot + sample * conversions + edge * detector edges + message * data messages
    + window * receive windows + listen * bare listen frames + byte * bytes sent,
fitted by `firmware_sim.measure` from the image (avr/image.c) run in the loop on synthetic
traces, so nothing needs the AVR toolchain at run time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any


@dataclass(frozen=True, slots=True)
class ProgramCycles:
    """Fitted awake cycles of one program (ATmega128 cycles)."""

    sample: float
    edge: float
    message: float = 0.0  # a data message built (envelope, fields)
    # the runtime's, shared by every program (see firmware_sim.measure)
    window: float = 0.0  # a receive window opened and closed
    listen: float = 0.0  # a bare listen frame built
    byte: float = 0.0  # a byte framed (CRC, COBS) and sent by the UART interrupt
    float_time: float = 0.0  # a time encoded as float64 (ms to seconds, 64-bit arithmetic)
    int_time: float = 0.0  # a whole-second time encoded as an integer
    reading: float = 0.0  # a value encoded (reading, partial sum/min/max, count)
    boot: float = 0.0  # start-up: EEPROM, boot program, hello
    message_bytes: float = 0.0  # packed programs: bytes of their longest message

    def cycles(self, edges: int = 0, messages: int = 0) -> float:
        """One sample period's cycles, bar the bytes (which depend on the wire)."""
        return self.sample + self.edge * edges + self.message * messages


@dataclass(frozen=True, slots=True)
class CycleTable:
    mcu: str
    f_cpu_hz: int
    programs: dict[str, ProgramCycles]
    meta: dict[str, Any]

    def __getitem__(self, program: str) -> ProgramCycles:
        try:
            return self.programs[program]
        except KeyError:
            raise ValueError(
                f"no measured cycles for program {program!r}; have {sorted(self.programs)}"
            ) from None


#: Each wire's table: the protocol image's and the paper's packed programs'.
TABLES = {"protocol": "cycles.json", "packed": "cycles-packed.json"}
_REQUIRED = ("sample", "edge")
_FIELDS = (
    "sample",
    "edge",
    "message",
    "window",
    "listen",
    "byte",
    "float_time",
    "int_time",
    "reading",
    "boot",
    "message_bytes",
)


def parse_cycle_table(data: dict[str, Any]) -> CycleTable:
    shared = data.get("shared", {})
    programs = {}
    for name, own in data["programs"].items():
        merged = {**shared, **own}
        missing = [k for k in _REQUIRED if k not in merged]
        if missing:
            raise ValueError(f"cycles table: program {name!r} lacks {missing}")
        programs[name] = ProgramCycles(**{k: float(merged[k]) for k in _FIELDS if k in merged})
    meta = {k: v for k, v in data.items() if k not in {"programs", "shared", "mcu", "f_cpu_hz"}}
    return CycleTable(str(data["mcu"]), int(data["f_cpu_hz"]), programs, meta)


@dataclass(frozen=True, slots=True)
class AuthCycles:
    """What authentication adds to the protocol image (cycles.json `auth`, measured by
    firmware_sim.measure_auth): HMAC-SHA256 compressions and the per-message remainder."""

    boot: float  # the key's inner and outer blocks, the boot count written
    message: float  # per sealed message beyond its compressions: counter, 19 bytes framed
    block: float  # one SHA-256 compression
    control: float  # a genuine control of `control_bytes` verified (beyond an unkeyed one)
    control_bytes: int
    control_blocks: int
    forgery: float  # a forged control of `control_bytes` received and rejected
    seal_bytes: int = 19

    def seal(self, message_bytes: float) -> float:
        """Cycles to seal a message of `message_bytes` (unsealed) and send the seal's bytes."""
        from firmware_sim.wire import hmac_blocks

        return self.message + self.block * hmac_blocks(message_bytes)

    def verify(self, control_bytes: float) -> float:
        """Cycles to verify a genuine control of `control_bytes` (unsealed)."""
        from firmware_sim.wire import hmac_blocks

        fixed = self.control - self.block * self.control_blocks
        return fixed + self.block * hmac_blocks(control_bytes)


def parse_auth_cycles(data: dict[str, Any]) -> AuthCycles:
    try:
        auth = data["auth"]
    except KeyError:
        raise ValueError(
            "cycles table has no `auth` section (fjords-power measure --write)"
        ) from None
    return AuthCycles(
        **{k: auth[k] for k in ("boot", "message", "block", "control", "forgery")},
        control_bytes=int(auth["control_bytes"]),
        control_blocks=int(auth["control_blocks"]),
        seal_bytes=int(auth["seal_bytes"]),
    )


@cache
def load_auth_cycles() -> AuthCycles:
    """The committed cost of authentication on the protocol image (cached)."""
    text = resources.files("firmware_sim").joinpath(TABLES["protocol"]).read_text()
    return parse_auth_cycles(json.loads(text))


@cache
def load_cycle_table(wire: str = "protocol") -> CycleTable:
    """The committed table of the firmware that speaks `wire` (cached)."""
    if wire not in TABLES:
        raise ValueError(f"wire must be one of {sorted(TABLES)}, not {wire!r}")
    text = resources.files("firmware_sim").joinpath(TABLES[wire]).read_text()
    return parse_cycle_table(json.loads(text))
