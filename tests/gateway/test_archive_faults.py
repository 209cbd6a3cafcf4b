"""The real daemon with its archive on a full and on a read-only filesystem (small tmpfs mounts):
/healthz says degraded and why, `fjords_archive_errors_total{reason}` counts the failures, no
temporary file is left behind, SIGTERM exits within `[archive] shutdown_timeout_s` counting the
rows it could not write, and after a restart with the disk back the archive is whole.

Mounting needs root (CAP_SYS_ADMIN): decided by an actual mount attempt, skipped with the reason
where it is refused (a container without the capability), CI included."""

from __future__ import annotations

import errno
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gateway.archive import segments
from tests.daemon import Daemon
from tests.support import eventually, require_binary

SIM = "[simulation]\nstations = 20\nsegments = 4\nspeedup = 600\ntraffic_pair = false\n"
TIMEOUT_S = 0.5  # the final flush tries the failing disk this long (default 10 s)
#: far more than the shutdown ever needs past its timeout: the HTTP site, the sinks, the store
SLACK_S = 20.0


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=30)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs of its own, unmounted whatever the test did."""
    require_binary("mount", "mount")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = _run("mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt))
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root/CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        if _run("umount", str(mnt)).returncode != 0:
            _run("umount", "-l", str(mnt))


def fill(mnt: Path) -> Path:
    """Take every free byte of the filesystem at `mnt`; returns the file that holds them."""
    filler = mnt / "filler"
    with filler.open("wb", buffering=0) as f:
        chunk = b"\0" * 65536
        while True:
            try:
                f.write(chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
                break
        while True:  # the last partial page
            try:
                f.write(b"\0" * 512)
            except OSError:
                break
    return filler


def remount(mnt: Path, mode: str) -> None:
    """`mount -o remount,ro|rw`; ro is refused (EBUSY) while a segment is open for writing."""
    eventually(
        lambda: _run("mount", "-o", f"remount,{mode}", str(mnt)),
        lambda done: done.returncode == 0,
        message=f"remount {mnt} {mode}",
        timeout=30,
    )


def config(tmp_path: Path, archive: Path) -> str:
    return (
        f'[state]\ndir = "{tmp_path / "state"}"\n{SIM}'
        f'[archive]\ndir = "{archive}"\nsegment_rows = 10\nshutdown_timeout_s = {TIMEOUT_S}\n'
    )


def archive_errors(gw: Daemon, reason: str) -> float:
    text = urllib.request.urlopen(f"{gw.url}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"fjords_archive_errors_total\{([^}]*)\} (\S+)$", line)
        if m and f'reason="{reason}"' in m.group(1):
            total += float(m.group(2))
    return total


def temp_files(archive: Path) -> list[Path]:
    return sorted(archive.rglob(".part-*.tmp")) if archive.exists() else []


def cannot_write(gw: Daemon, reason: str, says: str) -> None:
    """Degraded on /healthz and /status with the reason, the failures counted by reason."""
    health = eventually(
        lambda: gw.get("/healthz"),
        lambda h: any("archive" in r and says in r for r in h["reasons"]),
        message=lambda: f"/healthz names the archive's failure ({says}): {gw.tail()}",
        timeout=30,
        retry_on=(OSError,),
    )
    assert health["status"] == "degraded"
    assert any(says in r and "since" in r for r in health["reasons"]), health
    status = gw.get("/status")
    assert any(says in r for r in status["health"]["reasons"]), status["health"]
    eventually(lambda: archive_errors(gw, reason), lambda n: n >= 1, timeout=30)


def stop_within_timeout(gw: Daemon) -> None:
    """SIGTERM while the disk still fails: gone within the timeout (+ slack), exit 0, and the
    rows it could not write counted in the log."""
    t0 = time.monotonic()
    code = gw.stop(seconds=TIMEOUT_S + SLACK_S)
    took = time.monotonic() - t0
    assert code == 0, gw.tail()
    assert took < TIMEOUT_S + SLACK_S
    m = re.search(r"archive traffic: (\d+) rows? not written", gw.tail(20_000))
    assert m is not None and int(m.group(1)) > 0, gw.tail()


def readable_after_restart(tmp_path: Path, archive: Path) -> None:
    """Started again with the disk back: segments are written, every one readable, no
    temporary file left, and healthy."""
    (archive / "traffic").mkdir(parents=True, exist_ok=True)
    orphan = archive / "traffic" / ".part-00000099-0123456789ab.parquet.tmp"
    orphan.write_bytes(b"half a segment")  # what a write cut off by the exit may leave
    keep = archive / "traffic" / "notes.tmp"  # not ours: left alone
    keep.write_text("the operator's")
    before = len(segments(archive / "traffic"))
    with Daemon(tmp_path, config(tmp_path, archive)) as gw:
        eventually(
            lambda: len(segments(archive / "traffic")), lambda n: n >= before + 2, timeout=30
        )
        assert not orphan.exists() and keep.exists()
        assert gw.metric("fjords_archive_temp_files_removed_total") >= 1
        eventually(lambda: gw.get("/healthz")["status"], lambda s: s == "ok", timeout=30)
    assert temp_files(archive) == []
    parts = segments(archive / "traffic")
    assert parts and sum(pq.read_table(p).num_rows for p in parts) > 0


def test_a_full_archive_disk_is_degraded_counted_and_stops_in_time(
    tmp_path: Path, tmpfs: Path
) -> None:
    archive = tmpfs / "archive"
    filler = fill(tmpfs)
    gw = Daemon(tmp_path, config(tmp_path, archive)).start()
    try:
        cannot_write(gw, "no_space", "no space left on device")
        # A failed write takes its temporary file with it: none piles up on the full disk.
        eventually(lambda: temp_files(archive), lambda found: found == [], timeout=30)
        stop_within_timeout(gw)
    finally:
        gw.kill()
    filler.unlink()
    readable_after_restart(tmp_path, archive)


def test_a_read_only_archive_disk_is_degraded_recovers_and_stops_in_time(
    tmp_path: Path, tmpfs: Path
) -> None:
    archive = tmpfs / "archive"
    gw = Daemon(tmp_path, config(tmp_path, archive)).start()
    try:
        eventually(lambda: len(segments(archive / "traffic")), lambda n: n >= 1, timeout=30)
        remount(tmpfs, "ro")
        cannot_write(gw, "read_only", "read-only file system")
        remount(tmpfs, "rw")  # back to ok once a write succeeds
        eventually(
            lambda: gw.get("/healthz")["reasons"],
            lambda rs: not any("archive" in r and "cannot write" in r for r in rs),
            message=lambda: f"the archive writes again: {gw.tail()}",
            timeout=30,
        )
        remount(tmpfs, "ro")
        cannot_write(gw, "read_only", "read-only file system")
        stop_within_timeout(gw)
    finally:
        gw.kill()
    remount(tmpfs, "rw")
    assert temp_files(archive) == []
    readable_after_restart(tmp_path, archive)
