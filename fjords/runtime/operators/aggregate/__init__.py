"""Windowed aggregates: COUNT, SUM, AVG, MIN, MAX over time (RANGE/SLIDE) or row (ROWS) windows.

Incremental, by panes: the timeline is cut into panes of gcd(range, slide); each tuple updates one
partial (rows, and count/sum/min/max per aggregated expression) of its pane and group; a window is
the merge of its range/pane panes. Tumbling windows (slide == range) are single panes. Windows
start at multiples of the slide since the epoch (event time) and close when the stream's watermark
passes their end; only windows holding data are emitted.

`WindowAggregate` emits either finished rows (through `finalize`, which applies HAVING and the
SELECT list) or partial rows for a later `GroupMerge` (how a windowed aggregate is joined with a
static table: aggregate by the join key first, join the few partial rows, then regroup).

A reading may be a `fjords.partial.Partial` (a mote's pre-aggregated window, pushed by its
proxy): it is merged into the state as the `count` rows it stands for.

Fast paths beside the general one, each property-tested to give its rows exactly
(tests/fjords/test_fused.py, test_window_batch.py): `_add_columns` (one plain group column and
one aggregated column, fields read by index), `_close_tumbling` (a fused tumbling window: the
windows one watermark closes go out in one call) and `_add_dense` (COUNT/SUM/AVG of a float
column over large deliveries, such as `python -m fjords`' chunks: numpy arrays per pane).
"""

from fjords.runtime.operators.aggregate.merge import Finish, GroupMerge, RollupFinish
from fjords.runtime.operators.aggregate.pane_state import FanOut
from fjords.runtime.operators.aggregate.state import (
    FUNCS,
    AggSpec,
    BatchFinalize,
    Finalize,
    finish,
    finished_rows,
    finisher,
    merge_state,
    new_state,
    put_finished,
)
from fjords.runtime.operators.aggregate.window import WindowAggregate

__all__ = [
    "FUNCS",
    "AggSpec",
    "BatchFinalize",
    "FanOut",
    "Finalize",
    "Finish",
    "GroupMerge",
    "RollupFinish",
    "WindowAggregate",
    "finish",
    "finished_rows",
    "finisher",
    "merge_state",
    "new_state",
    "put_finished",
]
