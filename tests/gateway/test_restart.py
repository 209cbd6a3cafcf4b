"""A gateway killed hard (SIGKILL) and started again: its queries come back, its archive is whole."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request

import pyarrow.parquet as pq

from gateway.archive import segments
from tests.gateway.test_cli import free_port
from tests.support import ROOT


def start(config, url: str) -> subprocess.Popen:  # noqa: ANN001
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "run", "--config", str(config)],
        cwd=ROOT,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/healthz", timeout=1)
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("gateway did not start")


def test_queries_and_archive_survive_sigkill(tmp_path) -> None:  # noqa: ANN001
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    config = tmp_path / "gateway.toml"
    config.write_text(
        f'[http]\nport = {port}\n[state]\ndir = "{tmp_path / "state"}"\n'
        f'[archive]\ndir = "{tmp_path / "archive"}"\nsegment_rows = 40\n'
        "[simulation]\nstations = 20\nsegments = 4\nspeedup = 600\ntraffic_pair = false\n"
    )
    proc = start(config, url)
    sql = "SELECT segment, AVG(speed) AS a FROM traffic [RANGE 15 MINUTES] GROUP BY segment"
    req = urllib.request.Request(
        f"{url}/queries",
        data=json.dumps({"sql": sql}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    qid = json.loads(urllib.request.urlopen(req, timeout=10).read())["id"]
    archive = tmp_path / "archive" / "traffic"
    deadline = time.monotonic() + 60
    while len(segments(archive)) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    before = segments(archive)
    assert len(before) >= 3
    for seg in before:  # every visible segment is whole, whatever the kill interrupted
        assert 0 < pq.read_table(seg).num_rows <= 40
    proc = start(config, url)
    try:
        queries = json.loads(urllib.request.urlopen(f"{url}/queries", timeout=10).read())["queries"]
        assert [(q["id"], q["sql"]) for q in queries] == [(qid, sql)]
        assert not any(p.name.startswith(".") for p in archive.iterdir())  # crash leftovers removed
        deadline = time.monotonic() + 60
        while len(segments(archive)) <= len(before) and time.monotonic() < deadline:
            time.sleep(0.1)
        after = segments(archive)
        assert after[: len(before)] == before and len(after) > len(before)  # numbering continues
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0
