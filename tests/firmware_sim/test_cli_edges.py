"""`fjords-power`'s rough edges: every command's --help, --version, a profile file,
and a misspelt --param refused instead of silently ignored."""

from __future__ import annotations

import argparse
import json
import re
from importlib import resources
from pathlib import Path

import pytest
from firmware_sim.cli import build_parser, main


def _commands() -> list[str]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


@pytest.mark.parametrize("command", ["", *_commands()])
def test_every_help_works(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main([command, "--help"] if command else ["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: fjords-power")
    if command == "paper":
        assert "within 15%" in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and re.fullmatch(r"fjords-power \S+\n", capsys.readouterr().out)


def _my_profile(tmp_path: Path, **cpu: float) -> Path:
    text = resources.files("firmware_sim.profiles").joinpath("paper.toml").read_text()
    text = re.sub(r"(?m)^name = .*$", 'name = "mymote"', text)
    for key, value in cpu.items():
        text = re.sub(rf"(?m)^{key} = .*$", f"{key} = {value}", text)
    path = tmp_path / "mymote.toml"
    path.write_text(text)
    return path


def test_profile_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _my_profile(tmp_path)
    monkeypatch.chdir(tmp_path)
    args = ["simulate", "--program", "raw", "--rate", "180", "--json"]
    assert main([*args, "--profile", "./mymote.toml"]) == 0
    mine = json.loads(capsys.readouterr().out)
    assert main([*args, "--profile", "paper"]) == 0
    paper = json.loads(capsys.readouterr().out)
    assert mine["power_mw"] == pytest.approx(
        paper["power_mw"]
    )  # the same figures, read from a file
    assert mine["profile"] == "mymote"
    assert main(["paper", "--profile", "./mymote.toml"]) == 0
    assert "mymote" not in capsys.readouterr().err
    for command in (["sweep", "--rates", "1,10"], ["choose", "--needs", "raw", "--lifetime", "1d"]):
        assert main([*command, "--profile", "./mymote.toml"]) in (0, 1)
        assert "Traceback" not in capsys.readouterr().err
    assert (
        main(
            [
                "simulate",
                "--program",
                "raw",
                "--rate",
                "1",
                "--trace-seconds",
                "5",
                "--profile",
                "mymote.toml",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["profile"] == "mymote"


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        ("nope", "unknown profile 'nope'; expected one of"),
        ("./missing.toml", "cannot read profile file ./missing.toml"),
        ("bad.toml", "not valid TOML"),
        ("incomplete.toml", "missing field"),
    ],
)
def test_bad_profile_is_one_line(
    profile: str,
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "bad.toml").write_text("name = [")
    (tmp_path / "incomplete.toml").write_text('name = "x"\n')
    monkeypatch.chdir(tmp_path)
    assert main(["paper", "--profile", profile]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_unknown_param_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--program", "raw", "--rate", "10", "--param", "bogus=1"]) == 2
    assert "unknown --param bogus for program 'raw'; it takes none" in capsys.readouterr().err
    assert (
        main(["simulate", "--program", "aggregate", "--rate", "10", "--param", "windw_ms=5"]) == 2
    )
    assert "it takes window_ms" in capsys.readouterr().err
    assert (
        main(["simulate", "--program", "aggregate", "--rate", "10", "--param", "window_ms=500"])
        == 0
    )
