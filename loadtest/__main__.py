"""`llmserve-loadtest compare ...` (`python -m loadtest compare`; see loadtest/compare.py).

Bad usage (a flag, a --host that does not answer, a --target the gateway does not serve, the
`loadtest` extra not installed) ends
with one line `llmserve-loadtest compare: error: ...` and exit code 2; a run that fails (locust,
the cross-check) with one line and exit code 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from typing import NoReturn

from loadtest.errors import EXIT_FAILED, EXIT_USAGE, PROG, UsageError, error_line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Load tests against an llmserve gateway.")
    p.add_argument("command", choices=["compare"],
                   help="compare: two targets (pools) behind one gateway, alternating runs, "
                        "a report (`compare --help` for its flags)")
    return p


# What the `loadtest` extra installs (pyproject.toml) and `compare` needs: the HTTP client, locust
# (run as `python -m locust`) and matplotlib (the report's PNGs).
EXTRA_MODULES = ("httpx", "locust", "matplotlib")


def check_extra() -> None:
    """UsageError naming the extra to install when one of its modules is missing (looked up, not
    imported: importing locust patches the standard library)."""
    missing = []
    for name in EXTRA_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    if missing:
        raise UsageError(
            f"needs the loadtest extra ({', '.join(missing)} not installed): "
            "pip install 'llmserve[loadtest]'")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = PROG
    try:
        args = build_parser().parse_args(argv[:1])
        prog = f"{PROG} {args.command}"
        check_extra()
        from loadtest.compare import main as compare

        return compare(argv[1:])
    except UsageError as exc:
        error_line(prog, str(exc))
        return EXIT_USAGE
    except (RuntimeError, OSError) as exc:
        error_line(prog, str(exc))
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
