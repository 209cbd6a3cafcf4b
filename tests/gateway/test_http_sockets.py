"""Sockets before authentication, against the real daemon: 2,000 half-open connections and a
flood of 2,000 POSTs from several clients, while a well-behaved client reads a result stream.

The daemon's caps are lowered by its configuration so the attack is cheap: the half-open
connections come from 20 loopback addresses (Linux routes all of 127/8 to lo), more than each
address may hold and more than the daemon's cap, and are closed once their headers are late;
the flood comes from 4 more addresses, a few of its POSTs accepted and the rest refused (429
past the write rate, 503 past the caps, or their idle connections closed to make room for the
attackers' newer ones: a flooding client holds many). Meanwhile the stream keeps
receiving rows (the simulated fleet at 600x sends a batch every ~0.8 s: no gap of 10 s is
allowed, where a flood used to stall streams 13 s), /healthz answers (within 5 s: the issue asks
for a second, which a loaded 2-core CI machine could miss for reasons of its own), the daemon's
file descriptors stay under its cap plus the guard's headroom, and every refusal is counted.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import os
import resource
import socket
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from gateway.http_guard import BACKLOG, MAX_REFUSING
from tests.daemon import Daemon
from tests.support import async_eventually

MAX_CONNECTIONS = 128
PER_CLIENT = 8
HEADER_TIMEOUT_S = 2
HALF_OPEN = 2000
ATTACKERS = [f"127.0.0.{i}" for i in range(2, 22)]
FLOODERS = [f"127.0.0.{i}" for i in range(101, 105)]
POSTS = 2000
CONCURRENT = 64
STREAM = "SELECT station, speed FROM traffic"
FLOOD = "SELECT segment, AVG(speed) AS a FROM traffic [RANGE {} MINUTES] GROUP BY segment"


def config(tmp: Path) -> str:
    return (
        f"header_timeout_s = {HEADER_TIMEOUT_S}\n"
        f"max_connections = {MAX_CONNECTIONS}\n"
        f"max_connections_per_client = {PER_CLIENT}\n"
        "write_rate_per_s = 5\nwrite_burst = 10\n"
        f'[state]\ndir = "{tmp / "state"}"\n'
        "[simulation]\nspeedup = 600\n"
    )


@pytest.fixture
def sockets_allowed() -> Iterator[int]:
    """This process's own open-files limit raised for the attack (restored after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = HALF_OPEN + 1000
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"this test opens {HALF_OPEN} sockets; the hard open-files limit is {hard}")
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    yield want
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def open_half(port: int, n: int, wave: int = 50) -> list[socket.socket]:
    """`n` connections that never send a byte, from the attackers' addresses in turn; opened in
    waves the daemon's listen backlog takes (beyond it the kernel drops the handshakes, and
    those sockets would connect in a minute's retries, not now)."""
    socks = []
    for i in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.bind((ATTACKERS[i % len(ATTACKERS)], 0))
        err = s.connect_ex(("127.0.0.1", port))
        assert err in (0, errno.EINPROGRESS), os.strerror(err)
        socks.append(s)
        if i % wave == wave - 1:
            await asyncio.sleep(0.02)
    return socks


def still_open(socks: list[socket.socket]) -> Counter:
    """`socks` by state: closed by the daemon (what it wrote first is read), open, or
    still connecting."""
    states: Counter = Counter()
    for s in socks:
        try:
            while s.recv(65536):
                pass
            states["closed"] += 1
        except BlockingIOError:
            states["open"] += 1
        except OSError as e:
            states["connecting" if e.errno == errno.ENOTCONN else "closed"] += 1
    return states


async def flood(url: str, addr: str, n: int, concurrent: int) -> tuple[Counter, list[str]]:
    """`n` POSTs from `addr`, `concurrent` at a time: their statuses (or errors) counted, and
    the Retry-After of each 429."""
    codes: Counter = Counter()
    retry_after: list[str] = []
    sem = asyncio.Semaphore(concurrent)
    connector = aiohttp.TCPConnector(local_addr=(addr, 0), limit=concurrent)
    async with aiohttp.ClientSession(connector=connector) as http:

        async def one(i: int) -> None:
            async with sem:
                try:
                    async with http.post(
                        f"{url}/queries",
                        json={"sql": FLOOD.format(i % 50 + 1)},
                        timeout=aiohttp.ClientTimeout(total=30),
                    ) as r:
                        await r.read()
                        codes[r.status] += 1
                        if r.status == 429:
                            retry_after.append(r.headers.get("Retry-After", ""))
                except (aiohttp.ClientError, TimeoutError) as e:
                    codes[type(e).__name__] += 1

        await asyncio.gather(*(one(i) for i in range(n)))
    return codes, retry_after


class FdWatch(threading.Thread):
    """The daemon's open file descriptors (/proc/<pid>/fd), their peak, sampled often."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.path = f"/proc/{pid}/fd"
        self.peak = 0
        self.stop = threading.Event()

    def count(self) -> int:
        return len(os.listdir(self.path))

    def run(self) -> None:
        while not self.stop.wait(0.01):
            try:
                self.peak = max(self.peak, self.count())
            except OSError:
                return


def healthz(url: str) -> dict:
    """/healthz on a connection of its own, answered within 5 s (else this raises)."""
    with urllib.request.urlopen(f"{url}/healthz", timeout=5) as r:
        assert r.status == 200
        return json.loads(r.read())


def metric(text: str, name: str, reason: str | None = None) -> float:
    """A sample of /metrics' `text`: `name`, with `reason` its label if given."""
    want = name if reason is None else f'{name}{{reason="{reason}"}}'
    for line in text.splitlines():
        key, _, value = line.rpartition(" ")
        if key == want:
            return float(value)
    raise AssertionError(f"{want} is not in /metrics")


async def test_half_open_sockets_and_a_post_flood_leave_streams_and_healthz_alone(
    tmp_path: Path, sockets_allowed: int
) -> None:
    with Daemon(tmp_path, config(tmp_path)) as gw:
        assert gw.proc is not None
        qid = gw.post("/queries", {"sql": STREAM})["id"]
        arrivals: list[float] = []

        async def read_stream() -> None:
            async with (
                aiohttp.ClientSession() as http,
                http.get(
                    f"{gw.url}/queries/{qid}/results?format=ndjson",
                    timeout=aiohttp.ClientTimeout(total=None),
                ) as r,
            ):
                async for line in r.content:
                    if line.strip():
                        arrivals.append(time.monotonic())

        reader = asyncio.create_task(read_stream())
        await async_eventually(lambda: len(arrivals), message="the stream's first rows")
        fds = FdWatch(gw.proc.pid)
        baseline = fds.count()
        fds.start()
        socks: list[socket.socket] = []
        try:
            start = time.monotonic()
            socks = await open_half(gw.port, HALF_OPEN)
            flooding = asyncio.gather(
                *(flood(gw.url, a, POSTS // len(FLOODERS), CONCURRENT // 4) for a in FLOODERS)
            )
            answers = []
            while not flooding.done():
                answers.append(await asyncio.to_thread(healthz, gw.url))
                await asyncio.sleep(0.3)
            results = await flooding
            answers.append(await asyncio.to_thread(healthz, gw.url))
            # Every half-open connection is closed: refused at once, or its headers late.
            await async_eventually(
                lambda: still_open(socks),
                lambda states: states["closed"] == len(socks),
                message="the daemon closes every half-open connection",
                timeout=20,
                interval=0.5,
            )
            end = time.monotonic()
            await async_eventually(
                lambda: arrivals[-1] > end, message="rows after the attack", timeout=10
            )
        finally:
            fds.stop.set()
            for s in socks:
                s.close()
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

        during = [start, *(t for t in arrivals if start <= t <= end), end]
        longest = max(b - a for a, b in itertools.pairwise(during))
        assert longest < 10, f"the stream went {longest:.1f} s without a row during the attack"
        assert all(a["status"] in ("ok", "degraded") for a in answers)
        headroom = MAX_REFUSING + 3 * BACKLOG + 32  # (refused, and in transit: http_guard.py)
        assert fds.peak <= baseline + MAX_CONNECTIONS + headroom, (fds.peak, baseline)

        codes = sum((c for c, _ in results), Counter())
        assert codes[429] > 0, codes
        assert all(r.isdigit() and int(r) >= 1 for _, ra in results for r in ra)
        assert codes[500] == 0, codes
        text = urllib.request.urlopen(f"{gw.url}/metrics", timeout=10).read().decode()
        assert metric(text, "fjords_http_requests_refused_total", "rate_limited") >= codes[429]
        per_client = "max_connections_per_client"
        assert metric(text, "fjords_http_connections_refused_total", per_client) > 0
        assert metric(text, "fjords_http_connections_closed_total", "header_timeout") > 0
        assert 1 <= metric(text, "fjords_http_connections") <= 5  # this scrape, ones just closed
        log = gw.tail(20_000)
        assert "header_timeout_s" in log and "write_rate_per_s" in log, log
