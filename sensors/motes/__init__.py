"""Simulated motes: firmware_sim programs over a reading source, behind any transport link.

- :class:`~sensors.motes.mote.SimulatedMote`: one mote (program, energy account, clock, faults).
- :class:`~sensors.motes.pair.TrafficPair`: the paper's loop-detector pair (section 5.1).
- :class:`~sensors.motes.replay.TraceReplayFleet`: one mote per METR-LA station.
- :mod:`~sensors.motes.faults`: loss, garbling, delay/reorder, clock skew, offline spells.
"""

from sensors.motes.faults import FaultConfig, FaultInjector, MoteClock
from sensors.motes.mote import MoteStats, Pacer, SimulatedMote
from sensors.motes.pair import TrafficPair
from sensors.motes.replay import TraceReplayFleet, load_stations, load_trace

__all__ = [
    "FaultConfig",
    "FaultInjector",
    "MoteClock",
    "MoteStats",
    "Pacer",
    "SimulatedMote",
    "TraceReplayFleet",
    "TrafficPair",
    "load_stations",
    "load_trace",
]
