"""A window of a shared aggregate goes out to its users in bounded steps
(`WindowFanOut.STEP_BUDGET`): one close for thousands of dashboards must not be one long
transition holding the event loop, and cutting it short must change no query's rows."""

from __future__ import annotations

from unittest.mock import patch

from hypothesis import given, settings

from fjords.engine import Engine
from fjords.runtime.fjord import Fjord
from fjords.runtime.operators.aggregate import WindowAggregate
from fjords.runtime.shared import WindowFanOut
from fjords.schema import Schema

from .test_group_filters import _case, _run

SCHEMA = Schema(
    [("time", "float"), ("station", "str"), ("speed", "float"), ("segment", "str")], time="time"
)


def _dashboards(n: int) -> tuple[Fjord, dict[str, list]]:
    f = Engine(Fjord())
    f.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    got: dict[str, list] = {}
    for i in range(n):
        rq = f.add_query(
            "SELECT segment, COUNT(*) AS n FROM traffic [RANGE 1 MINUTE] "
            f"WHERE segment IN ('S{i % 50}', 'S{(i + 1) % 50}') GROUP BY segment",
            query_id=f"q{i}",
        )
        rq.sink.add_batch_callback(got.setdefault(rq.id, []).extend)
    return f, got


def test_a_window_for_many_users_goes_out_over_several_transitions() -> None:
    f, got = _dashboards(600)
    (shared,) = f.fjord._shared.values()
    agg = shared.aggregate
    for t in (1.0, 61.0):  # two windows of every segment
        for k in range(50):
            f.fjord.push("traffic", (t, "s1", 5.0, f"S{k}"))
    f.fjord.push("traffic", (200.0, "s1", 5.0, "S0"))  # closes both
    steps, served = [], []
    real = WindowAggregate.transition

    def counted(self: WindowAggregate) -> bool:
        before = sum(map(len, got.values()))
        out = real(self)
        if self is agg:
            steps.append(1)
            served.append(sum(map(len, got.values())) - before)
        return out

    with patch.object(WindowAggregate, "transition", counted):
        f.fjord.run_until_idle()
    # one fan-out of both windows (a tumbling close hands them over at once): 600 users of
    # 2 segments x 2 windows, each user costing its rows + USER_COST of the budget
    per_user = 4 + WindowFanOut.USER_COST
    assert len(steps) >= 600 * per_user // WindowFanOut.STEP_BUDGET
    assert max(served) <= 4 * (WindowFanOut.STEP_BUDGET // per_user + 1)
    assert not shared.fanout.pending
    for i in range(600):  # every user: its two segments, the first window's rows first
        mine = sorted({f"S{i % 50}", f"S{(i + 1) % 50}"}, key=lambda s: int(s[1:]))
        rows = got[f"q{i}"]
        assert [(r[0], r[2]) for r in rows] == [(s, w) for w in (0.0, 60.0) for s in mine]


def test_a_user_leaving_during_a_fan_out_gets_nothing_more() -> None:
    f, got = _dashboards(400)
    (shared,) = f.fjord._shared.values()
    for k in range(50):
        f.fjord.push("traffic", (1.0, "s1", 5.0, f"S{k}"))
    f.fjord.push("traffic", (200.0, "s1", 5.0, "S0"))
    while not shared.fanout.pending:  # until the first window is part way out
        assert f.fjord.scheduler.step()
    waiting = [qid for qid in shared.fanout.users if not got[qid]]
    assert waiting
    gone = waiting[0]
    f.fjord.remove_query(gone)
    f.fjord.run_until_idle()
    assert got[gone] == []
    assert all(got[q] for q in shared.fanout.users)


@settings(max_examples=100, deadline=None)
@given(case=_case())
def test_fan_outs_cut_short_give_the_rows_as_written(
    case: tuple[list[str], list[int], list[tuple]],
) -> None:
    """The group-filter property (tests/fjords/test_group_filters.py) with a budget of a
    few rows: every window's fan-out is cut short, again and again."""
    queries, starts, rows = case
    expect, _ = _run(queries, starts, rows, share=False)
    with (
        patch.object(WindowFanOut, "STEP_BUDGET", 3),
        patch.object(WindowFanOut, "USER_COST", 1),
    ):
        got, _ = _run(queries, starts, rows)
    assert got == expect
