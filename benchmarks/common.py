"""What every benchmark shares: the machine's description, a rich table, and RESULTS.md sections.

RESULTS.md holds one section per benchmark (per name given to `record`), its latest run only:
`record` replaces the section, so the file never grows into a log; older runs are in git.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
from pathlib import Path

from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
OUT = HERE / "out"
HEAD = (
    "# Benchmark results\n\n"
    "Latest figures of each benchmark, written by the benchmark itself (`make bench`, or the "
    "command in its section); older runs are in git history (`git log -p benchmarks/RESULTS.md`).\n"
)


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()} {platform.release()}"


def today() -> str:
    return _dt.date.today().isoformat()


def table(title: str, columns: list[str], rows: list[list[object]]) -> Table:
    t = Table(title=title)
    for c in columns:
        t.add_column(c, justify="right" if c not in (columns[0],) else "left")
    for r in rows:
        t.add_row(*[_fmt(v) for v in r])
    return t


def _fmt(v: object) -> str:
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.3g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def markdown(columns: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def drawn(what: str, png: str) -> str:
    """The sentence naming a benchmark's plot: drawn by its command, never committed."""
    return f"{what}: the command above draws it into `benchmarks/out/{png}` (not committed)."


def under_load(threshold: float = 0.5) -> str:
    """A note for a section's header line when something else was using the cores at the start
    (the 1-minute load average): timings measured then are slower than on a quiet machine."""
    load = os.getloadavg()[0]
    return (
        f"measured under load (load average {load:.2f} at the start)" if load >= threshold else ""
    )


def record(name: str, body: str, note: str = "") -> None:
    """Replace this benchmark's section of RESULTS.md (between markers) with `body`, under a
    line with today's date, the machine and `note`. `name` is the benchmark (or a fixed part
    of it): never a run's label, or every label would add a section."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    suffix = f"; {note}" if note else ""
    header = f"{start}\n## {name}\n\n_{today()} on {machine()}{suffix}_\n\n"
    section = header + body.strip() + "\n" + end
    text = RESULTS.read_text() if RESULTS.exists() else HEAD
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    text = (
        pattern.sub(lambda _: section, text)
        if pattern.search(text)
        else text.rstrip() + "\n\n" + section + "\n"
    )
    RESULTS.write_text(text)


console = Console()
