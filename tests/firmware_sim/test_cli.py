"""`fjords-power`: JSON output, tables, plots and errors."""

from __future__ import annotations

import json

import pytest
from firmware_sim.cli import main, parse_duration, parse_rates


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_simulate_json_keys(capsys):
    code, out, _ = run(capsys, "simulate", "--program", "raw", "--rate", "180", "--json")
    assert code == 0
    data = json.loads(out)
    assert {"power_mw", "current_ma", "lifetime_days", "breakdown_mw"} <= set(data)
    assert set(data["breakdown_mw"]) == {"radio", "cpu", "adc", "idle", "listen"}
    assert data["power_mw"] == pytest.approx(sum(data["breakdown_mw"].values()))


def test_simulate_vehicle_options(capsys):
    code, out, _ = run(
        capsys,
        "simulate",
        "--program",
        "vehicle",
        "--rate",
        "180",
        "--vehicles-per-second",
        "2",
        "--profile",
        "mica2",
        "--json",
    )
    assert code == 0 and json.loads(out)["profile"] == "mica2"


def test_simulate_on_a_trace(capsys):
    code, out, _ = run(
        capsys, "simulate", "--program", "count", "--rate", "90", "--trace-seconds", "5", "--json"
    )
    data = json.loads(out)
    assert code == 0 and data["simulated_seconds"] == pytest.approx(5.0)
    assert data["messages"] == 4


def test_simulate_table(capsys):
    code, out, _ = run(
        capsys, "simulate", "--program", "aggregate", "--rate", "50", "--param", "window_ms=500"
    )
    assert code == 0 and "lifetime" in out


def test_paper_json(capsys):
    code, out, _ = run(capsys, "paper", "--json", "--check")
    data = json.loads(out)
    assert code == 0 and data["ok"]
    assert [s["program"] for s in data["scenarios"]] == ["raw", "vehicle", "count"]
    assert all(abs(s["relative_difference"]) <= 0.15 for s in data["scenarios"])


def test_paper_table(capsys):
    code, out, _ = run(capsys, "paper")
    assert code == 0 and "13.00" in out and "within 15%" in out


def test_sweep_plot_and_compare(capsys, tmp_path):
    png = tmp_path / "fig11.png"
    code, out, _ = run(
        capsys,
        "sweep",
        "--compare",
        "raw,vehicle,count",
        "--rates",
        "20:200:20",
        "--plot",
        str(png),
        "--json",
    )
    assert code == 0
    data = json.loads(out)
    assert set(data) == {"raw", "vehicle", "count"} and len(data["raw"]) == 10
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_table_skips_infeasible_rates(capsys):
    code, out, _ = run(capsys, "sweep", "--program", "count", "--rates", "1:20")
    assert code == 0 and "skipped" in out


def test_choose(capsys):
    code, out, _ = run(capsys, "choose", "--needs", "counts", "--lifetime", "30d", "--json")
    assert code == 0 and json.loads(out)["program"] == "count"
    code, out, _ = run(capsys, "choose", "--needs", "vehicles", "--lifetime", "1y")
    assert code == 1 and "none does" in out


def test_profiles(capsys):
    code, out, _ = run(capsys, "profiles", "--json")
    assert code == 0 and {p["name"] for p in json.loads(out)} >= {"paper", "mica2", "telosb"}


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["simulate", "--program", "nope", "--rate", "1"], "unknown program 'nope'"),
        (["simulate", "--program", "raw", "--rate", "1", "--profile", "nokia"], "unknown profile"),
        (["simulate", "--program", "vehicle", "--rate", "4"], "too slow"),
        (["sweep", "--rates", "200:1"], "bad rates"),
        (["sweep", "--rates", "a,b"], "bad rates"),
        (["choose", "--needs", "counts", "--lifetime", "forever"], "bad lifetime"),
        (
            ["simulate", "--program", "aggregate", "--rate", "5", "--trace-seconds", "1"],
            "missing required",
        ),
    ],
)
def test_errors_exit_2_with_a_clear_message(capsys, argv, match):
    code, _, err = run(capsys, *argv)
    assert code == 2 and match in err


def test_bad_rate_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--program", "raw", "--rate", "-3"])
    assert exc.value.code == 2
    assert "must be positive" in capsys.readouterr().err


def test_parsers():
    assert parse_rates("1:5") == [1, 2, 3, 4, 5]
    assert parse_rates("10:30:10") == [10, 20, 30]
    assert parse_rates("1,180") == [1, 180]
    assert parse_duration("30d") == 30 * 86400
    assert parse_duration("2w") == 14 * 86400
    assert parse_duration("90") == 90
