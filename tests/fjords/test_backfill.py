"""New queries filled from the stream's history (the patent's claim 3: historical values help
populate inserted windows): a windowed query installed late starts with its open windows
whole; `since` first emits every window (or row) from then on; never a reading twice or none."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest

from fjords.engine import Engine
from fjords.errors import LimitExceeded, QueryError
from fjords.limits import Limits
from fjords.runtime.fjord import Fjord
from fjords.runtime.history import History
from fjords.schema import Field, Schema

SCHEMA = Schema(
    [Field("time", "float"), Field("station", "str"), Field("speed", "float"),
     Field("segment", "str")],
    time="time",
)  # fmt: skip
ROWS = [
    (float(t), f"st{s}", float((t // 10) % 97 + s), f"S{s % 2}")
    for t in range(0, 20_000, 10)
    for s in range(4)
]
MIDDLE = 10_000.0


def engine(*, fuse: bool = True, keep_s: float = 86_400.0, limits: Limits | None = None):
    fjord = Fjord(limits=limits) if limits is not None else Fjord()
    fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    fjord.keep_history("traffic", History("traffic", SCHEMA, keep_s=keep_s))
    return Engine(fjord, fuse=fuse)


def feed(e: Engine, rows: list[tuple]) -> None:
    q = e.fjord.streams["traffic"].queue
    for i in range(0, len(rows), 500):
        q.put_many(rows[i : i + 500])
        e.fjord.run_until_idle()


def install(e: Engine, sql: str, qid: str, since: float | None = None) -> list[tuple]:
    """The query's rows, collected from before it is installed (installing may deliver)."""
    out: list[tuple] = []
    p = e.prepare(sql, query_id=qid, since=since)
    p.plan.sink.add_batch_callback(out.extend)
    e.add_query(p)
    return out


def windows(range_s: float, slide_s: float, rows=ROWS) -> dict:
    """(segment, window_start) -> (count, sum of speed), by brute force."""
    acc: dict = defaultdict(lambda: [0, 0.0])
    for t, _, v, seg in rows:
        last = math.floor(t / slide_s)
        for k in range(last - int(range_s / slide_s) + 1, last + 1):
            a = acc[(seg, k * slide_s)]
            a[0] += 1
            a[1] += v
    return {key: tuple(v) for key, v in acc.items()}


SLIDING = (
    "SELECT segment, COUNT(*) AS n, SUM(speed) AS s "
    "FROM traffic [RANGE 2 HOURS SLIDE 30 MINUTES] GROUP BY segment"
)


@pytest.mark.parametrize("fuse", [True, False])
def test_a_query_installed_late_starts_with_its_open_windows_whole(fuse: bool) -> None:
    e = engine(fuse=fuse)
    feed(e, [r for r in ROWS if r[0] < MIDDLE])
    got = install(e, SLIDING, "late")
    feed(e, [r for r in ROWS if r[0] >= MIDDLE])
    e.fjord.end_of_stream()
    e.fjord.run_until_idle()
    want = windows(7200, 1800)
    first = min(r[3] for r in got)
    assert first < MIDDLE - 7200 + 1800 + 1  # the oldest window open when it was installed
    assert len({(r[0], r[3]) for r in got}) == len(got)  # no window twice
    for seg, n, s, ws, _ in got:
        assert (n, s) == want[(seg, ws)], ws


@pytest.mark.parametrize("fuse", [True, False])
def test_since_emits_every_window_from_then_on_then_live_ones(fuse: bool) -> None:
    e = engine(fuse=fuse)
    feed(e, [r for r in ROWS if r[0] < MIDDLE])
    sql = "SELECT segment, COUNT(*) AS n, SUM(speed) AS s FROM traffic [RANGE 1 HOUR] GROUP BY segment"
    got = install(e, sql, "since", since=1000.0)
    feed(e, [r for r in ROWS if r[0] >= MIDDLE])
    e.fjord.end_of_stream()
    e.fjord.run_until_idle()
    want = {k: v for k, v in windows(3600, 3600).items() if k[1] >= 1000.0}
    assert {(r[0], r[3]): (r[1], r[2]) for r in got} == want
    assert len(got) == len(want)


def test_since_on_rows_hands_every_row_once_in_order() -> None:
    e = engine()
    feed(e, [r for r in ROWS if r[0] < MIDDLE])
    got = install(e, "SELECT time, speed FROM traffic WHERE station = 'st1'", "rows", since=9000.0)
    feed(e, [r for r in ROWS if r[0] >= MIDDLE])
    assert got == [(r[0], r[2]) for r in ROWS if r[1] == "st1" and r[0] >= 9000.0]


def test_a_running_aggregate_is_shared_only_when_it_holds_the_new_querys_windows() -> None:
    e = engine(limits=Limits(max_backfill_readings=1000))
    feed(e, [r for r in ROWS if r[0] < 5000])
    install(e, SLIDING, "early")  # too much history at once: it starts from now (4990)
    feed(e, [r for r in ROWS if 5000 <= r[0] < 5500])
    install(e, SLIDING, "same")  # the same windows, from now: shared
    assert e.fjord.queries["same"].shared is e.fjord.queries["early"].shared
    # Windows since 4000: the running aggregate began later, so this query gets its own.
    got = install(e, SLIDING, "older", since=4000.0)
    assert e.fjord.queries["older"].shared is not e.fjord.queries["early"].shared
    feed(e, [r for r in ROWS if r[0] >= 5500])
    e.fjord.end_of_stream()
    e.fjord.run_until_idle()
    want = windows(7200, 1800)
    assert min(r[3] for r in got) == 5400.0
    assert all((n, s) == want[(seg, ws)] for seg, n, s, ws, _ in got)
    for q in ("early", "same", "older"):
        e.fjord.remove_query(q)
    assert not e.fjord._shared  # every aggregate went with its last user


def test_since_before_what_the_history_holds_is_refused() -> None:
    e = engine(keep_s=3600.0)
    feed(e, [r for r in ROWS if r[0] < MIDDLE])
    with pytest.raises(QueryError, match="before what the history"):
        e.prepare(SLIDING, since=100.0)
    with pytest.raises(QueryError, match="one stream"):
        e.prepare("SELECT time FROM traffic UNION ALL SELECT time FROM traffic", since=9000.0)


def test_too_much_history_at_once_starts_from_now_or_is_refused_with_since() -> None:
    e = engine(limits=Limits(max_backfill_readings=100))
    feed(e, [r for r in ROWS if r[0] < MIDDLE])
    p = e.prepare(SLIDING)
    assert p.backfill_from is None and p.start_time == e.fjord.stream_time("traffic")
    with pytest.raises(LimitExceeded, match="max_backfill_readings"):
        e.prepare(SLIDING, since=1000.0)
