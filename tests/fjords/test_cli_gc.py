"""`python -m fjords` collects young objects rarely enough that a trace block's rows, alive
until the block is routed, are not scanned by collection after collection (`QUIET_GC`)."""

from __future__ import annotations

import gc

from fjords import __main__ as cli
from fjords.trace import BLOCK_BYTES


def test_a_trace_block_fits_between_young_collections(tmp_path) -> None:
    """A block of METR-LA rows (~40,000 at BLOCK_BYTES) is made, routed and freed between
    two young collections: 2 collections over a 417,312-row replay, where a threshold of
    20,000 runs 20, each scanning every row alive (~30 ms of a 0.7 s run)."""
    rows_per_block = BLOCK_BYTES // 26  # a METR-LA line is ~27 bytes: the most rows a block holds
    assert cli.QUIET_GC[0] >= 4 * rows_per_block

    path = tmp_path / "readings.csv"
    with path.open("w") as f:
        f.write("time,station,speed\n")
        for i in range(120_000):
            f.write(f"{1_330_588_800 + (i // 200) * 300},{700_000 + i % 200},{60 + i % 7}.5\n")
    young: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 0:
            young.append(1)

    before = gc.get_threshold()
    gc.callbacks.append(count)
    gc.set_threshold(*cli.QUIET_GC)
    try:
        with open(tmp_path / "out.ndjson", "w") as out:
            cli.run_file(str(path), ["SELECT * FROM traffic WHERE speed > 65"], out=out)
    finally:
        gc.callbacks.remove(count)
        gc.set_threshold(*before)
    assert len(young) <= 3  # (at 20,000: 7 for these 120,000 rows)
