"""The cycles-per-sample table measured in simavr (package data cycles.json).

Each program's awake cycles in one sample period are modelled as
    sample + edge * (detector state changes) + message * (messages sent),
fitted by `firmware_sim.measure` from the AVR build run on a synthetic trace, so
nothing needs the AVR toolchain at run time.
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
    message: float
    message_bytes: int

    def cycles(self, edges: int = 0, messages: int = 0) -> float:
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


def parse_cycle_table(data: dict[str, Any]) -> CycleTable:
    programs = {
        name: ProgramCycles(
            float(p["sample"]), float(p["edge"]), float(p["message"]), int(p["message_bytes"])
        )
        for name, p in data["programs"].items()
    }
    meta = {k: v for k, v in data.items() if k not in {"programs", "mcu", "f_cpu_hz"}}
    return CycleTable(str(data["mcu"]), int(data["f_cpu_hz"]), programs, meta)


@cache
def load_cycle_table() -> CycleTable:
    """The committed table (cached)."""
    text = resources.files("firmware_sim").joinpath("cycles.json").read_text()
    return parse_cycle_table(json.loads(text))
