"""What a mote will not do, learned from the controls it refused or left unanswered (sans-IO).

- A program it refused is never asked for again.
- A program or rate change left unanswered (no ack after `max_sends`, though the mote never
  refused: the ack may have been lost) is not asked for again until a cooldown of the sensor's
  time, `COOLDOWN_S` doubling with each unanswered give-up up to `COOLDOWN_MAX_S`, reset by an
  ack; meanwhile the proxy settles for what needs no control.
- A refused faster period caps the rate at the native one (a trace replay cannot sample faster
  than its trace, slower may still work); a refused slower one, or a cap refused too, means the
  rate cannot be changed at all (a mote that samples at a trace's times).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from proxies.control import describe
from sensors.protocol import Control, ControlOp

__all__ = ["COOLDOWN_MAX_S", "COOLDOWN_S", "Refusals"]

COOLDOWN_S = 60.0
COOLDOWN_MAX_S = 3600.0


class Refusals:
    """One mote's refusals and unanswered controls (see the module docstring)."""

    __slots__ = ("refused", "cooling", "unanswered", "rate_adjustable", "max_rate_hz")

    def __init__(self) -> None:
        self.refused: set[str] = set()  # programs the mote said no to
        self.cooling: dict[str, float] = {}  # program or "rate" -> until (sensor time)
        self.unanswered: dict[str, int] = {}  # what -> unanswered give-ups since its last ack
        self.rate_adjustable = True
        self.max_rate_hz: float | None = None

    def usable(self, capabilities: Iterable[str]) -> list[str]:
        """The programs worth asking for now (at least `raw`, which needs no control)."""
        caps = [c for c in capabilities if c not in self.refused and c not in self.cooling]
        return caps or ["raw"]

    def acked(self, control: Control) -> None:
        """An ack: what it changed is answered again, its backoff starts over."""
        what = _what(control)
        if what is not None:
            self.unanswered.pop(what, None)

    def gave_up(
        self, control: Control, now: float, *, unanswered: bool, native_rate_hz: float | None
    ) -> str | None:
        """The channel gave `control` up: learn from it. Returns why the program is to be
        chosen again, or None when the choice stands."""
        op = control.op
        if unanswered and op in (ControlOp.SET_PERIOD, ControlOp.LOAD_PROGRAM):
            what = _what(control)
            refused = what in self.refused or (what == "rate" and not self.rate_adjustable)
            if what and not refused:
                count = self.unanswered.get(what, 0)
                wait = min(COOLDOWN_MAX_S, COOLDOWN_S * 2.0**count)
                self.unanswered[what] = count + 1
                self.cooling[what] = now + wait
                if what == "rate":
                    self.rate_adjustable = False
                return f"{describe(control)} unanswered; asked again after {wait:g} s"
        if op == ControlOp.SET_PERIOD:
            assert control.period_ms is not None
            refused_hz = 1000.0 / control.period_ms if control.period_ms > 0 else math.inf
            native = native_rate_hz
            if native and refused_hz > native * (1 + 1e-9) and self.max_rate_hz is None:
                self.max_rate_hz = native
                return f"the sample rate cannot go above {native:g} Hz"
            self.rate_adjustable = False
            return "the sample rate cannot be changed"
        if op == ControlOp.LOAD_PROGRAM and control.program:
            self.refused.add(control.program)
            return f"{control.program} is not available"
        return None

    def cooled(self, now: float) -> list[str]:
        """The programs and rates whose cooldown has passed by `now`: they may be asked for
        again."""
        done = [w for w, until in self.cooling.items() if now >= until]
        for what in done:
            del self.cooling[what]
            if what == "rate":
                self.rate_adjustable = True
        return done


def _what(control: Control) -> str | None:
    """What a control changes: "rate" for the sample period, else its program (if any)."""
    return "rate" if control.op == ControlOp.SET_PERIOD else control.program
