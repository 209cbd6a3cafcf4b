"""The Spark commands on a plain install (no pyspark): a one-line error naming the extra to
install and exit code 2, never a raw ImportError traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support import ROOT

# Runs the CLI with pyspark made unimportable, as on `pip install fjords-gateway`.
_WITHOUT_PYSPARK = """
import sys
from importlib.abc import MetaPathFinder

class _NoPyspark(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "pyspark" or name.startswith("pyspark."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

for mod in [m for m in sys.modules if m == "pyspark" or m.startswith("pyspark.")]:
    del sys.modules[mod]
sys.meta_path.insert(0, _NoPyspark())
from gateway.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["spark", "run", "--query", "SELECT * FROM traffic", "--archive", "{tmp}"],
        ["spark", "batch", "--query", "SELECT * FROM traffic", "--archive", "{tmp}"],
        [
            "replay",
            "--engine",
            "spark",
            "--trace",
            "{tmp}/readings.csv",
            "--query",
            "SELECT * FROM traffic",
        ],
    ],
    ids=["spark-run", "spark-batch", "replay-engine-spark"],
)
def test_spark_commands_without_pyspark_say_what_to_install(tmp_path, argv) -> None:
    (tmp_path / "readings.csv").write_text("time,station,speed\n0,1,50\n")
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT_PYSPARK, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'fjords-gateway[spark]'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "ModuleNotFoundError" not in proc.stderr
