"""Event-time progress (fjords/progress.py) through the Fjord's router, on injected clocks:
per-sensor silence bounds in gateway time, wall-clock idleness, and a future bound that one
sensor's clock cannot move."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fjords.engine import Engine
from fjords.runtime.fjord import Fjord
from fjords.runtime.progress import ProgressPolicy, ProgressTracker
from fjords.schema import Schema

SCHEMA = Schema([("time", "float"), ("station", "str"), ("speed", "float")])
TEN_YEARS = 10 * 365 * 86_400.0
QUERY = "SELECT station, COUNT(*) AS n FROM traffic [RANGE 30 MINUTES] GROUP BY station"


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def fjord(mono: Clock, wall: Clock, **kw: float) -> tuple[Fjord, list[tuple]]:
    f = Engine(Fjord(progress=ProgressPolicy(clock=mono, wall_clock=wall, **kw)))
    f.fjord.add_stream("traffic", SCHEMA, sensor_field="station")
    out: list[tuple] = []
    f.add_query(QUERY).sink.add_batch_callback(out.extend)
    return f, out


def router(f: Engine):
    return f.fjord.streams["traffic"].router


T0 = 1_330_588_800.0  # METR-LA's first reading (2012): a replay of the past


def test_a_slow_sensor_is_not_released_because_another_raced_ahead() -> None:
    mono, wall = Clock(), Clock(T0 + 12 * 365 * 86_400)
    f, out = fjord(mono, wall)
    # 'fast' replays a whole day; 'slow' (same 300 s period) is still at its first reading.
    f.fjord.push("traffic", (T0, "slow", 1.0))
    for k in range(288):
        f.fjord.push("traffic", (T0 + 300 * k, "fast", 1.0))
    f.fjord.run_until_idle()
    assert out == []  # 'slow' holds every window: its readings are still coming
    for k in range(1, 288):
        f.fjord.push("traffic", (T0 + 300 * k, "slow", 1.0))
    f.fjord.run_until_idle()
    assert router(f).late == 0
    assert len(out) == 2 * 47  # every 30-minute window but the last, for both stations
    assert all(r[1] == 6 for r in out)


def test_a_quiet_sensor_is_released_by_wall_clock_idleness_and_its_later_samples_are_late() -> None:
    mono, wall = Clock(), Clock(T0 + 10**8)
    f, out = fjord(mono, wall, idle_timeout_s=30.0)
    f.fjord.push("traffic", (T0, "quiet", 1.0))
    for k in range(12):
        mono.t += 0.5
        f.fjord.push("traffic", (T0 + 300 * k, "busy", 1.0))
        f.fjord.run_until_idle()
    assert out == []
    mono.t += 31.0  # 'quiet' has not been heard for 31 s of gateway time; 'busy' speaks
    f.fjord.push("traffic", (T0 + 3600, "busy", 1.0))
    f.fjord.run_until_idle()
    assert [r[0] for r in out] == ["quiet", "busy", "busy"]  # up to T0 + 3600 closed
    assert router(f).progress.idle_releases == 1
    f.fjord.push("traffic", (T0 + 300, "quiet", 1.0))  # behind the watermark now: late, counted
    f.fjord.push("traffic", (T0 + 3900, "quiet", 1.0))  # it speaks again: held from here
    f.fjord.run_until_idle()
    assert router(f).late == 1
    assert router(f).progress.sensors["quiet"].idle is False


def test_the_silence_bound_fits_the_sensors_period() -> None:
    mono, wall = Clock(), Clock(T0 + 10**8)
    f, out = fjord(mono, wall, idle_timeout_s=30.0, idle_gaps=3.0)
    f.fjord.pace("traffic", "slow", 2400.0)  # a live raw mote: 8 readings of 300 s per packet
    f.fjord.push("traffic", (T0, "slow", 1.0))
    for k in range(12):
        f.fjord.push("traffic", (T0 + 300 * k, "busy", 1.0))
    f.fjord.run_until_idle()
    mono.t += 600.0  # 10 minutes without 'slow': normal for it
    f.fjord.check_idle()
    f.fjord.run_until_idle()
    assert out == [] and not router(f).progress.sensors["slow"].idle
    mono.t += 3 * 2400.0  # three packets missed: it went quiet
    f.fjord.check_idle()
    f.fjord.run_until_idle()
    assert router(f).progress.sensors["slow"].idle and out


def test_a_hello_that_never_sends_data_holds_windows_at_most_the_idle_timeout() -> None:
    mono, wall = Clock(), Clock(T0 + 10**8)
    f, out = fjord(mono, wall, idle_timeout_s=30.0)
    f.fjord.heartbeat("traffic", "ghost", float("-inf"))  # what a proxy pushes on hello
    f.fjord.pace("traffic", "ghost", 86_400.0)  # whatever period it claims
    for k in range(12):
        f.fjord.push("traffic", (T0 + 300 * k, "busy", 1.0))
    f.fjord.run_until_idle()
    assert out == []
    mono.t += 30.5
    f.fjord.check_idle()
    f.fjord.run_until_idle()
    assert out


def test_one_sample_ten_years_ahead_is_rejected_and_poisons_no_one() -> None:
    mono, wall = Clock(), Clock(T0 + 3600)  # live: clocks synchronised with the gateway
    f, out = fjord(mono, wall)
    for k in range(6):
        f.fjord.push("traffic", (T0 + 300 * k, "a", 1.0))
        f.fjord.push("traffic", (T0 + 300 * k, "b", 1.0))
    f.fjord.push("traffic", (T0 + TEN_YEARS, "liar", 1.0))
    f.fjord.push("traffic", (T0 + 300, "liar", 1.0))  # its clock is fine again
    for k in range(6, 14):
        f.fjord.push("traffic", (T0 + 300 * k, "a", 1.0))
        f.fjord.push("traffic", (T0 + 300 * k, "b", 1.0))
        f.fjord.push("traffic", (T0 + 300 * k, "liar", 1.0))
    f.fjord.run_until_idle()
    r = router(f)
    assert r.late == 0 and r.progress.clock_rejects == 1
    assert r.progress.watermark == T0 + 300 * 13
    assert r.progress.max_time == T0 + 300 * 13
    assert {row[0] for row in out} == {"a", "b", "liar"}  # windows keep emitting
    report = r.progress.clock_report("liar")
    assert report["clock_rejects"] == 1 and not report["clock_suspect"]
    assert r.progress.clock_report("a")["clock_rejects"] == 0


def test_a_sensor_whose_clock_runs_far_ahead_is_flagged_and_rejected() -> None:
    mono, wall = Clock(), Clock(T0)
    f, _ = fjord(mono, wall)
    for k in range(4):
        f.fjord.push("traffic", (T0 + 60 * k, "a", 1.0))
        f.fjord.push("traffic", (T0 + 60 * k, "b", 1.0))
        f.fjord.push("traffic", (T0 + TEN_YEARS + 60 * k, "drift", 1.0))
    f.fjord.run_until_idle()
    p = router(f).progress
    rep = p.clock_report("drift")
    assert rep["clock_suspect"] and rep["clock_rejects"] == 4
    assert rep["clock_offset_s"] > TEN_YEARS - 1000
    assert not p.clock_report("a")["clock_suspect"]
    assert p.watermark == T0 + 180


def test_an_honest_replay_ahead_of_the_wall_clock_is_admitted() -> None:
    """A simulation at 60 x real time runs ahead of the gateway's clock: each sensor advances
    a packet (8 readings, 2,400 s) at a time and the two agree, so nothing is rejected."""
    mono, wall = Clock(), Clock(T0)
    f, _out = fjord(mono, wall)
    f.fjord.pace("traffic", "a", 2400.0)
    f.fjord.pace("traffic", "b", 2400.0)
    for packet in range(20):
        for sid in ("a", "b"):
            for k in range(8):
                f.fjord.push("traffic", (T0 + 300 * (8 * packet + k), sid, 1.0))
        f.fjord.run_until_idle()
    r = router(f)
    assert r.progress.clock_rejects == 0 and r.late == 0
    assert r.progress.watermark == T0 + 300 * 159


def test_a_one_sensor_stream_ahead_of_the_wall_clock_is_admitted_step_by_step() -> None:
    p = ProgressTracker(policy=ProgressPolicy(clock=Clock(), wall_clock=Clock(0.0)))
    p.begin()
    assert p.observe("s", 100.0)  # within max_future_s of the wall clock
    assert all(p.observe("s", 100.0 + 200 * k) for k in range(1, 100))
    assert not p.observe("s", TEN_YEARS)
    assert p.clock_rejects == 0 + 1


def test_forget_removes_a_sensor_from_progress() -> None:
    mono, wall = Clock(), Clock(T0 + 10**8)
    f, out = fjord(mono, wall)
    f.fjord.push("traffic", (T0, "gone", 1.0))
    for k in range(12):
        f.fjord.push("traffic", (T0 + 300 * k, "busy", 1.0))
    f.fjord.run_until_idle()
    assert out == []
    f.fjord.release("traffic", "gone", forget=True)
    f.fjord.run_until_idle()
    assert "gone" not in router(f).progress.sensors and out


def test_an_asleep_sensor_is_released_at_once() -> None:
    mono, wall = Clock(), Clock(T0 + 10**8)
    f, out = fjord(mono, wall)
    f.fjord.push("traffic", (T0, "sleepy", 1.0))
    for k in range(12):
        f.fjord.push("traffic", (T0 + 300 * k, "busy", 1.0))
    f.fjord.release("traffic", "sleepy")
    f.fjord.run_until_idle()
    assert out
    f.fjord.push("traffic", (T0 + 3600, "sleepy", 1.0))  # awake again: it holds progress once more
    f.fjord.run_until_idle()
    assert not router(f).progress.sensors["sleepy"].idle


def test_a_released_sleeper_bounds_the_jump_when_every_sensor_is_idle() -> None:
    """An asleep sensor that cannot tell its clock is released, but when every sensor goes
    idle the watermark stops where it fell asleep: its readings when woken are not late."""
    mono, wall = Clock(), Clock(T0 + 10**8)
    f, _out = fjord(mono, wall, idle_timeout_s=30.0)
    f.fjord.push("traffic", (T0, "sleepy", 1.0))
    for k in range(13):
        f.fjord.push("traffic", (T0 + 300 * k, "a", 1.0))  # to T0 + 3600
    for k in range(25):
        f.fjord.push("traffic", (T0 + 300 * k, "b", 1.0))  # to T0 + 7200
    f.fjord.release("traffic", "sleepy")
    f.fjord.run_until_idle()
    assert router(f).progress.watermark == T0 + 3600  # 'a' holds it
    mono.t = 100.0  # every sensor idle: what came is complete, but only up to the sleeper
    f.fjord.check_idle()
    f.fjord.run_until_idle()
    assert router(f).progress.watermark == T0 + 3600
    f.fjord.push("traffic", (T0 + 3700, "sleepy", 1.0))  # woken: it sends from where it slept
    f.fjord.run_until_idle()
    assert router(f).late == 0
    # Without a sleeper the all-idle jump goes to the latest time reached.
    f.fjord.release("traffic", "sleepy", forget=True)
    f.fjord.check_idle()
    f.fjord.run_until_idle()
    mono.t = 200.0
    f.fjord.check_idle()
    f.fjord.run_until_idle()
    assert router(f).progress.watermark == T0 + 7200


def test_a_sleeper_that_tells_its_clock_holds_the_watermark_there() -> None:
    """A sleeping mote's listens carry its clock (heartbeats): it stays active, the watermark
    waits at its time however far the others race, and its readings after waking count."""
    mono, wall = Clock(), Clock(T0 + 10**8)
    f, out = fjord(mono, wall, idle_timeout_s=30.0)
    f.fjord.push("traffic", (T0, "sleepy", 1.0))
    for k in range(25):
        f.fjord.push("traffic", (T0 + 300 * k, "busy", 1.0))
        if k % 6 == 0:
            f.fjord.heartbeat("traffic", "sleepy", T0 + 300 * k / 4)  # slower than 'busy'
    f.fjord.run_until_idle()
    assert router(f).progress.watermark == T0 + 1800
    for k in range(6, 13):
        f.fjord.push("traffic", (T0 + 300 * k + 1, "sleepy", 1.0))  # awake again
    f.fjord.run_until_idle()
    assert router(f).late == 0
    assert sorted(r[1] for r in out if r[0] == "sleepy") == [1, 6]  # (station, n, start, end)


# -- per batch == per reading --------------------------------------------------------------

SENSORS = ["a", "b", "c", "d"]
WALL0 = 1_000.0

times = st.one_of(
    st.integers(0, 40).map(lambda k: WALL0 - 200 + 10.0 * k),  # near the wall clock, ties
    st.integers(0, 40).map(lambda k: WALL0 + 150 + 25.0 * k),  # ahead: checked, some rejected
    st.sampled_from([WALL0 + 10**6, WALL0 + 10**9, math.inf, -math.inf, math.nan]),
)
rows_ = st.lists(st.tuples(times, st.sampled_from([*SENSORS, "e"])), max_size=25)
events = st.lists(
    st.one_of(
        st.tuples(st.just("batch"), rows_),
        st.tuples(st.just("clock"), st.sampled_from([0.0, 1.0, 5.0, 40.0]), st.booleans()),
        st.tuples(st.just("heartbeat"), st.sampled_from(SENSORS), times),
        st.tuples(st.just("announce"), st.sampled_from(SENSORS)),
        st.tuples(st.just("pace"), st.sampled_from(SENSORS), st.sampled_from([5.0, 60.0])),
        st.tuples(st.just("release"), st.sampled_from(SENSORS), st.booleans()),
    ),
    max_size=30,
)


def _state(p: ProgressTracker) -> str:
    """Everything a tracker knows, comparable with NaNs in it."""
    sensors = [(k, [getattr(s, a) for a in s.__slots__]) for k, s in p.sensors.items()]
    top = (p._top1, p._top2, p.skew, p.max_time, p.watermark)
    return repr((sensors, top, p.late, p.clock_rejects, p.idle_releases))


def _per_reading(p: ProgressTracker, rows: list[tuple], late: list[tuple]) -> list[tuple]:
    """The per-reading reference for `observe_batch`: one row at a time."""
    out = []
    for r in rows:
        if r[0] < p.watermark:
            p.late += 1
            late.append(r)
        elif p.observe(r[1], r[0]):
            out.append(r)
    return out


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events, st.booleans())
def test_observe_batch_is_observe_per_reading_in_order(evs: list[tuple], keyed: bool) -> None:
    """Random sequences (several sensors, out of order, ties, dated far ahead, NaN and
    infinities, heartbeats, paces, releases, forgets and idle time between batches): the
    batch path admits the same rows and leaves the same state as one observe per reading."""
    mono, wall = Clock(), Clock(WALL0)
    policy = ProgressPolicy(
        clock=mono, wall_clock=wall, idle_timeout_s=20.0, max_future_s=100.0, max_step_s=400.0
    )
    batch, each = ProgressTracker(policy=policy), ProgressTracker(policy=policy)
    per_reading = batch._observe_each

    def counted(*a: object) -> list[tuple]:
        event("a batch took the per-reading path")
        return per_reading(*a)  # type: ignore[arg-type]

    batch._observe_each = counted  # type: ignore[method-assign]
    for ev in evs:
        kind = ev[0]
        if kind == "batch":
            rows = ev[1] if keyed else [(t, None) for t, _ in ev[1]]
            for p in (batch, each):
                p.begin()
            late_b: list[tuple] = []
            late_e: list[tuple] = []
            got = batch.observe_batch(list(rows), 0, 1 if keyed else None, late_b.append)
            want = _per_reading(each, rows, late_e)
            assert repr(got) == repr(want) and repr(late_b) == repr(late_e)
            for p in (batch, each):
                p.advance()
        elif kind == "clock":
            mono.t += ev[1]
            if ev[2]:
                wall.t += ev[1]
        else:
            for p in (batch, each):
                p.begin()
                if kind == "heartbeat":
                    p.observe(ev[1], ev[2])
                elif kind == "announce":
                    p.announce(ev[1])
                elif kind == "pace":
                    p.pace(ev[1], ev[2])
                elif ev[2]:
                    p.forget(ev[1])
                else:
                    p.release(ev[1])
                p.advance()
        assert _state(batch) == _state(each)


def test_observe_batch_counts_late_rows_and_steps_like_observe() -> None:
    mono, wall = Clock(), Clock(T0 + 10**8)
    p = ProgressTracker(policy=ProgressPolicy(clock=mono, wall_clock=wall))
    p.begin()
    rows = [(T0 + 300 * k, s) for k in range(4) for s in ("x", "y")]
    assert p.observe_batch(rows, 0, 1) == rows
    assert p.advance() == T0 + 900 and p.skew == 300.0
    late: list[tuple] = []
    p.begin()
    assert p.observe_batch([(T0, "x"), (T0 + 1200, "x")], 0, 1, late.append) == [(T0 + 1200, "x")]
    assert late == [(T0, "x")] and p.late == 1
    assert p.sensors["x"].samples == 5 and p.sensors["x"].step == 300.0


def _fast_only(p: ProgressTracker) -> None:
    def refuse(*a: object) -> list[tuple]:
        raise AssertionError("took the per-reading path")

    p._observe_each = refuse  # type: ignore[method-assign]


def test_observe_batch_keeps_to_the_batch_path_after_the_top_sensor_is_forgotten() -> None:
    """The sensor holding the highest claim is forgotten: batches without it stay on the batch
    path and still match one observe per reading (who holds the top after them included)."""
    mono, wall = Clock(), Clock(T0 + 10**8)
    policy = ProgressPolicy(clock=mono, wall_clock=wall)
    batch, each = ProgressTracker(policy=policy), ProgressTracker(policy=policy)
    first = [(T0, "a"), (T0 + 900, "top"), (T0 + 300, "b")]
    then = [(T0 + 600, "a"), (T0 + 1200, "c"), (T0 + 1200, "b"), (T0 + 300, "a"), (T0 + 1500, "b")]
    for rows in (first, None, then):
        for p in (batch, each):
            p.begin()
            if rows is None:
                p.forget("top")
        if rows is None:
            _fast_only(batch)
            continue
        assert batch.observe_batch(list(rows), 0, 1) == _per_reading(each, rows, [])
        assert _state(batch) == _state(each)
    assert batch._top1 == (T0 + 1500, "b") and batch._top2 == T0 + 1200


# -- a replay sampled in rounds (observe_batch without a loop over rows) ---------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_sensors=st.integers(1, 6),
    steps=st.lists(st.sampled_from([1, 5, 300, 301.5]), min_size=1, max_size=30),
    cuts=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    flaw=st.sampled_from(["none", "none", "drop", "twice", "late sensor", "behind", "new"]),
    seed=st.integers(0, 1000),
)
def test_observe_batch_of_rounds_is_observe_per_reading(
    n_sensors: int, steps: list, cuts: list[int], flaw: str, seed: int
) -> None:
    """Every sensor once at each time, in time order, cut into batches anywhere (the rounds
    path), and near misses (a row dropped or doubled, a sensor joining late, one behind its
    own latest): the state after each batch is that of one observe per reading."""
    import random

    import fjords.runtime.progress as progress

    rng = random.Random(seed)
    names = [f"s{i}" for i in range(n_sensors)]
    rows, t = [], T0
    for step in steps:
        t += step
        rnd = [(t, s) for s in names if not (flaw == "late sensor" and s == "s0" and t < T0 + 50)]
        rng.shuffle(rnd)
        rows += rnd
    if rows and flaw == "drop":
        del rows[rng.randrange(len(rows))]
    elif rows and flaw == "twice":
        i = rng.randrange(len(rows))
        rows.insert(i, rows[i])
    mono, wall = Clock(), Clock(T0 + 10**8)
    policy = ProgressPolicy(clock=mono, wall_clock=wall, max_step_s=400.0)
    batch, each = ProgressTracker(policy=policy), ProgressTracker(policy=policy)
    if flaw == "behind":  # one sensor already ahead of the trace
        for p in (batch, each):
            p.begin()
            p.observe("s0", T0 + 20)
    rounds, min_round = progress._rounds, progress._MIN_ROUND

    def counted(*a: object) -> object:
        out = rounds(*a)  # type: ignore[arg-type]
        event("rounds" if out is not None else "row loop")
        return out

    progress._rounds = counted  # type: ignore[assignment]
    progress._MIN_ROUND = 1  # (rounds of a few sensors)
    try:
        i, k = 0, 0
        while i < len(rows):
            n = cuts[k % len(cuts)] * max(1, n_sensors // 2)
            k += 1
            part = rows[i : i + n]
            i += n
            if flaw == "new" and k == 2:
                part = part + [(part[-1][0], "newcomer")]
            for p in (batch, each):
                p.begin()
            assert batch.observe_batch(list(part), 0, 1) == _per_reading(each, part, [])
            assert _state(batch) == _state(each)
            mono.t += 1.0
            for p in (batch, each):
                p.advance()
    finally:
        progress._rounds = rounds
        progress._MIN_ROUND = min_round


def test_observe_batch_of_rounds_counts_the_step_into_the_batch(monkeypatch) -> None:
    """The largest step is the one between two batches of rounds: it is the stream's skew."""
    import fjords.runtime.progress as progress

    monkeypatch.setattr(progress, "_MIN_ROUND", 1)  # (a round of three)

    mono, wall = Clock(), Clock(T0 + 10**8)
    policy = ProgressPolicy(clock=mono, wall_clock=wall)
    batch, each = ProgressTracker(policy=policy), ProgressTracker(policy=policy)
    names = ["a", "b", "c"]
    first = [(T0 + k, s) for k in range(3) for s in names]
    then = [(T0 + 302 + k, s) for k in range(4) for s in names]
    for part in (first, then):
        assert progress._rounds([s for _, s in part], [t for t, _ in part], 3) is not None
        for p in (batch, each):
            p.begin()
        assert batch.observe_batch(list(part), 0, 1) == _per_reading(each, part, [])
        assert _state(batch) == _state(each)
    assert batch.skew == 300 and batch.sensors["a"].step == 1


def test_rounds_are_refused_when_a_round_is_short(monkeypatch) -> None:
    """A round missing a sensor, the next one starting with it: a round's worth of rows holds
    each sensor once but two times. Not rounds: the row loop, with the same state."""
    import fjords.runtime.progress as progress

    monkeypatch.setattr(progress, "_MIN_ROUND", 1)  # (a round of three)

    rows = [(T0, "a"), (T0, "b"), (T0, "c")]
    rows += [(T0 + 1, "a"), (T0 + 1, "b")]  # 'c' missed this round
    rows += [(T0 + 2, s) for s in ("c", "a", "b")]  # every 3 rows from the 4th: a, b, c
    rows += [(T0 + 3, s) for s in ("c", "a", "b")]
    keys, times = [s for _, s in rows], [t for t, _ in rows]
    assert progress._rounds(keys, times, 3) is None
    mono, wall = Clock(), Clock(T0 + 10**8)
    policy = ProgressPolicy(clock=mono, wall_clock=wall)
    batch, each = ProgressTracker(policy=policy), ProgressTracker(policy=policy)
    for p in (batch, each):
        p.begin()
        p.observe_batch([(T0 - 5, s) for s in "abc"], 0, 1)
        p.begin()
    assert batch.observe_batch(list(rows), 0, 1) == _per_reading(each, rows, [])
    assert _state(batch) == _state(each)
