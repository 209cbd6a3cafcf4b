"""`fjords-gateway`: the daemon's command line."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fjords-gateway", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="run the gateway daemon")
    args = parser.parse_args(argv)
    print(f"fjords-gateway {args.command}: not yet (see the gateway issue)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
