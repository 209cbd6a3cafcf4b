"""The rough edges a new operator hits first, each checked here (against the real
`fjords-gateway run` where it matters)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from gateway.cli import build_parser, default_state_dir, main
from gateway.cli_text import explain_text
from gateway.config import Config
from gateway.daemon import Gateway
from tests.daemon import wait_healthy
from tests.support import ROOT, free_port

Q1 = (
    "SELECT segment, AVG(speed) AS avg_speed FROM traffic [RANGE 15 MINUTES] "
    "WHERE segment IN ('S05','S14') GROUP BY segment"
)


# -- make run HTTP=host:port ------------------------------------------------------------------


def test_make_run_takes_http() -> None:
    def recipe(*extra: str) -> str:
        out = subprocess.run(
            ["make", "-n", "-o", ".venv/.installed", "run", *extra],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return next(line for line in out.splitlines() if "fjords-gateway run" in line)

    assert "--http 0.0.0.0:9090" in recipe("HTTP=0.0.0.0:9090")
    assert "--http" not in recipe()
    assert "--config g.toml" in recipe("ARGS=--config g.toml")


# -- the daemon says where queries are kept; the default is per user ---------------------------


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "run", "--http", f"127.0.0.1:{port}", *args],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "XDG_DATA_HOME": str(tmp_path / "xdg")},
    )
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, proc, log=proc.stderr.read)
    return proc, url


def _stop(proc: subprocess.Popen) -> str:
    proc.terminate()
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    return err


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        f"{url}/queries",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _queries(url: str) -> list[dict]:
    return json.loads(urllib.request.urlopen(f"{url}/queries", timeout=10).read())["queries"]


def test_default_state_dir_is_per_user_and_the_daemon_says_so(
    tmp_path, capsys, monkeypatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # the table on one line per sensor
    where = tmp_path / "xdg" / "fjords-gateway"
    proc, url = _run(tmp_path)
    try:
        status, body = _post(url, {"sql": "SELECT station, speed FROM traffic"})
        assert status == 201
        # the sensors table: every header over its own value, power and lifetime filled
        assert main(["sensors", "--url", url]) == 0
        table = capsys.readouterr().out
        header = next(line for line in table.splitlines() if "power (mW)" in line)
        cells = [c.strip() for c in re.split(r"[│┃]", header) if c.strip()]
        assert cells == [
            "id",
            "stream",
            "status",
            "program",
            "rate (Hz)",
            "power (mW)",
            "battery",
            "lifetime (days)",
        ]
        row = next(line for line in table.splitlines() if "sim0000" in line)
        values = [c.strip() for c in row.split("│")[1:-1]]
        assert values[0] == "sim0000" and values[1] == "traffic"
        assert values[2] in ("online", "offline", "asleep")
        assert float(values[4]) > 0 and float(values[5]) > 0 and float(values[7]) > 0
        # explain: SQL-like text by default
        assert main(["explain", Q1, "--url", url]) == 0
        text = capsys.readouterr().out
        assert "groups:     segment IN ('S05', 'S14')" in text  # after the shared aggregate
        assert "frozenset" not in text and "{" not in text
    finally:
        err = _stop(proc)
    assert f"registered queries are kept in {where}" in err
    assert (where / "queries.sqlite3").is_file()
    proc, url = _run(tmp_path)  # the same user's next run finds its query again
    try:
        assert [q["id"] for q in _queries(url)] == [body["id"]]
    finally:
        _stop(proc)


def test_no_state_says_queries_are_not_kept(tmp_path) -> None:
    proc, url = _run(tmp_path, "--no-state")
    try:
        assert _post(url, {"sql": "SELECT station FROM traffic"})[0] == 201
    finally:
        err = _stop(proc)
    assert "registered queries are not kept" in err
    assert not (tmp_path / "xdg").exists()
    proc, url = _run(tmp_path, "--no-state")
    try:
        assert _queries(url) == []
    finally:
        _stop(proc)


def test_default_state_dir_follows_xdg(monkeypatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", "/data/u")
    assert default_state_dir() == Path("/data/u/fjords-gateway")
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")
    assert default_state_dir() == Path.home() / ".local/share/fjords-gateway"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert default_state_dir() == Path.home() / ".local/share/fjords-gateway"


# -- publish without [mqtt] --------------------------------------------------------------------


async def test_publish_mqtt_without_mqtt_section_is_400(tmp_path) -> None:
    cfg = Config()
    cfg.http.port = 0
    cfg.simulation = None
    async with Gateway(cfg) as gw:
        host, port = await gw.start_http()
        async with aiohttp.ClientSession(f"http://{host}:{port}") as http:
            for dry_run in (False, True):
                r = await http.post(
                    "/queries",
                    json={"sql": "SELECT * FROM traffic", "publish": "mqtt", "dry_run": dry_run},
                )
                assert r.status == 400
                assert "[mqtt]" in (await r.json())["error"]
            assert gw.query_ids() == []


# -- readable output ---------------------------------------------------------------------------


def test_times_print_as_utc_and_numbers_stay_numbers() -> None:
    from gateway.cli import cell_text

    assert cell_text(1330589700.0, "window_start") == "2012-03-01 08:15:00Z"
    assert cell_text(1330589700.25, "time") == "2012-03-01 08:15:00.250Z"
    assert cell_text(61.23456, "avg_speed") == "61.235"
    assert cell_text(None, "avg_speed") == ""


def test_explain_text_reads_as_sql() -> None:
    gw = Gateway()
    plan = gw.explain(Q1)
    plan["sensor_changes"] = [
        {
            "sensor": "m1",
            "before": {"program": "sleep", "sample_rate_hz": None, "power_mw": 0.03},
            "after": {
                "program": "raw",
                "sample_rate_hz": 1.0,
                "power_mw": 0.7,
                "battery_days": 28.0,  # as DemandFanOut.what_if names it
            },
            "reason": "a query needs speed",
        },
        {
            "sensor": "m2",
            "before": {"program": "raw", "sample_rate_hz": None},
            "after": {"program": "raw", "sample_rate_hz": 1.0},
            "consumers": ["archive", "q3"],
        },
    ]
    text = explain_text(Q1, plan)
    assert "segment IN ('S05', 'S14')" in text
    assert "operators:  finish (having+select) -> sink" in text
    assert (
        "m1: sleep, 0.030 mW -> raw at 1 Hz, 0.700 mW, 28.0 days  (a query needs speed)\n" in text
    )
    assert "m2: raw -> raw at 1 Hz  [now for archive, q3]" in text
    assert "frozenset" not in text


# -- --version, help -------------------------------------------------------------------------


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert re.fullmatch(r"fjords-gateway \S+\n", capsys.readouterr().out)


def _subcommands(parser) -> list[list[str]]:
    import argparse

    out = [[]]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += [[name, *rest] for rest in _subcommands(sub)]
    return out


def test_every_command_has_working_help(capsys) -> None:
    commands = _subcommands(build_parser())
    assert ["spark", "batch"] in commands and ["simulate-motes"] in commands
    for command in commands:
        with pytest.raises(SystemExit) as e:
            main([*command, "--help"])
        assert e.value.code == 0, command
        out = capsys.readouterr().out
        assert out.startswith("usage: fjords-gateway"), command
        if not command:
            assert "_feature_commands" not in out and "--version" in out


# -- one name for a trace file; run --trace --speedup ------------------------------------------


def test_trace_is_the_flag_everywhere_and_readings_an_alias() -> None:
    p = build_parser()
    for flag in ("--trace", "--readings"):
        args = p.parse_args(["replay", flag, "r.csv", "--query", "SELECT * FROM traffic"])
        assert args.readings == "r.csv"
        args = p.parse_args(["spark", "batch", flag, "r.csv", "--query", "SELECT * FROM traffic"])
        assert args.readings == "r.csv"
        args = p.parse_args(["run", flag, "r.csv", "--stations", "s.csv", "--speedup", "60"])
        assert (args.trace, args.speedup) == ("r.csv", 60.0)
    args = p.parse_args(["simulate-motes", "--trace", "r.csv", "--stations", "s.csv"])
    assert args.trace == "r.csv"


def test_python_m_fjords_takes_trace(tmp_path) -> None:
    trace = tmp_path / "r.csv"
    trace.write_text("time,station,speed\n0,a,10\n1,a,20\n")
    for flag in ("--trace", "--readings"):
        out = subprocess.run(
            [sys.executable, "-m", "fjords", flag, str(trace), "--query", "SELECT * FROM traffic"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert len(out.stdout.splitlines()) == 2


def test_speedup_needs_a_trace(capsys) -> None:
    assert main(["run", "--speedup", "10", "--no-state"]) == 2
    assert "--speedup needs --trace" in capsys.readouterr().err


async def test_run_trace_speedup_reaches_the_replay(tmp_path, monkeypatch) -> None:
    from gateway.sources import configure_sources
    from sensors.motes.replay import TraceReplayFleet

    trace, stations = tmp_path / "r.csv", tmp_path / "s.csv"
    trace.write_text("time,station,speed\n0,a,10\n1,a,20\n")
    stations.write_text("station,latitude,longitude,segment\na,34.0,-118.0,S1\n")
    seen: asyncio.Queue[float | None] = asyncio.Queue()

    async def run(self: TraceReplayFleet, speedup: float | None = None) -> None:
        seen.put_nowait(speedup)

    monkeypatch.setattr(TraceReplayFleet, "run", run)
    cfg = Config()
    cfg.simulation = None
    cfg.trace, cfg.stations = str(trace), str(stations)
    gw = Gateway(cfg)
    configure_sources(gw, trace_speedup=60.0)
    async with gw:
        assert await asyncio.wait_for(seen.get(), 30) == 60.0


def test_python_m_fjords_has_version(capsys) -> None:
    from fjords.__main__ import main as fjords_main

    with pytest.raises(SystemExit) as e:
        fjords_main(["--version"])
    assert e.value.code == 0
    assert re.fullmatch(r"python -m fjords \S+\n", capsys.readouterr().out)


# -- query ids a URL can name ------------------------------------------------------------------


def test_saved_queries_with_ids_no_url_can_name_are_renamed_not_lost(tmp_path: Path) -> None:
    """Ids saved before they were checked (`[[queries]] id = "a/b"` once went straight to the
    store) come back under ids that can be fetched and deleted, and the log says which."""
    from gateway.store import QueryStore
    from tests.daemon import Daemon

    state = tmp_path / "state"
    store = QueryStore(state)
    bad = ["a/b", "../../escape", "q#1", "ok-id"]
    for qid in bad:
        store.save(qid, "SELECT station, speed FROM traffic", {})
    store.mark_failed("q#1", "it failed before")
    store.close()
    with Daemon(tmp_path, args=("--state-dir", str(state))) as gw:
        listed = {q["id"]: q for q in gw.get("/queries")["queries"]}
        assert len(listed) == 4 and "ok-id" in listed
        renamed = sorted(set(listed) - {"ok-id"})
        assert all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", q) for q in renamed)
        assert any(listed[q].get("error") == "it failed before" for q in renamed)
        for old in ("a/b", "../../escape", "q#1"):
            assert re.search(rf"saved query {re.escape(repr(old))} has an id .* now '", gw.tail())
        for qid in renamed:
            assert gw.get(f"/queries/{qid}")["id"] == qid
            req = urllib.request.Request(f"{gw.url}/queries/{qid}", method="DELETE")
            assert urllib.request.urlopen(req, timeout=10).status in (200, 204)
        assert [q["id"] for q in gw.get("/queries")["queries"]] == ["ok-id"]
    assert [qid for qid, *_ in QueryStore(state).load_all()] == ["ok-id"]


def test_a_configured_query_id_must_be_one_a_url_can_name(tmp_path: Path, capsys) -> None:
    config = tmp_path / "g.toml"
    config.write_text('[[queries]]\nsql = "SELECT station FROM traffic"\nid = "a/b"\n')
    assert main(["run", "--config", str(config), "--no-state", "--check-config"]) == 2
    assert "[[queries]] #1 id: 'a/b' is not a query id" in capsys.readouterr().err


async def test_clients_cannot_choose_a_query_id_and_the_registry_refuses_bad_ones() -> None:
    from fjords.errors import QueryError

    cfg = Config()
    cfg.http.port = 0
    cfg.simulation = None
    async with Gateway(cfg) as gw:
        host, port = await gw.start_http()
        async with aiohttp.ClientSession(f"http://{host}:{port}") as http:
            r = await http.post("/queries", json={"sql": "SELECT * FROM traffic", "id": "a/b"})
            assert r.status == 400 and "id" in (await r.json())["error"]
        for bad in ("a/b", "../../escape", "q#1", "x" * 65):
            with pytest.raises(QueryError, match="is not a query id"):
                gw.add_query("SELECT * FROM traffic", {}, query_id=bad)
        assert gw.query_ids() == []
