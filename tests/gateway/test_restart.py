"""A gateway killed hard (SIGKILL) and started again: its queries come back, its archive is whole."""

from __future__ import annotations

import pyarrow.parquet as pq

from gateway.archive import segments
from tests.daemon import Daemon
from tests.support import eventually


def test_queries_and_archive_survive_sigkill(tmp_path) -> None:
    gw = Daemon(
        tmp_path,
        f'[state]\ndir = "{tmp_path / "state"}"\n'
        f'[archive]\ndir = "{tmp_path / "archive"}"\nsegment_rows = 40\n'
        "[simulation]\nstations = 20\nsegments = 4\nspeedup = 600\ntraffic_pair = false\n",
    ).start()
    sql = "SELECT segment, AVG(speed) AS a FROM traffic [RANGE 15 MINUTES] GROUP BY segment"
    qid = gw.post("/queries", {"sql": sql})["id"]
    archive = tmp_path / "archive" / "traffic"
    try:
        eventually(
            lambda: len(segments(archive)), lambda n: n >= 3, message="3 segments", timeout=60
        )
    finally:
        gw.kill()
    before = segments(archive)
    assert len(before) >= 3
    for seg in before:  # every visible segment is whole, whatever the kill interrupted
        assert 0 < pq.read_table(seg).num_rows <= 40
    with gw.start():
        queries = gw.get("/queries")["queries"]
        assert [(q["id"], q["sql"]) for q in queries] == [(qid, sql)]
        assert not any(p.name.startswith(".") for p in archive.iterdir())  # crash leftovers removed
        eventually(
            lambda: len(segments(archive)),
            lambda n: n > len(before),
            message=f"a segment after the {len(before)} written before the kill",
            timeout=60,
        )
        after = segments(archive)
        assert after[: len(before)] == before and len(after) > len(before)  # numbering continues
