"""Each program's output on a synthetic loop-pair trace, parameters and cost accounts."""

from __future__ import annotations

import math

import pytest
from firmware_sim.cycles import load_cycle_table
from firmware_sim.programs import PROGRAMS, RAW_BATCH, make_program
from firmware_sim.records import (
    Count,
    PartialAggregate,
    Sample,
    VehicleEvent,
    record_from_dict,
    record_to_dict,
)
from firmware_sim.traces import vehicle_pair_trace
from hypothesis import given, settings
from hypothesis import strategies as st

RATE = 180.0


@pytest.fixture(scope="module")
def trace():
    return vehicle_pair_trace(30.0, rate_hz=RATE, vehicles_per_second=2.0, seed=3)


def first_sample_at_or_after(t: float) -> float:
    return math.ceil(t * RATE - 1e-9) / RATE


def run(program, samples):
    out = []
    for t, v in samples:
        out += program.feed(t, v)
    return out


@pytest.mark.parametrize(
    ("role", "on", "off"), [("upstream", "t0", "t2"), ("downstream", "t1", "t3")]
)
def test_vehicle_events_match_ground_truth(trace, role, on, off):
    events = run(make_program("vehicle", {"role": role}), trace.samples(role))
    assert len(trace.vehicles) > 30
    assert len(events) == len(trace.vehicles)
    for event, vehicle in zip(events, trace.vehicles, strict=True):
        assert isinstance(event, VehicleEvent) and event.role == role
        assert event.t_on == pytest.approx(first_sample_at_or_after(getattr(vehicle, on)))
        assert event.t_off == pytest.approx(first_sample_at_or_after(getattr(vehicle, off)))


def test_speed_and_length_from_a_pair(trace):
    """The proxy's reconstruction (section 5.1): speed = d / (t1 - t0), length = speed * (t2 - t0)."""
    up = run(make_program("vehicle", {"role": "upstream"}), trace.samples("upstream"))
    down = run(make_program("vehicle", {"role": "downstream"}), trace.samples("downstream"))
    for u, d, v in zip(up, down, trace.vehicles, strict=True):
        if d.t_on - u.t_on < 3 / RATE:
            continue  # too few samples between the sensors for a speed estimate
        speed = trace.separation_ft / (d.t_on - u.t_on)
        assert speed == pytest.approx(v.speed_fps, rel=0.5)
        assert speed * (u.t_off - u.t_on) == pytest.approx(v.length_ft, rel=0.5)


def test_count_per_second_matches_arrivals(trace):
    counts = run(make_program("count", {"period_ms": 1000}), trace.samples("upstream"))
    assert all(isinstance(c, Count) for c in counts)
    assert len(counts) == 29  # the 30th window is still open
    for c in counts:
        expected = sum(
            c.window_start <= first_sample_at_or_after(v.t0) < c.window_end - 1e-9
            for v in trace.vehicles
        )
        assert c.count == expected
        assert c.window_end - c.window_start == pytest.approx(1.0)
    program = make_program("count")
    run(program, trace.samples("upstream"))
    (last,) = program.flush(30.0)
    assert last.window_end == 30.0


def test_raw_sends_every_sample_in_batches(trace):
    program = make_program("raw")
    samples = list(trace.samples())[:21]
    out = []
    for i, (t, v) in enumerate(samples):
        got = program.feed(t, v)
        assert len(got) == (RAW_BATCH if (i + 1) % RAW_BATCH == 0 else 0)
        out += got
    out += program.flush(samples[-1][0])
    assert out == [Sample(t, v) for t, v in samples]
    assert program.total.messages == 3
    assert program.total.bits == 8 * (3 + 2 * 21)


def test_filter_union_of_ranges():
    program = make_program("filter", {"ranges": [[None, 2], [5, 6], [9, None]]})
    values = list(range(12))
    out = run(program, [(i / 10, float(v)) for i, v in enumerate(values)])
    assert [s.value for s in out] == [0, 1, 2, 5, 6, 9, 10, 11]


def test_deadband_sends_moves_beyond_epsilon():
    out = run(
        make_program("deadband", {"epsilon": 1.0}),
        [(i, v) for i, v in enumerate([5.0, 5.5, 6.0, 6.1, 4.0, 4.9, 5.01])],
    )
    assert [s.value for s in out] == [5.0, 6.1, 4.0, 5.01]


def test_aggregate_partials_roll_up_avg_exactly():
    program = make_program("aggregate", {"window_ms": 500})
    values = [float(v) for v in range(1, 26)]
    out = run(program, [(i * 0.1, v) for i, v in enumerate(values)]) + program.flush(2.5)
    assert all(isinstance(p, PartialAggregate) for p in out)
    assert [p.count for p in out] == [5, 5, 5, 5, 5]
    assert out[0] == PartialAggregate(15.0, 5, 1.0, 5.0, 0.0, 0.5)
    total = out[0]
    for p in out[1:]:
        total = total.merge(p)
    assert total.avg == sum(values) / len(values)
    assert (total.min, total.max, total.count) == (1.0, 25.0, 25)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 1023), min_size=1, max_size=200), st.integers(0, 50))
def test_deadband_invariant(values, epsilon):
    """Every reading is within epsilon of the last one sent."""
    program = make_program("deadband", {"epsilon": epsilon})
    last = None
    for i, v in enumerate(values):
        for s in program.feed(i / RATE, float(v)):
            last = s.value
        assert abs(v - last) <= epsilon


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=300), st.sampled_from([10, 100, 250]))
def test_aggregate_covers_every_reading_once(values, window_ms):
    program = make_program("aggregate", {"window_ms": window_ms})
    parts = run(program, [(i / 100, v) for i, v in enumerate(values)])
    parts += program.flush(len(values) / 100)
    assert sum(p.count for p in parts) == len(values)
    assert sum(p.sum for p in parts) == pytest.approx(sum(values), abs=1e-3)
    assert min(p.min for p in parts) == min(values)


def test_cost_account_uses_the_measured_table(trace):
    table = load_cycle_table("packed")  # the Python programs model the packed builds
    program = make_program("vehicle")
    run(program, trace.samples())
    c = table["vehicle"]
    total = program.total
    assert total.samples == total.adc == len(trace.upstream)
    assert total.edges == 2 * len(trace.vehicles)
    assert total.messages == len(trace.vehicles)
    assert total.bits == 40 * len(trace.vehicles)
    assert total.cycles == pytest.approx(
        c.sample * total.samples + c.edge * total.edges + c.message * total.messages
    )


def test_wire_messages_are_framed(trace):
    program = make_program("vehicle", {"role": "downstream"})
    for t, v in trace.samples("downstream"):
        if program.feed(t, v):
            break
    (msg,) = program.last_messages
    assert msg[0] >> 4 == 3 and msg[0] & 0x0F == 0 and len(msg) == 5


@pytest.mark.parametrize(
    ("name", "params", "match"),
    [
        ("nope", None, "unknown program 'nope'"),
        ("aggregate", None, "missing required parameter"),
        ("aggregate", {"window_ms": 0}, "window_ms must be > 0"),
        ("aggregate", {"window_ms": 10, "bogus": 1}, "unknown parameter"),
        ("vehicle", {"role": "sideways"}, "role must be"),
        ("vehicle", {"threshold": "high"}, "threshold must be a finite number"),
        ("filter", {"ranges": []}, "non-empty"),
        ("filter", {"ranges": [[5, 1]]}, "empty range"),
        ("filter", {"ranges": [[1, 2, 3]]}, r"\[lo, hi\]"),
        ("deadband", {"epsilon": -1}, ">= 0"),
        ("count", {"period_ms": -5}, "period_ms must be > 0"),
        ("raw", ["not", "a", "dict"], "mapping"),
    ],
)
def test_bad_parameters_are_clear_errors(name, params, match):
    with pytest.raises(ValueError, match=match):
        make_program(name, params)


def test_bad_reading_is_rejected_and_program_survives():
    program = make_program("raw")
    for bad in (float("nan"), "7", None):
        with pytest.raises(ValueError, match="finite number"):
            program.feed(0.0, bad)  # type: ignore[arg-type]
    assert program.feed(0.0, 1.0) == [] and program.total.samples == 1


def test_every_program_is_registered_and_measured():
    table = load_cycle_table()
    assert set(PROGRAMS) == {"raw", "vehicle", "count", "filter", "aggregate", "deadband"}
    for cls in PROGRAMS.values():
        assert table[cls.cycles_key].sample > 0


@pytest.mark.parametrize(
    "record",
    [
        Sample(1.0, 2.5),
        VehicleEvent("upstream", 1.0, 1.2),
        Count(0.0, 1.0, 3),
        PartialAggregate(6.0, 3, 1.0, 3.0, 0.0, 1.0),
    ],
)
def test_record_dict_round_trip(record):
    assert record_from_dict(record_to_dict(record)) == record


def test_record_from_bad_dict():
    with pytest.raises(ValueError, match="unknown record kind"):
        record_from_dict({"kind": "pizza"})
    with pytest.raises(ValueError, match="bad sample record"):
        record_from_dict({"kind": "sample", "t": 1.0})
