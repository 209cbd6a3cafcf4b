"""Shared pieces of the proxy tests: stream schemas, a Fjord, an in-process hub for controls."""

from __future__ import annotations

from fjords.runtime.fjord import Fjord
from fjords.schema import Field, Schema
from sensors.protocol import Control, Hello, encode_message
from sensors.transports.base import TransportClosed, TransportUnavailable
from sensors.transports.inprocess import InProcessHub

TRAFFIC = Schema(
    [
        Field("time", "float"),
        Field("station", "str"),
        Field("speed", "float"),
        Field("latitude", "float"),
        Field("longitude", "float"),
        Field("segment", "str"),
    ],
    time="time",
)
VEHICLES = Schema(
    [
        Field("time", "float"),
        Field("pair", "str"),
        Field("speed", "float"),
        Field("length", "float"),
    ],
    time="time",
)


def traffic_hello(i: int, segment: int) -> Hello:
    """Station `s{i}` of segment `S{segment}`, a scalar speed sensor that takes every program."""
    return Hello(
        sensor_id=f"s{i}",
        schema=(("speed", "float"),),
        programs=("raw", "filter", "aggregate"),
        program="raw",
        sample_period_ms=300_000.0,
        attributes={"station": f"s{i}", "segment": f"S{segment}"},
    )


def make_fjord(**streams: Schema) -> Fjord:
    # No bound on how far a sensor may lag: replay tasks interleave arbitrarily, and results
    # must not depend on it.
    fjord = Fjord(max_lag=1e12)
    for name, schema in streams.items():
        field = "pair" if "pair" in schema else "station" if "station" in schema else "sensor"
        fjord.add_stream(name, schema, sensor_field=field)
    return fjord


class ControlHub(InProcessHub):
    """The in-process hub, except that controls reach the mote without a decode round trip.

    sensors.protocol types Control.params as dict[str, Scalar], so the `filter` program's
    ranges (a list of [lo, hi]) encode but do not decode; until the protocol allows lists,
    this hub still encodes every control (so it must be valid msgpack) and hands the mote the
    object itself.
    """

    async def send(self, sensor_id: str, msg: Control) -> None:
        if not self.running:
            raise TransportClosed("send() outside `async with`")
        link = self._links.get(sensor_id)
        if link is None or not link.online:
            raise TransportUnavailable(f"no mote {sensor_id!r} attached")
        encode_message(msg)
        link.inbox.put(msg)
        self.stats.sent += 1
