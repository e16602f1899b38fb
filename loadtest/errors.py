"""How `llmserve-loadtest` fails: one line `<prog>: error: <message>` on stderr, exit code 2 for
bad usage (a flag, an unreachable --host, a target the gateway does not serve), 1 for a run that
failed."""

from __future__ import annotations

from model_store import cli_error

PROG = "llmserve-loadtest"
EXIT_FAILED = cli_error.EXIT_FAILED
EXIT_USAGE = cli_error.EXIT_USAGE


class UsageError(Exception):
    """What was given cannot work as written: exit code 2."""


error_line = cli_error.error_line
