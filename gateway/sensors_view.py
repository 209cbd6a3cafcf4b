"""The `/sensors` JSON: one entry per sensor, rendered from its proxy (what it runs, what its
queries want, its power and battery estimates, its counters) and its stream's clock checks.

`consumers` names everyone the sensor samples for: the queries (either engine) and the
archive (`"archive"`, gateway.archive.CONSUMER); `queries` only the queries among them.

`status` is `online`, `asleep`, `stalled` (its data stopped while the program the gateway gave
it should send: proxies.stall; `stall` says since when and why) or `offline`.

The catalog can hold thousands of sensors: `sensors_page` renders only the page asked for
(sorted by id, `limit` and `offset`), with the total.

The proxies hold the state; how the HTTP API shows it is the gateway's concern, here."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from proxies.control import thaw

if TYPE_CHECKING:
    from proxies.manager import ProxyManager
    from proxies.proxy import SensorProxy

__all__ = [
    "DEFAULT_PAGE",
    "MAX_PAGE",
    "catalog_entry",
    "sensor_entry",
    "sensors_catalog",
    "sensors_page",
]

#: sensors in one page of GET /sensors unless ?limit= says otherwise, and the most it may say
DEFAULT_PAGE = 500
MAX_PAGE = 10_000


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
        "stall": None
        if not proxy.stall.stalled
        else {"since": proxy.stall.since, "why": proxy.stall.why},
        "stalls": proxy.stall.spells,
        "owed_data_gap_s": proxy.stall.gap,
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
    return [_entry(manager, k, manager.now(), is_query) for k in sorted(manager.proxies)]


def sensors_page(
    manager: ProxyManager,
    *,
    limit: int = DEFAULT_PAGE,
    offset: int = 0,
    status: str | None = None,
    is_query: Callable[[str], bool] | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """The entries of `limit` sensors from `offset` (by id; only those with `status` if
    given), and how many there are in all: only the page is rendered."""
    proxies = manager.proxies
    ids = sorted(
        proxies if status is None else (k for k, p in proxies.items() if p.status == status)
    )
    now = manager.now()
    page = [_entry(manager, k, now, is_query) for k in ids[offset : offset + limit]]
    return page, len(ids)


def catalog_entry(
    manager: ProxyManager, sensor_id: str, *, is_query: Callable[[str], bool] | None = None
) -> dict[str, Any]:
    """One sensor's entry, as in the catalog."""
    return _entry(manager, sensor_id, manager.now(), is_query)


def _entry(
    manager: ProxyManager, k: str, now: float, is_query: Callable[[str], bool] | None
) -> dict[str, Any]:
    proxy = manager.proxies[k]
    entry = sensor_entry(proxy, now)
    if is_query is not None:
        entry["queries"] = [c for c in entry["consumers"] if is_query(c)]
    entry.update(manager.clock_report(proxy))
    entry["programmable"] = manager.programmable(k)
    if not entry["programmable"]:
        entry["wanted"] = None  # nothing is ever asked of it
    return entry
