"""Run every benchmark in turn (`make bench`); each records its figures in benchmarks/RESULTS.md.

python -m benchmarks            # all
python -m benchmarks --list     # their names
python -m benchmarks NAME ...   # some
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import time

import benchmarks

SKIP = {"common", "__main__"}


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__) if m.name not in SKIP)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = p.parse_args(argv)
    names = available()
    if args.list:
        print("\n".join(names))
        return 0
    unknown = sorted(set(args.names) - set(names))
    if unknown:
        print(
            f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(names)}",
            file=sys.stderr,
        )
        return 2
    for name in args.names or names:
        print(f"== {name}")
        start = time.perf_counter()
        module = importlib.import_module(f"benchmarks.{name}")
        module.main([])
        print(f"== {name}: {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
