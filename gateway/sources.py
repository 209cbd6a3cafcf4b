"""What feeds the gateway's streams, from its configuration: transports, proxies, simulated fleets.

The sensor proxies (proxies/) sit between every transport and the Fjord; `configure_sources`
registers one source task per configured transport or simulated fleet on the Gateway.
"""

from __future__ import annotations

import logging

from gateway.daemon import Gateway

log = logging.getLogger("gateway.sources")


def configure_sources(gw: Gateway) -> None:
    """Attach the configured transports and simulated fleets (none yet: the proxies land next)."""
    cfg = gw.config
    if cfg.simulation is None and cfg.mqtt is None and not cfg.serial and cfg.trace is None:
        log.warning("no sensors configured: the gateway serves queries but has no data")
