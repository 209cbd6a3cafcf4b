"""The `/sensors` JSON: one entry per sensor, rendered from its proxy (what it runs, what its
queries want, its power and battery estimates, its counters) and its stream's clock checks.

`consumers` names everyone the sensor samples for: the queries (either engine) and the
archive (`"archive"`, gateway.archive.CONSUMER); `queries` only the queries among them.

The proxies hold the state; how the HTTP API shows it is the gateway's concern, here."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from proxies.control import thaw

if TYPE_CHECKING:
    from proxies.manager import ProxyManager
    from proxies.proxy import SensorProxy

__all__ = ["sensor_entry", "sensors_catalog"]


def sensor_entry(proxy: SensorProxy, now: float | None = None) -> dict[str, Any]:
    """One sensor's entry for GET /sensors (JSON-able); `now` brings its energy up to date."""
    if now is not None:
        proxy._account(now)
    choice = proxy.choice
    b = proxy.believed
    energy = proxy.energy
    return {
        "id": proxy.sensor_id,
        "stream": proxy.stream,
        "kind": proxy.kind,
        "schema": [[f.name, f.type] for f in proxy.schema.fields],
        "attributes": dict(proxy.attributes),
        "capabilities": list(proxy.capabilities),
        "status": proxy.status,
        "program": b.program,
        "params": None if b.params is None else thaw(b.params),
        "sample_rate_hz": b.rate_hz,
        "wanted": None
        if choice is None
        else {
            "program": choice.program,
            "params": choice.params,
            "sample_rate_hz": choice.rate_hz,
            "reason": choice.reason,
            "lifetime_met": choice.lifetime_met,
        },
        "consumers": list(proxy.demand.queries),
        "queries": list(proxy.demand.queries),
        "pending_controls": [str(p.control.op) for p in proxy.pending],
        "power_mw_estimate": energy.power_mw,
        "energy_j_estimate": energy.energy_j,
        "battery_estimate": energy.battery_left(proxy.battery_reported),
        "lifetime_days_estimate": energy.lifetime_days(),
        "listen_ms_per_s": energy.listen_ms_per_s,
        "wake_check_s": proxy.sleep_s,
        "counters": {k: getattr(proxy.stats, k) for k in proxy.stats.__slots__},
        "errors": list(proxy.errors),
    }


def sensors_catalog(
    manager: ProxyManager, *, is_query: Callable[[str], bool] | None = None
) -> list[dict[str, Any]]:
    """Every sensor's entry, sorted by id, with its clock checks (`clock_rejects`,
    `clock_suspect`, offsets) from the stream's progress, and whether it takes controls
    (`programmable`: a plain device does not). `is_query` tells the queries among the
    consumers (default: all of them are)."""
    now = manager.now()
    out = []
    for k in sorted(manager.proxies):
        proxy = manager.proxies[k]
        entry = sensor_entry(proxy, now)
        if is_query is not None:
            entry["queries"] = [c for c in entry["consumers"] if is_query(c)]
        entry.update(manager.clock_report(proxy))
        entry["programmable"] = manager.programmable(k)
        if not entry["programmable"]:
            entry["wanted"] = None  # nothing is ever asked of it
        out.append(entry)
    return out
