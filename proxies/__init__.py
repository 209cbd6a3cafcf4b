"""One long-running proxy per sensor: demand, program choice, control while listening.

- `proxies.demand`: what one sensor must deliver, from the queries' planner Demands (pure).
- `proxies.demand_index`: which queries concern which sensor, kept per change (pure).
- `proxies.choice`: which firmware program and rate, by the firmware_sim cost model (pure).
- `proxies.proxy`: `SensorProxy`, the per-sensor sans-IO state machine, composed of
  `proxies.tuples` (messages -> tuples), `proxies.control` (the control channel),
  `proxies.liveness` (online/offline) and `proxies.energy` (the energy estimator).
- `proxies.pair`: `PairJoin`, vehicles from a loop pair's two proxies.
- `proxies.manager`: `ProxyManager`, the asyncio service between transports and the Fjord.
"""

from proxies.manager import ProxyManager
from proxies.proxy import SensorProxy

__all__ = ["ProxyManager", "SensorProxy"]
