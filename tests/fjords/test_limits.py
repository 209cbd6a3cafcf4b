"""Limits (fjords.limits.Limits): refused at plan time where the plan tells, bounded work per
transition when windows close, and planning that stays linear."""

from __future__ import annotations

import time

import pytest

from fjords.errors import LimitExceeded, QueryError, QuerySyntaxError
from fjords.limits import Limits
from fjords.runtime.operators.aggregate import AggSpec, WindowAggregate
from fjords.runtime.progress import Watermark
from fjords.runtime.queues import PushQueue
from tests.fjords.test_fjord import new_engine


@pytest.mark.parametrize(
    ("window", "error", "needle"),
    [
        ("[RANGE 1 DAYS SLIDE 1 MILLISECONDS]", LimitExceeded, "max_panes_per_window"),
        ("[RANGE 1 HOURS SLIDE 7 MILLISECONDS]", LimitExceeded, "max_panes_per_window"),
        ("[ROWS 1000000000 SLIDE 1]", LimitExceeded, "max_rows_window"),
        ("[ROWS 50000 SLIDE 1]", LimitExceeded, "max_windows_per_pane"),
        ("[RANGE 1e308 WEEKS]", QuerySyntaxError, "too large"),
        ("[RANGE 1 MINUTES SLIDE 0.0001 SECONDS]", QueryError, "at least 1 millisecond"),
        ("[RANGE 0.0001 SECONDS]", QueryError, "at least 1 millisecond"),
    ],
)
def test_windows_over_the_limits_are_refused_when_planned(
    window: str, error: type[Exception], needle: str
) -> None:
    f = new_engine()
    with pytest.raises(error, match=needle):
        f.add_query(f"SELECT COUNT(*) AS n FROM traffic {window}")
    assert not f.fjord.queries and len(f.fjord.scheduler.operators) == 1  # only the stream's router


def test_text_in_list_and_query_count_limits() -> None:
    f = new_engine(limits=Limits(max_sql_chars=200, max_in_list=3, max_queries=2))
    with pytest.raises(LimitExceeded, match="max_sql_chars"):
        f.add_query("SELECT * FROM traffic WHERE speed > 1" + " " * 200)
    with pytest.raises(LimitExceeded, match="max_in_list"):
        f.add_query("SELECT * FROM traffic WHERE segment IN ('a', 'b', 'c', 'd')")
    f.add_query("SELECT * FROM traffic WHERE segment IN ('a', 'b', 'c')")
    f.add_query("SELECT * FROM traffic")
    with pytest.raises(LimitExceeded, match="max_queries"):
        f.add_query("SELECT * FROM traffic")


def test_limits_are_the_defaults_of_a_small_gateway() -> None:
    lim = Limits()
    assert lim.max_panes_per_window >= 1440  # a day by minutes
    assert lim.max_in_list >= 1000 and lim.max_queries >= 1000
    # The common windows plan under the defaults.
    f = new_engine()
    for w in ("[RANGE 1 DAYS SLIDE 1 MINUTES]", "[RANGE 1 HOUR SLIDE 90 SECONDS]", "[ROWS 100]"):
        f.add_query(f"SELECT COUNT(*) AS n FROM traffic {w}")


def test_closing_many_windows_is_sliced_across_transitions() -> None:
    """A watermark that closes 500 windows emits at most `max_windows_per_transition` per
    transition; the rest follow in later transitions, in order, and input read in between
    waits its turn."""
    out = PushQueue(100_000)
    inp = PushQueue(100_000)
    agg = WindowAggregate(
        inp,
        out,
        key_fn=lambda t: (),
        arg_fns=[],
        specs=[AggSpec("COUNT", None)],
        time_index=0,
        range_s=1.0,
        finalize=None,
    )
    agg.limits = Limits(max_windows_per_transition=16)
    for s in range(500):
        inp.put((float(s) + 0.5,))
    inp.put(Watermark(1000.0))
    inp.put((1000.5,))
    inp.put(Watermark(2000.0))
    per_transition = []
    while agg.has_input():
        before = len(out)
        agg.transition()
        per_transition.append(len(out) - before)
    rows = out.get_batch(100_000)
    assert max(per_transition) <= 16 and len(per_transition) > 500 // 16
    starts = [r[-2] for r in rows]
    assert starts == [float(s) for s in range(500)] + [1000.0]


def test_a_long_in_list_is_one_hash_entry_per_value_and_plans_in_linear_time() -> None:
    """Measured, not asserted on time: the planning cost per value stays flat as the list grows
    (no per-value scan), and the index holds one entry per value."""
    f = new_engine(limits=Limits(max_sql_chars=1_000_000, max_in_list=100_000))
    timings = {}
    for n in (500, 4000):
        values = ",".join(f"'S{i:05d}'" for i in range(n))
        start = time.perf_counter()
        f.add_query(f"SELECT * FROM traffic WHERE segment IN ({values})", query_id=f"in{n}")
        timings[n] = (time.perf_counter() - start) / n
        if n == 500:
            eq = f.fjord.streams["traffic"].router.index._eq
            assert sum(len(m) for m in eq.values()) == 500
    print(f"planning cost per IN value: {timings}")
    eq = f.fjord.streams["traffic"].router.index._eq
    assert sum(len(lst) for m in eq.values() for lst in m.values()) == 4500


def test_registering_many_queries_costs_the_same_per_query() -> None:
    """The 1,000th query folds in like the 1st: the index and catalog grow by constant work."""
    f = new_engine()
    for i in range(1000):
        f.add_query(f"SELECT * FROM traffic WHERE station = 'st{i}'", query_id=f"q{i}")
    index = f.fjord.streams["traffic"].router.index
    assert len(index) == 1000 and len(index._eq[1]) == 1000
    assert len(index._eq_items) == 1  # per-field lists, not per-query


def test_limits_from_a_configuration_table() -> None:
    assert Limits.from_mapping({"max_queries": 5}).max_queries == 5
    with pytest.raises(ValueError, match="unknown limits"):
        Limits.from_mapping({"max_querys": 5})
    with pytest.raises(ValueError, match="positive integer"):
        Limits.from_mapping({"max_queries": 0})


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ("SAMPLE PERIOD 0 SECONDS", "at least"),
        ("SAMPLE PERIOD 0.0000001 SECONDS", "at least"),
        ("SAMPLE PERIOD 1e300 WEEKS", "too large"),
        ("LIFETIME 0 DAYS", "at least"),
        ("LIFETIME 1e300 WEEKS", "too large"),
    ],
)
def test_sample_period_and_lifetime_are_sane(options: str, needle: str) -> None:
    with pytest.raises(QueryError, match=needle):
        new_engine().add_query(f"SELECT * FROM traffic {options}")
