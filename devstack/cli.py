"""How `llmserve-devstack` fails: one line `<prog>: error: <message>` on stderr, exit code 2 for
bad usage, 1 when the stack could not start or a process died."""

from __future__ import annotations

import argparse
from typing import NoReturn

from model_store import cli_error

PROG = "llmserve-devstack"
EXIT_FAILED = cli_error.EXIT_FAILED
EXIT_USAGE = cli_error.EXIT_USAGE


error_line = cli_error.error_line


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description as written, and every optional flag's default in its help."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.required:
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """argparse, with its errors as one line and exit code 2 (no usage dump), and the defaults
    in --help."""

    def __init__(self, prog: str, description: str | None) -> None:
        super().__init__(prog=prog, description=description, formatter_class=_Formatter)

    def error(self, message: str) -> NoReturn:
        self.fail(f"{message} (see {self.prog} --help)")

    def fail(self, message: str) -> NoReturn:
        error_line(self.prog, message)
        raise SystemExit(EXIT_USAGE)
