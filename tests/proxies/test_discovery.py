"""Discovery (sans-IO): data before a hello is held, bounded, and the sensor is asked in its
receive windows, not more often than `ask_every_s`."""

from __future__ import annotations

from proxies.discovery import Discovery
from sensors.protocol import ControlOp, Listen, Samples


def samples(sid: str, seq: int, listen: float | None = None) -> Samples:
    return Samples(sensor_id=sid, seq=seq, times=(float(seq),), rows=((1.0,),), listen_ms=listen)


def test_held_in_order_and_asked_only_while_listening() -> None:
    d = Discovery(ask_every_s=1.0)
    assert d.hold("a", samples("a", 0), now=0.0) is None  # not listening: no point asking
    req = d.hold("a", samples("a", 1, listen=20), now=0.1)
    assert req is not None and req.op == ControlOp.HELLO and req.sensor_id == "a"
    assert d.hold("a", Listen(sensor_id="a", seq=2, duration_ms=20), now=0.5) is None  # just asked
    assert d.hold("a", Listen(sensor_id="a", seq=3, duration_ms=20), now=1.2) is not None
    assert [m.seq for m in d.release("a")] == [0, 1]  # listens are not data
    assert d.release("a") == [] and len(d) == 0
    assert d.stats.hello_requests == 2 and d.stats.released == 2


def test_bounds_are_counted() -> None:
    d = Discovery(max_sensors=2, max_messages=3)
    for i in range(5):
        d.hold("a", samples("a", i), now=0)
    assert [m.seq for m in d.release("a")] == [2, 3, 4]
    assert d.stats.dropped_buffer_full == 2
    d.hold("x", samples("x", 0), now=0)
    d.hold("y", samples("y", 0), now=0)
    d.hold("z", samples("z", 0), now=0)  # the longest-unknown (x) makes room
    assert set(d.pending()) == {"y", "z"}
    assert d.stats.dropped_too_many_unknown == 1
