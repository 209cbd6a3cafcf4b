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


def test_a_benchmark_replaces_its_own_section_of_results_and_keeps_the_others(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RESULTS.md keeps each benchmark's latest run: recording again replaces that section
    (dated, with the machine) and leaves the rest alone, so the file cannot grow into a log."""
    from benchmarks import common

    results = tmp_path / "RESULTS.md"
    monkeypatch.setattr(common, "RESULTS", results)
    common.record("a", "first a")
    common.record("b", "only b")
    common.record("a", "second a")
    text = results.read_text()
    assert text.startswith(common.HEAD) and "git history" in common.HEAD
    assert text.count("## a\n") == 1 and text.count("## b\n") == 1
    assert "second a" in text and "first a" not in text and "only b" in text
    assert f"_{common.today()} on {common.machine()}_" in text
    assert text.index("## a\n") < text.index("## b\n")  # replaced in place


def test_the_auth_benchmark_runs_and_records_its_section(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python -m benchmarks.auth` in a tiny configuration: every contender measured on every
    message (the keyed path admits each sealed message: none is taken for a replay), the
    mote's figures from `fjords-power simulate --mac`, one `auth` section. No timing asserts."""
    from benchmarks import auth, common
    from benchmarks.__main__ import available

    results = tmp_path / "RESULTS.md"
    monkeypatch.setattr(common, "RESULTS", results)
    assert "auth" in available() and "calibrate" in available()
    auth.main(["--rounds", "2", "--batch", "5"])
    text = results.read_text()
    assert text.count("## auth\n") == 1
    for kind in ("samples, 4 readings", "listen", "readings (~200 B)"):
        for path in ("decode_message, unsealed", "decode + GatewayAuth.admit, sealed", "hmac.new"):
            assert f"{kind}: {path}" in text
    assert "cannot seal" in text  # raw at 180 Hz: the paper profile's CPU cannot keep up
    measured, rows, _ = auth.mote()
    assert len(measured) == 5 and all(r[1] > 0 for r in measured)  # from cycles.json `auth`
    assert {(r[0], r[1]) for r in rows} >= {("paper", p) for p in auth.PROGRAMS}
    assert all(r[-1].startswith("-") for r in rows)  # sealing costs lifetime, never adds it
    detail, summary = auth.gateway(1, 3)
    assert (
        len(detail) >= 3 * 6 and len(summary) == 3 and all(r[4] > 0 and r[3] > 0 for r in summary)
    )
