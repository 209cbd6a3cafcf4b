"""The archive writer against a fake failing filesystem (writes raising OSError): failures counted
by reason and logged once per reason, the gateway degraded until a write succeeds, no temporary
file left, and a shutdown flush bounded whatever the disk does (tests/gateway/test_archive_faults.py
does the same with real full and read-only mounts)."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import gateway.archive as archive
from fjords.runtime.fjord import Fjord
from gateway.archive import ArchiveWriter, error_reason, remove_temp_files, segments
from gateway.config import Config, ConfigError
from gateway.daemon import TRAFFIC_SCHEMA, Gateway
from gateway.drops import drop_counts
from gateway.metrics import render
from tests.support import ROOT, async_eventually


def rows(n: int, start: float = 0.0) -> list[tuple]:
    return [(start + i, f"st{i % 3}", float(i), 34.0, -118.0, "S1") for i in range(n)]


def fjord() -> Fjord:
    f = Fjord()
    f.add_stream("traffic", TRAFFIC_SCHEMA, sensor_field="station")
    return f


class Disk:
    """`commit_segment` failing with `errno` until `heal()`; counts the attempts."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, code: int = errno.ENOSPC) -> None:
        self.code: int | None = code
        self.attempts = 0
        self.real = archive.commit_segment
        monkeypatch.setattr(archive, "commit_segment", self)

    def heal(self) -> None:
        self.code = None

    def __call__(self, *a, **kw):
        self.attempts += 1
        if self.code is not None:
            raise OSError(self.code, "fake: " + errno.errorcode[self.code])
        return self.real(*a, **kw)


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (errno.ENOSPC, "no_space"),
        (errno.EDQUOT, "no_space"),
        (errno.EROFS, "read_only"),
        (errno.EACCES, "permission"),
        (errno.EPERM, "permission"),
        (errno.EIO, "io"),
        (errno.EMFILE, "too_many_files"),
        (errno.ENFILE, "too_many_files"),
        (errno.EBADF, "io"),
    ],
)
def test_an_errno_reads_as_what_to_fix(code: int, reason: str) -> None:
    assert error_reason(OSError(code, "x")) == reason
    assert error_reason(OSError("no errno")) == "io"


async def test_a_full_disk_is_counted_logged_once_degraded_and_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    disk = Disk(monkeypatch)
    f = fjord()
    caplog.set_level(logging.WARNING, logger="gateway.archive")
    async with ArchiveWriter(
        f,
        "traffic",
        tmp_path,
        segment_rows=10,
        retry_seconds=0.01,
        max_retry_seconds=0.02,
        shutdown_timeout_s=1,
    ) as arch:
        for t in rows(30):
            f.push("traffic", t)
        f.run_until_idle()
        await async_eventually(lambda: arch.errors.get("no_space", 0), lambda n: n >= 5)
        assert disk.attempts >= 5
        (reason,) = arch.health()
        assert reason.startswith("archive traffic cannot write: no space left on device (since ")
        assert arch.status()["cannot_write"]["reason"] == "no_space"
        failures = [r for r in caplog.records if "cannot write" in r.getMessage()]
        assert len(failures) == 1  # logged the first time, counted every time
        assert arch.rows_written == 0 and arch.pending_rows() == 30  # kept, to be retried
        disk.heal()
        await async_eventually(arch.health, lambda rs: rs == [], interval=0.01)
        assert arch.status()["cannot_write"] is None
        assert any("writes again" in r.getMessage() for r in caplog.records)
    assert arch.rows_written == 30 and arch.rows_unwritten == 0
    got = [tuple(r.values()) for p in segments(tmp_path / "traffic") for r in pq.read_table(p, columns=list(TRAFFIC_SCHEMA.names)).to_pylist()]  # fmt: skip
    assert got == rows(30)


async def test_each_reason_is_logged_once_then_rate_limited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    disk = Disk(monkeypatch, errno.EROFS)
    f = fjord()
    caplog.set_level(logging.ERROR, logger="gateway.archive")
    arch = ArchiveWriter(f, "traffic", tmp_path, segment_rows=5, retry_seconds=0.01)
    arch.backoff.maximum = 0.01
    async with arch:
        for t in rows(10):
            f.push("traffic", t)
        f.run_until_idle()
        await async_eventually(lambda: disk.attempts, lambda n: n >= 3, interval=0.01)
        disk.code = errno.EMFILE
        await async_eventually(lambda: arch.errors.get("too_many_files", 0), lambda n: n >= 3)
        assert "too many open files" in arch.health()[0]
        disk.heal()
        await async_eventually(arch.health, lambda rs: rs == [], interval=0.01)
    said = [r.getMessage() for r in caplog.records if "cannot write" in r.getMessage()]
    assert len(said) == 2, said
    assert "read-only file system" in said[0] and "too many open files" in said[1]


async def test_a_failed_write_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills half-way through a segment: the partial temporary file goes too."""
    real = pq.write_table
    fail = {"on": True}

    def half(table, where, *a, **kw):
        if fail["on"]:
            where.write(b"PAR1 half a segment")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(table, where, *a, **kw)

    monkeypatch.setattr(pq, "write_table", half)
    f = fjord()
    async with ArchiveWriter(f, "traffic", tmp_path, segment_rows=5, retry_seconds=0.01) as arch:
        for t in rows(10):
            f.push("traffic", t)
        f.run_until_idle()
        await async_eventually(lambda: arch.write_errors, lambda n: n >= 3, interval=0.01)
        assert not any(p.name.endswith(".tmp") for p in (tmp_path / "traffic").rglob("*"))
        fail["on"] = False
    assert arch.rows_written == 10
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "traffic").rglob("*"))


def test_orphans_are_removed_at_start_counted_and_only_ours(tmp_path: Path) -> None:
    d = tmp_path / "traffic"
    d.mkdir()
    ours = [d / ".part-00000003-0123456789ab.parquet.tmp", d / ".part-00000004-ff.parquet.tmp"]
    theirs = [d / ".part-notes.tmp", d / "part-x.tmp", d / ".other.parquet.tmp"]
    for p in ours + theirs:
        p.write_bytes(b"x")
    arch = ArchiveWriter(fjord(), "traffic", tmp_path)
    assert arch.temp_files_removed == 2
    assert not any(p.exists() for p in ours) and all(p.exists() for p in theirs)
    assert remove_temp_files(tmp_path / "missing") == 0


async def test_an_orphan_left_beside_a_failing_write_is_swept_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A temporary file the failed write itself could not remove, or one an abandoned write left:
    swept after the next failure (no write of this directory is under way then)."""
    Disk(monkeypatch)
    f = fjord()
    async with ArchiveWriter(f, "traffic", tmp_path, segment_rows=5, retry_seconds=0.01) as arch:
        date_dir = Path(arch.gateway_dir) / "date=1970-01-01"  # where rows(5) go
        date_dir.mkdir(parents=True)
        orphan = date_dir / ".part-00000000-abcdef.parquet.tmp"
        orphan.write_bytes(b"x")
        for t in rows(5):
            f.push("traffic", t)
        f.run_until_idle()
        await async_eventually(lambda: arch.temp_files_removed, lambda n: n >= 1, interval=0.01)
        assert not orphan.exists()
        arch.shutdown_timeout_s = 0.05


async def test_the_shutdown_flush_ends_by_its_timeout_counting_what_it_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    Disk(monkeypatch, errno.EIO)
    cfg = Config()
    cfg.archive.dir = str(tmp_path)
    cfg.archive.segment_rows = 4
    cfg.archive.shutdown_timeout_s = 0.3
    cfg.simulation = None
    gw = Gateway(cfg)
    arch = gw.archives["traffic"]
    async with gw:
        for t in rows(10):
            gw.fjord.push("traffic", t)
        gw.fjord.run_until_idle()
        await async_eventually(lambda: arch.write_errors, lambda n: n >= 1, interval=0.01)
        assert any("archive traffic cannot write: input/output error" in r for r in gw.health()["reasons"])  # fmt: skip
        text = render(gw.fjord, gw.sensors, gw.hub_stats, archives={"traffic": arch.status()})
        assert b'fjords_archive_errors_total{reason="io",stream="traffic"}' in text
        assert b'fjords_archive_cannot_write{stream="traffic"} 1.0' in text
        loop = asyncio.get_running_loop()
        t0 = loop.time()
    assert loop.time() - t0 < 10  # the timeout is 0.3 s; the rest is slack for a loaded machine
    assert arch.rows_unwritten == 10
    assert drop_counts(gw)["archive", "unwritten_at_shutdown"] == 10
    assert any("10 rows not written" in r.getMessage() for r in caplog.records)


async def test_a_failing_archive_does_not_hold_the_links_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Holding the intake is for a slow disk; a refusing one may last for hours, and the live
    queries would get nothing meanwhile: rows past the writer's bound are dropped, counted."""
    Disk(monkeypatch)
    cfg = Config()
    cfg.archive.dir = str(tmp_path)
    cfg.archive.shutdown_timeout_s = 0.1
    cfg.simulation = None
    gw = Gateway(cfg)
    arch = gw.archives["traffic"]
    arch.op.pending_rows = arch.op.max_pending_rows
    assert gw.intake_full()
    arch.failing = archive.WriteFailure("no_space", "no space left on device", 0.0)
    assert not gw.intake_full()


def test_a_write_blocked_in_the_kernel_does_not_keep_the_process_alive(tmp_path: Path) -> None:
    """A write that never returns (a dead NFS server): past shutdown_timeout_s the process still
    exits, as it would not if the write ran in asyncio's default executor (joined at exit)."""
    script = textwrap.dedent(
        f"""
        import asyncio, threading
        import gateway.archive as archive
        from fjords.runtime.fjord import Fjord
        from gateway.daemon import TRAFFIC_SCHEMA

        forever = threading.Event()
        archive.commit_segment = lambda *a, **kw: forever.wait()

        async def main():
            f = Fjord()
            f.add_stream("traffic", TRAFFIC_SCHEMA, sensor_field="station")
            w = archive.ArchiveWriter(f, "traffic", {str(tmp_path)!r}, shutdown_timeout_s=0.2)
            async with w:
                f.push("traffic", (0.0, "s", 1.0, 0.0, 0.0, "S"))
            print("unwritten", w.rows_unwritten, flush=True)

        asyncio.run(main())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "unwritten 1" in done.stdout


def test_the_writer_runs_in_daemon_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the test above relies on."""
    seen: list[bool] = []
    real = archive._write_many

    def spy(*a):
        seen.append(threading.current_thread().daemon)
        return real(*a)

    async def run() -> None:
        f = fjord()
        async with ArchiveWriter(f, "traffic", tmp_path):
            f.push("traffic", rows(1)[0])

    monkeypatch.setattr(archive, "_write_many", spy)
    asyncio.run(run())
    assert seen and all(seen)


@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan", "1e308", '"10"'])
def test_shutdown_timeout_is_a_bounded_number_of_seconds(tmp_path: Path, value: str) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(f"[archive]\nshutdown_timeout_s = {value}\n")
    with pytest.raises(ConfigError, match=r"\[archive\] shutdown_timeout_s"):
        Config.load(path)


async def test_status_healthz_and_metrics_show_it_as_documented(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import aiohttp

    from tests.gateway.test_openapi import call

    Disk(monkeypatch, errno.ENOSPC)
    cfg = Config()
    cfg.http.port = 0
    cfg.archive.dir = str(tmp_path)
    cfg.archive.segment_rows = 2
    cfg.archive.shutdown_timeout_s = 0.1
    cfg.simulation = None
    async with Gateway(cfg) as gw:
        host, port = await gw.start_http()
        for t in rows(4):
            gw.fjord.push("traffic", t)
        gw.fjord.run_until_idle()
        await async_eventually(lambda: gw.archives["traffic"].failing is not None)
        async with aiohttp.ClientSession() as http:
            base = f"http://{host}:{port}"
            status = json.loads((await call(http, base, "GET", "/status")).data)
            health = json.loads((await call(http, base, "GET", "/healthz")).data)
            metrics = (await call(http, base, "GET", "/metrics")).data.decode()
    traffic = status["archive"]["traffic"]
    assert traffic["cannot_write"]["reason"] == "no_space" and traffic["errors"]["no_space"] >= 1
    assert health["status"] == "degraded"
    assert any(r.startswith("archive traffic cannot write: no space") for r in health["reasons"])
    assert 'fjords_archive_errors_total{reason="no_space",stream="traffic"}' in metrics
    assert 'fjords_archive_cannot_write{stream="traffic"} 1.0' in metrics


async def test_no_thread_to_write_in_is_a_failed_write_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = threading.Thread.start
    refusals = {"n": 2}

    def start(self: threading.Thread) -> None:
        if self.name.startswith("archive-write:") and refusals["n"]:
            refusals["n"] -= 1
            raise RuntimeError("can't start new thread")
        real(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    f = fjord()
    async with ArchiveWriter(f, "traffic", tmp_path, segment_rows=5, retry_seconds=0.01) as arch:
        for t in rows(5):
            f.push("traffic", t)
        f.run_until_idle()
        await async_eventually(lambda: arch.rows_written, lambda n: n == 5)
    assert arch.errors == {"io": 2} and arch.failing is None


def test_orphans_on_a_read_only_disk_at_start_are_logged_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "traffic"
    d.mkdir()
    (d / ".part-00000000-abc.parquet.tmp").write_bytes(b"x")

    def refuse(self: Path, missing_ok: bool = False) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(Path, "unlink", refuse)
    arch = ArchiveWriter(fjord(), "traffic", tmp_path)
    assert arch.temp_files_removed == 0
    assert any("cannot remove the temporary files" in r.getMessage() for r in caplog.records)
