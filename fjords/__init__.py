"""The Fjords query runtime: operators as state machines, push and pull queues, one scheduler.

Sensor proxies push tuples into a shared stream; every continuous query over that stream is
folded into one running plan (the Fjord), so each sample is allocated once and all simple
predicates are evaluated together through a predicate index.
"""


def version() -> str:
    """The installed distribution's version (`unknown` when run from an uninstalled tree), for
    every CLI's `--version`."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("fjords-gateway")
    except PackageNotFoundError:
        return "unknown"
