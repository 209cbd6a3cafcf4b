"""Every place the gateway can lose data, under one metric family.

`fjords_dropped_total{stage, reason}` counts what each bounded buffer or check on the way from a
transport to a result client gave up: the transports' inboxes and bad packets, data held for
sensors without a hello, the proxies' outbox and duplicate filter, the clock check, the stream's
queue and late samples, the queries' queues and sinks, the archive, slow result clients, and the result sinks
(webhooks, files, MQTT). The counters live where the drops happen (nothing here is on a hot path); `DropWatch` reads them
all, logs the first drop of each kind, and names the kinds still increasing for /healthz, which
then says `degraded` (HTTP 200: a daemon that sheds load is alive, not broken).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.daemon import Gateway

log = logging.getLogger("gateway.drops")

Key = tuple[str, str]  # (stage, reason)


def drop_counts(gw: Gateway) -> dict[Key, int]:
    """Every drop counter the gateway has, by (stage, reason); all only ever grow."""
    out: dict[Key, int] = {}

    def add(stage: str, reason: str, n: int) -> None:
        if n:
            out[stage, reason] = out.get((stage, reason), 0) + int(n)

    for link in gw.links:
        st = link.stats
        stage = f"transport:{link.name}"
        add(stage, "queue_full", st.dropped_queue_full)
        add(stage, "client_queue_full", getattr(st, "dropped_client_queue", 0))
        add(stage, "sequence_gap", getattr(st, "seq_gaps", 0))
        for reason, n in getattr(st, "bad", {}).items():
            add(stage, f"bad_{reason}", n)
        more = getattr(link, "drop_counts", None)  # a link's own stages (plain MQTT payloads)
        if more is not None:
            for (stage_, reason), n in more().items():
                add(stage_, reason, n)
    pm = gw.proxies
    if pm is not None:
        d = pm.discovery.stats
        add("before_hello", "buffer_full", d.dropped_buffer_full)
        add("before_hello", "too_many_unknown_sensors", d.dropped_too_many_unknown)
        add("before_hello", "hello_refused", pm.stats.no_proxy)
        add("before_hello", "forgotten", getattr(d, "dropped_forgotten", 0))
        add("sensors", "new_id_rate", getattr(pm.stats, "new_id_rate", 0))
        add("proxies", "outbox_full", pm.stats.outbox_drops)
        add("proxies", "catalog_full", pm.stats.catalog_full)
        add("proxies", "oversize_hello", pm.stats.oversize_hellos)
        for proxy in pm.proxies.values():
            ps = proxy.stats
            add("proxies", "duplicate", ps.duplicates)
            add("proxies", "out_of_order", ps.out_of_order)
            add("proxies", "bad_message", ps.bad)
            add("proxies", "clock_rejected", getattr(ps, "clock_rejects", 0))
    stats = gw.fjord.stats()
    for name, s in stats["streams"].items():
        add(f"stream:{name}", "queue_full", s["queue_drops"])
        add(f"stream:{name}", "late", s["late"])
        add(f"stream:{name}", "clock_rejected", s.get("clock_rejects", 0))
    for q in stats["queries"].values():
        add("queries", "queue_full", q["queue_drops"])
        add("queries", "sink_full", q["dropped_results"])
        add("queries", "union_out_of_order", q.get("merge_drops", 0))  # UNION ALL's merge
        add("queries", "changes_late", q.get("changes_late", 0))  # EMIT CHANGES
        join = q.get("join")  # a stream-stream join: a full side, tuples of closed windows
        if join is not None:
            add("queries", "join_full", join["dropped"])
            add("queries", "join_late", join["late"])
    add("queries", "operator_error", stats.get("operator_errors", 0))
    for archive in getattr(gw, "archives", {}).values():
        st = archive.stats()
        add("archive", "queue_full", st["rows_dropped"])
        add("archive", "unwritten_at_shutdown", st["rows_unwritten"])
    add("result_clients", "buffer_full", gw.hub.missed_total)
    sinks = getattr(gw, "sinks", None)
    if sinks is not None:  # result sinks: stage sink_webhook / sink_file / sink_mqtt
        for (stage, reason), n in sinks.drop_counts().items():
            add(stage, reason, n)
    return out


class DropWatch:
    """Logs the first drop of each kind, and tells which kinds grew in the last `window_s`."""

    def __init__(
        self,
        counts: Callable[[], dict[Key, int]],
        window_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.counts = counts
        self.window_s = window_s
        self.clock = clock
        # Counting starts at zero: drops before the first look are growth too.
        self._history: deque[tuple[float, dict[Key, int]]] = deque([(clock(), {})])
        self._logged: set[Key] = set()

    def check(self) -> dict[Key, int]:
        """Read the counters now (the daemon calls this every few seconds and on /healthz);
        returns what grew within the window: kind -> how many."""
        now, counts = self.clock(), self.counts()
        for key, n in counts.items():
            if key not in self._logged:
                self._logged.add(key)
                log.warning(
                    "dropping data: %s (%s), %d so far; logged once, counted in "
                    "fjords_dropped_total{stage=%r, reason=%r}",
                    key[0], key[1], n, key[0], key[1],
                )  # fmt: skip
        hist = self._history
        if len(hist) > 1 and now - hist[-1][0] < 1.0:
            hist[-1] = (hist[-1][0], counts)  # at most one snapshot a second, however often asked
        else:
            hist.append((now, counts))
        while len(hist) > 1 and hist[1][0] <= now - self.window_s:
            hist.popleft()
        base = hist[0][1]
        return {k: n - base.get(k, 0) for k, n in counts.items() if n > base.get(k, 0)}

    def health(self) -> list[str]:
        grew = self.check()
        return [
            f"dropping data: {stage} {reason} (+{n} in the last {self.window_s:g} s)"
            for (stage, reason), n in sorted(grew.items())
        ]


async def watch_drops(watch: DropWatch, every_s: float = 5.0) -> None:
    """The daemon's ticker: the first drop of a kind is logged within `every_s`."""
    import asyncio

    while True:
        watch.check()
        await asyncio.sleep(every_s)
