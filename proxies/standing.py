"""`StandingDemands`: the demands of consumers that are not the Fjord's queries, by name.

A sensor's program serves every consumer of its readings. The Fjord's queries are one kind; the
archive (every reading of its streams, kept for history and the Spark jobs) and a Spark query
(Spark reads the archive, so what the archive holds is what its SQL can see) are others. Their
owner names each one's demand here, one `Demand` per stream it reads, like a query's; the
fan-out folds them in with the queries' at each sync (`proxies.fanout.DemandFanOut`), so after
a change the owner tells the proxies as it does for a query (`ProxyManager.queries_changed`).
A name is the consumer's label where a sensor's consumers are listed (/sensors, EXPLAIN).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from fjords.demand import Demand

__all__ = ["StandingDemands"]


class StandingDemands(Mapping[str, tuple[Demand, ...]]):
    """Name -> demands, in the order they were first set. Reading it is a `Mapping`; only its
    owner changes it (`set`, `discard`)."""

    def __init__(self) -> None:
        self._by_name: dict[str, tuple[Demand, ...]] = {}

    def set(self, name: str, demands: Iterable[Demand]) -> None:
        """`name` now demands `demands` (in place of what it demanded); none: nothing at all."""
        ds = tuple(demands)
        if not ds:
            self._by_name.pop(name, None)
        elif self._by_name.get(name) != ds:
            self._by_name[name] = ds

    def discard(self, name: str) -> None:
        self._by_name.pop(name, None)

    def __getitem__(self, name: str) -> tuple[Demand, ...]:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)
