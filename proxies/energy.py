"""A sensor's energy, estimated by its proxy on the sensor's own clock (sans-IO).

The estimate runs from the sensor's first reading's time (not from the gateway's time before any
reading arrived) at the power the cost model predicts for what the sensor is believed to run
(asleep: idle plus its receive windows); an awake mote's receive windows are counted one by one
as it announces them. Past its latest reading the clock runs at the caller's pace: awake, for at
most `cap_s` (a few expected message gaps), so a caller's clock driven by another fleet's epoch
never charges a replayed trace's sensor for the years between; asleep, without a cap.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

from firmware_sim.energy import Battery
from firmware_sim.model import predict
from firmware_sim.profiles import resolve_profile

from proxies.control import thaw

__all__ = ["ASSUMED_LISTEN_MS", "ASSUMED_LISTEN_MS_PER_S", "Belief", "EnergyEstimator"]

#: Until two receive windows were seen, assume the paper's "few tens of ms per second".
ASSUMED_LISTEN_MS_PER_S = 20.0
ASSUMED_LISTEN_MS = 20.0  # a receive window's length until one was announced
#: The displayed power follows the measured receive time per second at most this often (per
#: proxy, seconds of the caller's wall clock): the cost model is the costliest step of a
#: proxy's message, and the measured average drifts slowly. A change of belief re-estimates at
#: once.
REESTIMATE_S = 1.0


class Belief(Protocol):
    """What the proxy believes the mote runs."""

    program: str | None
    params: tuple | None
    rate_hz: float | None
    asleep: bool


class EnergyEstimator:
    """See the module docstring."""

    def __init__(
        self,
        profile: str,
        *,
        now: float,
        sleep_s: float,
        listen_ms_per_s: float | None = None,
    ) -> None:
        self.profile = profile
        self.sleep_s = sleep_s
        self.fixed_listen_ms_per_s = listen_ms_per_s
        self.battery = Battery.of(resolve_profile(profile))
        self.energy_j = 0.0
        self.power_mw = 0.0  # what it is believed to draw, receive windows included
        self._accrue_mw = 0.0  # the same without an awake mote's windows (counted one by one)
        self._since: float | None = None  # sensor time accounted up to
        self.own_last = -math.inf  # its latest reading's time
        self.now_at_own = now  # the caller's clock then
        self.own_first: tuple[float, float] | None = None  # (first reading's time, caller's now)
        self.listen_ms = ASSUMED_LISTEN_MS  # the latest receive window's length
        self._listen_ms_after_first = 0.0  # receive time per second = this / span of windows
        self._first_listen: float | None = None
        self._last_listen: float | None = None
        # (what `power_mw` was estimated for, when): `refresh` re-estimates at most once a second
        self._estimated: tuple[Any, float] | None = None

    # -- inputs ---------------------------------------------------------------------------------
    def reading(self, first: float, last: float, now: float, *, asleep: bool, cap_s: float) -> None:
        """A message with readings from `first` to `last` (sensor time) at the caller's `now`."""
        if self._since is None:
            self._since = first
            self.own_first = (first, now)
        else:
            self.account(now, asleep=asleep, cap_s=cap_s)
        self.own_last = max(self.own_last, first, last)
        self.now_at_own = now

    def window(self, listen_ms: float, now: float, *, asleep: bool, cap_s: float) -> None:
        """A receive window of `listen_ms` announced at the caller's `now`."""
        if listen_ms > 0:
            self.listen_ms = listen_ms
        self.account(now, asleep=asleep, cap_s=cap_s)
        if self._first_listen is None:
            self._first_listen = now
        else:
            self._listen_ms_after_first += listen_ms
        self._last_listen = now
        if not asleep and self._since is not None:
            # The receive time it announced: counted as it happens, not from an assumed rate.
            prof = resolve_profile(self.profile)
            self.energy_j += listen_ms / 1000.0 * prof.rx_mw * 1e-3

    def account(self, now: float, *, asleep: bool, cap_s: float) -> None:
        """Charge the believed power up to `now` on the sensor's own clock."""
        since = self._since
        if since is None:
            return
        past = max(0.0, now - self.now_at_own)
        if not asleep:
            # (by its program's declared gap: observed gaps include any jump of the caller's clock)
            past = min(past, cap_s)
        own = self.own_last + past
        if own > since:
            self.energy_j += self._accrue_mw * 1e-3 * (own - since)
            self._since = own

    def believe(self, belief: Belief) -> None:
        """What it runs changed (after `account` up to now): the power from here on."""
        self.power_mw = self.estimate(belief)
        self._accrue_mw = self.estimate(belief, windows=belief.asleep)
        self._estimated = None

    def refresh(self, belief: Belief, now: float) -> None:
        """`power_mw` after a receive window: re-estimated when what it is believed to run
        changed, else at most once per REESTIMATE_S of `now` (the caller's wall clock)."""
        b = belief
        key = (b.program, b.params, b.rate_hz, b.asleep, self.sleep_s, self.listen_ms)
        last = self._estimated
        if last is not None and last[0] == key and 0 <= now - last[1] < REESTIMATE_S:
            return
        self._estimated = (key, now)
        self.power_mw = self.estimate(b)

    # -- estimates -----------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        """Whether a reading started the sensor's clock."""
        return self._since is not None

    @property
    def listen_ms_per_s(self) -> float:
        if self.fixed_listen_ms_per_s is not None:
            return self.fixed_listen_ms_per_s
        if self._first_listen is None or self._last_listen is None:
            return ASSUMED_LISTEN_MS_PER_S
        span = self._last_listen - self._first_listen
        if span <= 0:
            return ASSUMED_LISTEN_MS_PER_S
        return self._listen_ms_after_first / span

    def pace_ratio(self) -> float:
        """How much faster the caller's clock has run than the sensor's (>= 1): a real-time
        mote beside a fleet replayed 60x faster listens every 30 s of its own, 30 min of the
        caller's."""
        if self.own_first is None:
            return 1.0
        own0, now0 = self.own_first
        own, caller = self.own_last - own0, self.now_at_own - now0
        if own <= 0 or caller <= 0:
            return 1.0
        return max(1.0, min(caller / own, 1e6))

    def estimate(self, belief: Belief, *, windows: bool = True) -> float:
        """The cost model's power for what it is believed to run; without `windows`, an awake
        mote's receive windows are left out (the energy estimate counts them as announced)."""
        b = belief
        prof = resolve_profile(self.profile)
        if b.asleep:
            # Idle, plus a receive window (announced by a bare `listen` packet) every sleep_s.
            window_j = (
                self.listen_ms / 1000.0 * prof.rx_mw * 1e-3
                + prof.packet_overhead_bits * prof.tx_joules_per_bit
            )
            return prof.cpu_idle_mw + window_j / max(self.sleep_s, 1e-3) * 1e3
        if not b.program or not b.rate_hz:
            return 0.0
        listen = min(1000.0, self.listen_ms_per_s) if windows else 0.0
        workload: dict[str, Any] = {"listen_ms_per_s": listen}
        params = thaw(b.params) if b.params else {}
        if b.program == "aggregate" and "window_ms" in params:
            workload["window_ms"] = float(params["window_ms"])
        if b.program == "count" and "period_ms" in params:
            workload["period_ms"] = float(params["period_ms"])
        try:
            return predict(b.program, b.rate_hz, self.profile, **workload).power_mw
        except ValueError:
            return 0.0

    def battery_left(self, reported: float | None) -> float | None:
        """The battery the sensor last reported, less what it spent since (estimated)."""
        if reported is None:
            return None
        return max(0.0, reported - self.energy_j / self.battery.capacity_j)

    def lifetime_days(self) -> float | None:
        if not self.power_mw:
            return None
        return self.battery.lifetime_s(self.power_mw) / 86_400.0
