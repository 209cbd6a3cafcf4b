"""The benchmarks' own measures: a figure that decides a goal is checked like product code."""

from __future__ import annotations

import pytest

from benchmarks.gateway_load import _kept_pace


def test_keeping_pace_is_measured_on_the_samples_own_clocks() -> None:
    """1,000 samples sent over ~1 s, each pushed 2 ms after it was sent: the gateway kept
    pace (no harness signal counts), 2 ms behind the last send."""
    sent = {("s", float(i)): i / 1000 for i in range(1000)}
    pushed = {k: t + 0.002 for k, t in sent.items()}
    kept = _kept_pace(sent, pushed)
    assert kept["sent_per_s (send clocks)"] == pytest.approx(1000 / 0.999)
    assert kept["pushed_per_s (send clocks)"] == pytest.approx(1000 / 1.001)
    assert kept["behind at the last send_ms"] == pytest.approx(2.0)


def test_samples_never_pushed_or_a_backlog_at_the_end_lower_the_rate() -> None:
    sent = {("s", float(i)): i / 1000 for i in range(1000)}
    pushed = {k: t + 0.002 for k, t in sent.items() if k[1] % 10}  # a tenth never arrived
    assert _kept_pace(sent, pushed)["pushed_per_s (send clocks)"] == pytest.approx(900 / 1.001)
    pushed = {k: t + (0.5 if t > 0.9 else 0.002) for k, t in sent.items()}  # behind at the end
    kept = _kept_pace(sent, pushed)
    assert kept["pushed_per_s (send clocks)"] == pytest.approx(1000 / 1.499)
    assert kept["behind at the last send_ms"] == pytest.approx(500.0)


def test_too_few_samples_give_no_figure() -> None:
    assert _kept_pace({}, {}) == {}
    assert _kept_pace({("s", 1.0): 1.0}, {("s", 1.0): 1.5}) == {}
