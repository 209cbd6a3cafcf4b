"""The /proc helpers of tests/spark_cluster.py on a plain process tree (no Spark, no JVM)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from tests.spark_cluster import descendants, java_descendants, kill_session, session_processes
from tests.support import eventually

# A shell that starts a grandchild and prints its pid, then waits: a two-level tree.
TREE = "sleep 300 & echo $!; wait"


def test_descendants_and_sessions_find_a_tree_and_kill_session_removes_it() -> None:
    proc = subprocess.Popen(
        ["sh", "-c", TREE], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert proc.stdout is not None
        grandchild = int(proc.stdout.readline())
        assert grandchild in descendants(proc.pid)
        assert {proc.pid, grandchild} <= set(descendants(os.getpid()))
        assert set(session_processes(proc.pid)) == {proc.pid, grandchild}
        assert java_descendants(proc.pid) == []  # `sleep` is no JVM
        assert os.getpid() not in session_processes(proc.pid)
        assert sorted(kill_session(proc.pid)) == sorted({proc.pid, grandchild})
        proc.wait(timeout=30)
        eventually(lambda: session_processes(proc.pid), lambda left: not left)
        assert kill_session(proc.pid) == []  # nothing left: nothing to kill
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_java_descendants_lists_a_jvm_child() -> None:
    """A process named `java` below us: a copy of `sleep` by that name (the kernel's comm is
    the executable's name, which `exec -a` does not change)."""
    with tempfile.TemporaryDirectory() as d:
        fake = os.path.join(d, "java")
        shutil.copy(shutil.which("sleep") or "/bin/sleep", fake)
        proc = subprocess.Popen([fake, "300"], start_new_session=True)
        try:
            eventually(lambda: java_descendants(os.getpid()), lambda pids: proc.pid in pids)
            assert java_descendants(proc.pid) == []  # its own children only
        finally:
            proc.kill()
            proc.wait()
    assert proc.pid not in java_descendants(os.getpid())
