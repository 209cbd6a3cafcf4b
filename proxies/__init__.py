"""One long-running proxy per sensor: demand, program choice, control while listening.

Per sensor (sans-IO, no clock of their own):

- `proxies.proxy`: `SensorProxy`, the per-sensor state machine, composed of
  `proxies.layout` (where readings go in the stream's tuples), `proxies.tuples` (messages ->
  tuples), `proxies.control` (the control channel), `proxies.refusals` (what the mote will not
  do), `proxies.liveness` (online/offline) and `proxies.energy` (the energy estimator).
- `proxies.demand`: what one sensor must deliver, from the queries' Demands (pure).
- `proxies.choice`: which firmware program and rate, by the firmware_sim cost model (pure).
- `proxies.pair`: `PairJoin`, vehicles from a loop pair's two proxies.
- `proxies.discovery`: the data of sensors heard before their hello.
- `proxies.actions`: what a proxy answers with (pushes, controls) and its counters.

Every sensor, between the transports and the Fjord:

- `proxies.manager`: `ProxyManager`, the asyncio service, a composition of:
- `proxies.intake`: the transports' messages to their proxies.
- `proxies.registry`: the catalog of sensors (who joins, who is forgotten).
- `proxies.demand_index` and `proxies.fanout`: which queries concern which sensor, and
  carrying their demand to the proxies.
- `proxies.standing`: the demands of consumers other than the Fjord's queries (the archive,
  a Spark query), named by their owner.
- `proxies.outbox`: pushes into the Fjord, controls to the sensors.
- `proxies.clock`: "now", and the future bound on readings' times.
- `proxies.stats`: the manager's counters.
"""

from proxies.manager import ProxyManager
from proxies.proxy import SensorProxy

__all__ = ["ProxyManager", "SensorProxy"]
