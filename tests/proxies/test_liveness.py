"""Liveness per sensor: stream time, driven by the fastest sensors, is not silence for a slower
one (an embedded loop pair at 1x beside a fleet replayed 60x must not go offline after its first
sleep). A sensor is offline only when silent on the caller's clock and, at its own pace, on the
wall clock too."""

from __future__ import annotations

import math

import pytest

from proxies.demand import SensorDemand
from proxies.liveness import PACE_MESSAGES, Liveness
from proxies.proxy import SendControl, SensorProxy
from sensors.protocol import Ack, ControlOp, Hello, Listen, Samples
from tests.proxies.helpers import TRAFFIC

EPOCH = 1_790_000_000.0
SPEEDUP = 60.0  # the generated fleet's replay speed (the embedded defaults)
FLEET_PERIOD_S = 300.0  # its readings, one per message


def hello(sid: str, period_ms: float) -> Hello:
    return Hello(
        sensor_id=sid,
        schema=(("speed", "float"),),
        programs=("aggregate", "deadband", "filter", "raw"),
        program="raw",
        sample_period_ms=period_ms,
        battery=1.0,
        attributes={"station": sid, "segment": "S1", "latitude": 34.0, "longitude": -118.0},
    )


def sample(sid: str, t: float, listen_ms: float | None = None) -> Samples:
    return Samples(sensor_id=sid, times=(t,), rows=((60.0,),), listen_ms=listen_ms)


class TwoPaces:
    """A fleet sensor replayed 60x and a real-time sensor that is put to sleep at once (no
    query needs it), behind one caller's clock as the manager keeps it: stream time, the
    latest reading's time any sensor sent."""

    def __init__(self, *, with_wall: bool, sleep_s: float = 30.0) -> None:
        self.with_wall = with_wall
        self.sleep_s = sleep_s
        self.now = EPOCH
        self.fast = self._proxy("fleet", FLEET_PERIOD_S * 1000.0)
        self.slow = self._proxy("pair", 1000.0 / 180.0)
        self.slow.set_demand(SensorDemand(), now=self.now)  # unneeded: sleep
        self.fast.set_demand(SensorDemand(("q",)), now=self.now)
        self.wall = 0.0

    def _proxy(self, sid: str, period_ms: float) -> SensorProxy:
        return SensorProxy(
            hello(sid, period_ms),
            stream="traffic",
            schema=TRAFFIC,
            sensor_field="station",
            now=self.now,
            sleep_s=self.sleep_s,
            wall=0.0 if self.with_wall else None,
        )

    def send(self, p: SensorProxy, msg: object, t: float | None = None) -> list:
        if t is not None:
            self.now = max(self.now, t)
        return p.on_message(msg, self.now, wall=self.wall if self.with_wall else None)  # type: ignore[arg-type]

    def tick(self) -> None:
        for p in (self.fast, self.slow):
            p.tick(self.now, wall=self.wall if self.with_wall else None)

    def run(self, until_s: float, *, fast: bool = True, slow: bool = True) -> None:
        """Advance the wall clock to `until_s` in half seconds: the fleet sends a reading every
        5 s (300 s of its time), the sleeping sensor listens every sleep_s with its clock."""
        while self.wall < until_s:
            self.wall = round(self.wall + 0.5, 6)
            if fast and self.wall % (FLEET_PERIOD_S / SPEEDUP) == 0:
                t = EPOCH + self.wall * SPEEDUP
                self.send(self.fast, sample("fleet", t), t)
            if slow and self.wall % self.sleep_s == 0:
                self.send(self.slow, Listen(sensor_id="pair", duration_ms=20.0, time=self.wall))
            self.tick()

    def put_slow_to_sleep(self) -> None:
        """One timed message (its only one before the sleep is acked), then the ack."""
        self.wall = 1.0
        out = self.send(self.slow, sample("pair", 1.0, listen_ms=20.0))
        (sleep,) = [a.control for a in out if isinstance(a, SendControl)]
        assert sleep.op == ControlOp.SLEEP
        self.wall = 2.0
        self.send(self.slow, Ack(sensor_id="pair", ack_seq=sleep.seq))
        assert self.slow.status == "asleep"


def test_a_real_time_sensor_asleep_beside_a_60x_fleet_never_goes_offline() -> None:
    world = TwoPaces(with_wall=True)
    world.put_slow_to_sleep()
    world.run(600.0)  # ten minutes of wall clock, ten hours of stream time
    assert world.slow.stats.offline_spells == 0 and world.slow.status == "asleep"
    assert world.slow.liveness.pace() == pytest.approx(1.0)
    assert world.fast.stats.offline_spells == 0 and world.fast.status == "online"
    assert world.fast.liveness.pace() == pytest.approx(SPEEDUP)
    # Truly silent (its listens stop): offline after offline_after wake checks of wall clock
    # at its own pace (3 x 30 s), not after 3 x 30 s of the fleet's stream time.
    quiet_from = world.wall
    world.run(quiet_from + 3 * world.sleep_s - 1.0, slow=False)
    assert world.slow.status == "asleep"
    world.run(quiet_from + 3 * world.sleep_s + 31.0, slow=False)
    assert world.slow.status == "offline" and world.slow.stats.offline_spells == 1
    assert world.fast.status == "online"
    # It listens again: back, asleep.
    world.run(world.wall + world.sleep_s)
    assert world.slow.status == "asleep" and world.slow.stats.offline_spells == 1


def test_the_fast_sensor_still_goes_offline_by_its_own_pace() -> None:
    world = TwoPaces(with_wall=True)
    world.put_slow_to_sleep()
    world.run(120.0)
    quiet_from = world.wall
    # Its limit: 3 raw packets of 300 s periods = 7,200 s of its time = 120 s of wall clock at
    # 60x; stream time does not move meanwhile (the other sensor is slower), so the caller's
    # clock alone would never see it silent: the slow sensor's listens carry its own clock.
    world.run(quiet_from + 100.0, fast=False)
    assert world.fast.status == "online"
    world.now += 3 * 8 * FLEET_PERIOD_S + 1  # (stream time moved on: e.g. other fleet sensors)
    world.run(quiet_from + 119.0, fast=False)
    # (Its data stopped while it runs raw: stalled, after 3 of its periods; not yet offline.)
    assert world.fast.online and world.fast.status == "stalled"
    world.run(quiet_from + 122.0, fast=False)
    assert world.fast.status == "offline" and world.fast.stats.offline_spells == 1
    assert world.slow.stats.offline_spells == 0


def test_without_a_wall_clock_stream_time_alone_decides() -> None:
    """The caller's clock alone (a sans-IO caller with no wall clock): the fleet's 60x stream
    time makes the sleeping real-time sensor look silent (what the wall clock prevents)."""
    world = TwoPaces(with_wall=False)
    world.put_slow_to_sleep()
    world.run(60.0)
    assert world.slow.stats.offline_spells >= 1


def test_pace_is_unknown_until_a_few_timed_messages_then_own_seconds_per_wall_second() -> None:
    live = Liveness(0.0, 3.0, wall=100.0)
    for k in range(PACE_MESSAGES):
        assert live.pace() is None
        live.heard(float(k), first=k == 0, wall=100.0 + k / 10)
        live.timed(1000.0 + k, 100.0 + k / 10)
    assert live.pace() == pytest.approx(10.0)
    live.timed(999.0, 200.0)  # not later than its latest: ignored
    assert live.pace() == pytest.approx(10.0) and live.own_gaps == [1.0, 1.0, 1.0]
    assert live.wall_limit(30.0) == pytest.approx(3.0)
    # All at once (a replay as fast as it goes): the wall says nothing, stream time decides.
    burst = Liveness(0.0, 3.0, wall=0.0)
    for k in range(PACE_MESSAGES):
        burst.timed(float(k), 5.0)
    assert burst.pace() == math.inf and burst.wall_limit(30.0) == 0.0
    # Unknown pace: taken as real time, and never less than offline_after x unknown_pace_s.
    new = Liveness(0.0, 3.0, wall=0.0, unknown_pace_s=2.0)
    assert new.wall_limit(0.1) == 6.0 and new.wall_limit(90.0) == 90.0


def test_offline_needs_silence_on_both_clocks() -> None:
    live = Liveness(0.0, 3.0, wall=0.0)
    live.heard(10.0, first=True, wall=1.0)
    assert live.check(1000.0, 30.0, wall=5.0, own_limit=30.0) is None  # stream ran ahead
    assert live.online
    why = live.check(1000.0, 30.0, wall=32.0, own_limit=30.0)
    assert why is not None and "wall clock" in why and not live.online
    # No wall clock given: the caller's clock alone decides.
    solo = Liveness(0.0, 3.0)
    assert solo.check(31.0, 30.0) == "silent for 31 s"
