"""Fixtures shared by the gateway tests: `daemon`, `fjords-gateway run` in a subprocess."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from tests.support import ROOT, eventually, free_port


@pytest.fixture
def daemon(tmp_path):
    """`(url, proc)` of a daemon with its state in `tmp_path` and JSON logs on its stderr pipe,
    once its HTTP port accepts connections; killed after the test if it still runs."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            "run",
            "--http",
            f"127.0.0.1:{port}",
            "--state-dir",
            str(tmp_path),
            "--log-format",
            "json",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"

    def listening() -> bool:
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read())
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True

    try:
        eventually(listening, message=f"the daemon listens on {url}", retry_on=(OSError,))
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


#: what `cli` returns: the exit code and stderr of one `fjords-gateway` command
CliRun = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Iterator[CliRun]:
    """`cli(*args)`: `fjords-gateway *args` in this process (`gateway.cli.main`), its exit code
    and stderr as a CompletedProcess: the command's own code without a Python start per case
    (a traceback fails the test). The command sets up the root logger: restored after."""
    from gateway.cli import main

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        capsys.readouterr()
        code = main(list(args))
        return subprocess.CompletedProcess(
            ["fjords-gateway", *args], code, "", capsys.readouterr().err
        )

    try:
        yield run
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
