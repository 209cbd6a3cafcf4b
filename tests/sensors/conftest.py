"""Fixtures for the sensor tests: a private Mosquitto broker on a free loopback port."""

from __future__ import annotations

import getpass
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import free_port, require_binary


class Broker:
    """A mosquitto process we own; `restart()` kills it hard and starts it again, same port."""

    def __init__(self, binary: str, workdir: Path, *, persistent: bool = False) -> None:
        self.binary = binary
        self.host = "127.0.0.1"
        self.port = free_port()
        self.config = workdir / "mosquitto.conf"
        self.log = workdir / "mosquitto.log"
        # persistent: sessions, subscriptions and queued messages survive a restart (saved on
        # a clean shutdown, as `systemctl restart mosquitto` does).
        persistence = (
            f"persistence true\npersistence_location {workdir}/\n"
            if persistent
            else "persistence false\n"
        )
        self.config.write_text(
            f"listener {self.port} {self.host}\n"
            # Started as root, mosquitto would become user `mosquitto` and could not write here.
            f"user {getpass.getuser()}\n"
            "allow_anonymous true\n"
            f"{persistence}"
            "max_queued_messages 100000\n"
            f"log_dest file {self.log}\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "-c", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"mosquitto exited with {self.proc.returncode}: {err}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"mosquitto did not listen on {self.host}:{self.port}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def restart_cleanly(self) -> None:
        """SIGTERM (the broker saves its state) and start again on the same port."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None
        self.start()


@pytest.fixture
def persistent_broker(tmp_path: Path) -> Iterator[Broker]:
    binary = require_binary("mosquitto", "mosquitto")
    b = Broker(binary, tmp_path, persistent=True)
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    binary = require_binary("mosquitto", "mosquitto")
    b = Broker(binary, tmp_path)
    b.start()
    try:
        yield b
    finally:
        b.stop()
