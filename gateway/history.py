"""The gateway's histories: one transient segment per stream (fjords.runtime.history), fed by
the stream's router like any consumer of the whole stream, late readings included."""

from __future__ import annotations

from fjords.runtime.fjord import Fjord
from fjords.runtime.history import HistoricalSource, History
from gateway.config import HistoryConfig

#: The traffic stream's columns that a sensor's hello fixes: its history's keys.
TRAFFIC_STATIC = ("station", "latitude", "longitude", "segment")


def make_histories(
    fjord: Fjord, config: HistoryConfig, older: HistoricalSource | None = None
) -> dict[str, History]:
    """A history per stream of `fjord`, each a consumer of its stream (none with keep_s 0);
    `older` (the archive) holds what they no longer do."""
    if config.keep_s <= 0:
        return {}
    out = {}
    for name, stream in fjord.streams.items():
        history = History(
            name,
            stream.info.schema,
            keep_s=config.keep_s,
            max_rows=config.max_rows,
            bucket_s=config.bucket_s,
            static=TRAFFIC_STATIC if name == "traffic" else None,
        )
        fjord.keep_history(name, history, older)
        out[name] = history
    return out
