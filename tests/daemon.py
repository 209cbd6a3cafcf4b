"""The real daemon, `fjords-gateway run` in a subprocess, as an operator runs it: one place that
starts it, waits for it, talks JSON to it, reads a metric, and stops it (SIGTERM, bounded)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support import ROOT, eventually, free_port


class Daemon:
    """`with Daemon(tmp_path, "[mqtt]\\n...") as gw:` writes the config (the HTTP port is added),
    starts the daemon and waits for /healthz; leaving stops it with SIGTERM and checks it exits 0."""

    def __init__(self, tmp: Path, config: str = "", *, args: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = tmp / "gateway.toml"
        self.config.write_text(f"[http]\nport = {self.port}\n{config}")
        self.log = tmp / "gateway.log"
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, seconds: float = 30) -> Daemon:
        cmd = [sys.executable, "-m", "gateway.cli", "run", "--config", str(self.config)]
        with self.log.open("a") as log:
            self.proc = subprocess.Popen([*cmd, *self.args], cwd=ROOT, stderr=log)
        wait_healthy(self.url, self.proc, seconds, log=self.tail)
        return self

    def stop(self, seconds: float = 20) -> int:
        """SIGTERM; the daemon must be gone within `seconds`. Returns its exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("the daemon did not stop on SIGTERM") from None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text()[-n:] if self.log.exists() else ""

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> Daemon:
        return self if self.running else self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            code = self.stop()
            if exc[0] is None:
                assert code == 0, self.tail()

    # -- talking to it ------------------------------------------------------------------------
    def get(self, path: str, timeout: float = 10) -> Any:
        return json.loads(urllib.request.urlopen(f"{self.url}{path}", timeout=timeout).read())

    def post(self, path: str, body: object, timeout: float = 10) -> Any:
        """POST JSON; returns the decoded answer (an HTTP error raises with its body)."""
        req = urllib.request.Request(
            f"{self.url}{path}",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            return json.loads(urllib.request.urlopen(req, timeout=timeout).read())
        except urllib.error.HTTPError as e:
            raise AssertionError(f"POST {path}: {e.code} {e.read().decode()}") from None

    def metric(self, name: str) -> float:
        """The sum of a Prometheus counter or gauge over all its label sets."""
        text = urllib.request.urlopen(f"{self.url}/metrics", timeout=10).read().decode()
        total = 0.0
        for line in text.splitlines():
            m = re.match(rf"{name}(?:\{{[^}}]*\}})? (\S+)$", line)
            if m:
                total += float(m.group(1))
        return total


def wait_healthy(
    url: str, proc: subprocess.Popen, seconds: float = 30, *, log: Callable[[], str] | None = None
) -> None:
    """Wait until the daemon `proc` answers /healthz at `url`; fail at once if it exits, and
    kill it if it does not answer within `seconds`, so a failed start leaves no daemon behind.
    `log()`, read only on failure, is what it wrote (say `proc.stderr.read` for a pipe)."""

    def said() -> str:
        return f": {log()}" if log is not None else ""

    def healthy() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the daemon exited {proc.returncode}{said()}")
        urllib.request.urlopen(f"{url}/healthz", timeout=1)
        return True

    try:
        eventually(
            healthy,
            message=f"the daemon answers {url}/healthz",
            timeout=seconds,
            retry_on=(OSError,),
        )
    except AssertionError as e:
        if proc.poll() is not None:
            raise
        proc.kill()
        proc.wait(timeout=10)
        raise AssertionError(f"the daemon did not start. {e}{said()}") from None
