"""How `llmserve-loadtest` fails: one line `<prog>: error: <message>` on stderr, exit code 2 for
bad usage (a flag, an unreachable --host, a target the gateway does not serve), 1 for a run that
failed."""

from __future__ import annotations

import sys

PROG = "llmserve-loadtest"
EXIT_FAILED = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """What was given cannot work as written: exit code 2."""


def error_line(prog: str, message: str) -> None:
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr, flush=True)
