"""`fjords-gateway` as a user runs it: a real subprocess, a real port, SIGTERM to stop."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from gateway.cli import main
from tests.gateway.conftest import CliRun
from tests.support import ROOT, eventually, free_port


def test_run_serves_and_stops_cleanly_on_sigterm(daemon, capsys) -> None:
    url, proc = daemon
    assert (
        main(
            [
                "explain",
                "SELECT segment, AVG(speed) FROM traffic [RANGE 1 MINUTE] GROUP BY segment",
                "--url",
                url,
                "--json",
            ]
        )
        == 0
    )
    plan = json.loads(capsys.readouterr().out)
    assert plan["shape"] == "windowed aggregate"
    assert main(["explain", "SELECT FROM", "--url", url]) == 2
    assert "expected" in capsys.readouterr().err
    assert main(["sensors", "--url", url, "--json"]) == 0
    sensors = json.loads(capsys.readouterr().out)
    assert {s["id"] for s in sensors} >= {"sim0000", "pair1-u", "pair1-d"}  # the embedded fleet
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    assert time.monotonic() - start < 10
    logs = [json.loads(line) for line in proc.stderr.read().splitlines() if line.startswith("{")]
    assert any(entry["message"] == "shutting down" for entry in logs)


def test_embedded_defaults_produce_results_through_motes_and_proxies(daemon) -> None:
    import urllib.request

    url, _ = daemon
    req = urllib.request.Request(
        f"{url}/queries",
        method="POST",
        headers={"Content-Type": "application/json"},
        data=json.dumps(
            {"sql": "SELECT segment, COUNT(*) AS n FROM traffic [RANGE 5 MINUTES] GROUP BY segment"}
        ).encode(),
    )
    qid = json.loads(urllib.request.urlopen(req, timeout=10).read())["id"]
    with urllib.request.urlopen(f"{url}/queries/{qid}/results?format=ndjson", timeout=60) as resp:
        row = json.loads(resp.readline())
    assert row["segment"].startswith("S") and row["n"] > 0
    assert row["window_end"] - row["window_start"] == 300
    sensors = json.loads(urllib.request.urlopen(f"{url}/sensors", timeout=10).read())["sensors"]
    station = next(s for s in sensors if s["id"] == "sim0000")
    assert station["status"] == "online" and station["stream"] == "traffic"


def test_clients_report_an_unreachable_gateway(capsys) -> None:
    assert main(["sensors", "--url", f"http://127.0.0.1:{free_port()}"]) == 1
    assert "cannot reach" in capsys.readouterr().err


def test_bad_config_is_a_clear_error(tmp_path, capsys) -> None:
    cfg = tmp_path / "g.toml"
    cfg.write_text("[http]\nprot = 1\n")
    assert main(["run", "--config", str(cfg)]) == 2
    assert "[http] unknown key 'prot'; known: host, port" in capsys.readouterr().err
    assert main(["run", "--config", str(tmp_path / "missing.toml")]) == 2


def test_the_example_config_loads() -> None:
    from gateway.config import Config

    cfg = Config.load(ROOT / "gateway.example.toml")
    assert cfg.http.port == 8080 and cfg.archive.segment_rows == 50_000


def test_query_client_prints_rows_and_removes_its_query_on_ctrl_c(daemon) -> None:
    import urllib.request

    url, _ = daemon
    client = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "query",
            "--json",
            "--url",
            url,
            "SELECT station, speed FROM traffic WHERE speed > 0",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        row = json.loads(client.stdout.readline())
        assert set(row) == {"station", "speed"}
        queries = json.loads(urllib.request.urlopen(f"{url}/queries", timeout=10).read())["queries"]
        assert len(queries) == 1
        client.send_signal(signal.SIGINT)
        client.wait(timeout=10)
    finally:
        if client.poll() is None:
            client.kill()
    queries = json.loads(urllib.request.urlopen(f"{url}/queries", timeout=10).read())["queries"]
    assert queries == []  # Ctrl-C removed it


@pytest.mark.parametrize(
    ("toml", "extra_args", "message"),
    [
        ('[http]\nport = "abc"\n', [], "[http] port: expected int, got str"),
        ('[runtime]\nmax_lag_seconds = "x"\n', [], "[runtime] max_lag_seconds: expected float"),
        ('[http]\ntoken = ""\n', [], "[http] token: an empty token would disable authentication"),
        ('[http]\nhost = "0.0.0.0"\n', [], "allow_unauthenticated = true"),
        ("", ["--http", "0.0.0.0:{port}"], "'0.0.0.0' is reachable from other machines"),
        ("[mqtt]\nqos = 5\n", [], "[mqtt] qos: invalid enum value 5"),
    ],
)
def test_run_refuses_bad_config_with_exit_2(
    tmp_path,
    cli: CliRun,
    toml: str,
    extra_args: list[str],
    message: str,
) -> None:
    cfg = tmp_path / "g.toml"
    cfg.write_text(toml)
    port = free_port()
    proc = cli("run", "--config", str(cfg), *(a.format(port=port) for a in extra_args))
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_run_exposed_without_token_only_when_allowed_and_warns(tmp_path) -> None:
    import urllib.request

    port = free_port()
    cfg = tmp_path / "g.toml"
    cfg.write_text(
        f'[http]\nhost = "0.0.0.0"\nport = {port}\nallow_unauthenticated = true\n'
        '[spark]\nmaster = "local[1]"\ndriver_memory = "1g"\n[spark.conf]\n"spark.ui.port" = 4041\n'
        "[simulation]\nenabled = false\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "run", "--config", str(cfg)],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )

    def healthy() -> bool:
        assert proc.poll() is None, proc.stderr.read()
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
        return True

    try:
        eventually(healthy, message="the gateway answers /healthz", retry_on=(OSError,))
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0
    err = proc.stderr.read()
    assert "WARNING" in err and "without a token" in err


def test_clients_send_the_token_for_reads_too(tmp_path, capsys) -> None:
    port = free_port()
    cfg = tmp_path / "g.toml"
    cfg.write_text(f'[http]\nport = {port}\ntoken = "t0k"\n[simulation]\nstations = 2\n')
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "run", "--config", str(cfg)],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        assert proc.poll() is None, proc.stderr.read()
        return main(["sensors", "--url", url, "--token", "t0k", "--json"]) == 0

    try:
        eventually(answers, message="`sensors --token t0k` answers", interval=0.2)
        assert json.loads(capsys.readouterr().out)
        assert main(["sensors", "--url", url, "--json"]) == 2
        assert "Authorization: Bearer" in capsys.readouterr().err
        assert main(["explain", "SELECT * FROM traffic", "--url", url, "--token", "t0k"]) == 0
    finally:
        proc.terminate()
        proc.wait(timeout=20)
