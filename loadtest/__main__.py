"""`python -m loadtest compare ...` (see loadtest/compare.py); `python -m loadtest compare --help`."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "compare":
        print("usage: python -m loadtest compare --host URL --target A=MODEL --target B=MODEL "
              "(--users 1,8,32 | --rate 2,4) [--duration 60s] [--workload chat] [--out DIR] "
              "(--help for all flags)", file=sys.stderr)
        return 2
    from loadtest.compare import main as compare

    try:
        return compare(argv[1:])
    except (RuntimeError, OSError) as exc:
        print(f"python -m loadtest compare: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
