"""The control channel (proxies/control.py) on its own: a sans-IO state machine."""

from __future__ import annotations

from proxies.control import (
    Acked,
    ControlChannel,
    ControlState,
    GiveUp,
    Refused,
    Send,
    Superseded,
    UnknownAck,
)
from sensors.protocol import Ack, Control


def ack(seq: int, ok: bool = True) -> Ack:
    return Ack(sensor_id="s", ack_seq=seq, ok=ok, error="" if ok else "no")


def test_queued_sent_acked() -> None:
    ch = ControlChannel(retry_windows=2, max_sends=3, retry_after_s=1.0)
    assert ch.want([Control.wake("s"), Control.set_period("s", 1000.0)]) == []
    wake, period = (p.control for p in ch.pending)
    assert wake.seq != period.seq and all(p.state is ControlState.QUEUED for p in ch.pending)
    assert ch.window(wall=0.0) == [Send(wake, 1, False), Send(period, 1, False)]
    assert all(p.state is ControlState.SENT for p in ch.pending)
    assert ch.ack(ack(wake.seq)) == [Acked(wake, 1)]
    assert ch.ack(ack(wake.seq)) == [UnknownAck(wake.seq)]  # a retry's second ack
    assert ch.ack(ack(period.seq, ok=False)) == [Refused(period, "no")]
    assert ch.pending == []


def test_retry_needs_windows_and_wall_time_then_gives_up() -> None:
    ch = ControlChannel(retry_windows=2, max_sends=2, retry_after_s=1.0)
    ch.want([Control.wake("s")])
    (wake,) = (p.control for p in ch.pending)
    assert ch.window(wall=0.0) == [Send(wake, 1, False)]
    assert ch.window(wall=0.1) == [] and ch.window(wall=0.2) == []  # windows, not the time
    assert ch.window(wall=5.0) == [Send(wake, 4, True)]
    assert ch.window(wall=5.5) == [] and ch.window(wall=5.9) == []
    (given,) = ch.window(wall=6.5)
    assert isinstance(given, GiveUp) and given.control == wake and ch.pending == []
    # Without a wall clock: windows alone.
    ch.want([Control.wake("s")])
    assert len(ch.window()) == 1 and ch.window() == [] and len(ch.window()) == 1


def test_supersede_keeps_what_is_still_wanted_and_restart_requeues() -> None:
    ch = ControlChannel()
    ch.want([Control.sleep("s", 30_000.0)])
    (sleep,) = (p.control for p in ch.pending)
    ch.window(wall=0.0)
    assert ch.want([Control.sleep("s", 30_000.0)]) == []  # the same: kept, same seq
    assert ch.pending[0].control.seq == sleep.seq and ch.pending[0].sends == 1
    (sup,) = ch.want([Control.wake("s")])
    assert sup == Superseded((sleep,)) and [p.control.op for p in ch.pending] == ["wake"]
    ch.window(wall=0.0)
    ch.restart()  # a rebooted mote lost what it had not acked
    assert ch.pending[0].state is ControlState.QUEUED
    (again,) = ch.window(wall=0.0)
    assert isinstance(again, Send) and again.retry
