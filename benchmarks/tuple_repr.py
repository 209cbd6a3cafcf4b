"""Which tuple representation is fastest in CPython: build one per sample, then read a field
through a compiled predicate (what the router and operators do per tuple)?

  python -m benchmarks.tuple_repr
"""

from __future__ import annotations

import argparse
import timeit
from collections import namedtuple
from dataclasses import dataclass

from benchmarks.common import console, markdown, record, table

Row = namedtuple("Row", "time station speed segment")


@dataclass(slots=True)
class SlotRow:
    time: int
    station: str
    speed: float
    segment: str


class PlainSlots:
    __slots__ = ("time", "station", "speed", "segment")

    def __init__(self, time: int, station: str, speed: float, segment: str) -> None:
        self.time, self.station, self.speed, self.segment = time, station, speed, segment


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--number", type=int, default=300_000)
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args(argv)
    n = args.number
    values = (1330588800, "773869", 64.375, "S21")
    cases = {
        "tuple (t[2])": (lambda: tuple(values), lambda t: t[2] < 30),
        "namedtuple (t.speed)": (lambda: Row(*values), lambda t: t.speed < 30),
        "namedtuple (t[2])": (lambda: Row(*values), lambda t: t[2] < 30),
        "dict (t['speed'])": (
            lambda: dict(zip(Row._fields, values, strict=True)),
            lambda t: t["speed"] < 30,
        ),
        "dataclass slots (t.speed)": (lambda: SlotRow(*values), lambda t: t.speed < 30),
        "__slots__ class (t.speed)": (lambda: PlainSlots(*values), lambda t: t.speed < 30),
    }
    rows = []
    base_total = None
    for name, (make, pred) in cases.items():
        obj = make()
        build = min(timeit.repeat(make, number=n, repeat=3)) / n * 1e9
        read = (
            min(timeit.repeat(lambda pred=pred, obj=obj: pred(obj), number=n, repeat=3)) / n * 1e9
        )
        total = build + 10 * read  # one sample read by ten queries
        base_total = base_total or total
        rows.append([name, build, read, total, total / base_total])
    cols = ["representation", "build ns", "predicate ns", "build + 10 reads ns", "vs tuple"]
    console.print(table("Tuple representation (lower is better)", cols, rows))
    if not args.no_record:
        record(
            "tuple_repr",
            "`python -m benchmarks.tuple_repr`: one sample built once and read by ten compiled "
            "predicates.\n\n" + markdown(cols, rows),
        )


if __name__ == "__main__":
    main()
