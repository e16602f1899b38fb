"""How `llmserve-devstack` fails: one line `<prog>: error: <message>` on stderr, exit code 2 for
bad usage, 1 when the stack could not start or a process died."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

PROG = "llmserve-devstack"
EXIT_FAILED = 1
EXIT_USAGE = 2


def error_line(prog: str, message: str) -> None:
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr, flush=True)


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
