"""`fjords-power`: mote power-consumption simulation."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fjords-power", description=__doc__)
    parser.add_argument("command", nargs="?")
    parser.parse_args(argv)
    print("fjords-power: not yet (see the firmware-sim issue)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
