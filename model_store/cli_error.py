"""How every llmserve command fails: one line `<prog>: error: <message>` on stderr (the message's
whitespace folded, so a wrapped message stays one line), exit code 2 for bad usage, 1 for work
that failed.

The commands' one home for it (llmserve-gateway, -worker, -model-store, -loadtest, -devstack and
the small `python -m` helpers). It lives in model_store because every package and every image
has model_store, which imports none of the others; standard library only.
"""

from __future__ import annotations

import sys
from typing import NoReturn

EXIT_FAILED = 1
EXIT_USAGE = 2


def error_line(prog: str, message: str) -> None:
    """Print the one line of a failure."""
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr, flush=True)


def fail(prog: str, message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print the line and exit with `code` (usage: 2)."""
    error_line(prog, message)
    raise SystemExit(code)
