"""Hypothesis strategies for every protocol message kind."""

from __future__ import annotations

from hypothesis import strategies as st

from sensors.protocol import (
    Ack,
    AggregateReport,
    Control,
    Events,
    Hello,
    Listen,
    Samples,
    Status,
)

ids = st.text(min_size=1, max_size=12)
seqs = st.integers(min_value=0, max_value=2**32)
floats = st.floats(allow_nan=False, allow_infinity=False)
nonneg = st.floats(min_value=0, max_value=1e6, allow_nan=False)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), floats, st.text(max_size=8)
)
listen = st.one_of(st.none(), nonneg)
fraction = st.one_of(st.none(), st.floats(min_value=0, max_value=1))


@st.composite
def samples(draw: st.DrawFn) -> Samples:
    n = draw(st.integers(0, 8))
    width = draw(st.integers(1, 3))
    return Samples(
        sensor_id=draw(ids),
        seq=draw(seqs),
        times=tuple(draw(st.lists(floats, min_size=n, max_size=n))),
        rows=tuple(
            tuple(draw(st.lists(scalars, min_size=width, max_size=width))) for _ in range(n)
        ),
        listen_ms=draw(listen),
    )


@st.composite
def aggregates(draw: st.DrawFn) -> AggregateReport:
    a, b = sorted([draw(floats), draw(floats)])
    return AggregateReport(
        sensor_id=draw(ids),
        seq=draw(seqs),
        start=a,
        end=b,
        values=draw(
            st.dictionaries(
                st.text(max_size=6), st.one_of(st.integers(0, 10**6), floats), max_size=4
            )
        ),
        listen_ms=draw(listen),
    )


hellos = st.builds(
    Hello,
    sensor_id=ids,
    seq=seqs,
    schema=st.lists(
        st.tuples(st.text(max_size=8), st.sampled_from(["float", "int", "str", "bool"])), max_size=4
    ).map(tuple),
    programs=st.lists(st.text(max_size=8), max_size=4).map(tuple),
    sample_period_ms=nonneg,
    battery=fraction,
    attributes=st.dictionaries(st.text(max_size=8), scalars, max_size=4),
)
events = st.builds(
    Events,
    sensor_id=ids,
    seq=seqs,
    name=st.sampled_from(["upstream", "downstream", "x"]),
    times=st.lists(st.lists(floats, min_size=1, max_size=3).map(tuple), max_size=5).map(tuple),
    listen_ms=listen,
)
listens = st.builds(
    Listen, sensor_id=ids, seq=seqs, duration_ms=nonneg, time=st.one_of(st.none(), floats)
)
controls = st.one_of(
    st.builds(Control.set_period, ids, st.floats(min_value=0.001, max_value=1e6), seq=seqs),
    st.builds(
        Control.load_program,
        ids,
        st.sampled_from(["raw", "vehicle", "count"]),
        st.dictionaries(st.text(max_size=8), scalars, max_size=3),
        seq=seqs,
    ),
    st.builds(Control.sleep, ids, nonneg, seq=seqs),
    st.builds(Control.wake, ids, seq=seqs),
)
acks = st.builds(
    Ack, sensor_id=ids, seq=seqs, ack_seq=seqs, ok=st.booleans(), error=st.text(max_size=20)
)
statuses = st.builds(
    Status,
    sensor_id=ids,
    seq=seqs,
    online=st.booleans(),
    battery=fraction,
    reason=st.text(max_size=10),
)

ALL = {
    "hello": hellos,
    "samples": samples(),
    "events": events,
    "aggregate": aggregates(),
    "listen": listens,
    "control": controls,
    "ack": acks,
    "status": statuses,
}
messages = st.one_of(*ALL.values())
