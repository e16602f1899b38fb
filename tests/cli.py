"""The one shape of a failed llmserve command, for every test package: the last line of stderr is
`<prog>: error: <message>`, it is the only error line, and there is no traceback.

`run_main` runs a command's `main(argv)` in the test's own process, as its console script would:
most tests of a command's output and exit code need no new interpreter (a few tenths of a second
of start-up and imports each). Each command keeps at least one test that runs it as a real
process, for what only a process shows (`python -m`, the exit code the interpreter sets, and
log lines: in-process, `logging` writes to pytest's handlers, not to the captured stderr, so only
a real process proves that a refused start logs nothing)."""

from __future__ import annotations

import contextlib
import io
import subprocess
from collections.abc import Callable

from model_store import cli_error

EXIT_USAGE = cli_error.EXIT_USAGE


def run_main(main: Callable[[list[str]], int | None], *argv: str,
             ) -> subprocess.CompletedProcess[str]:
    """`main(argv)` with stdout and stderr captured: its exit status as `sys.exit(main())` would
    make it (a SystemExit's included). Any other exception propagates: a traceback fails the
    test."""
    out, err = io.StringIO(), io.StringIO()
    code: int | str | None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = exc.code
    if isinstance(code, str):  # sys.exit("message"): printed to stderr, status 1
        err.write(code + "\n")
        code = 1
    return subprocess.CompletedProcess(list(argv), code or 0, out.getvalue(), err.getvalue())


def one_line_error(stderr: str, prog: str, *fragments: str) -> str:
    """The message of the error line, after checking its shape and that it holds `fragments`."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    prefix = f"{prog}: error: "
    assert lines and lines[-1].startswith(prefix), stderr
    assert len([ln for ln in lines if ": error: " in ln]) == 1, stderr
    for fragment in fragments:
        assert fragment in lines[-1], stderr
    return lines[-1].removeprefix(prefix)


def usage_error(stderr: str, prog: str, *fragments: str) -> str:
    """A usage error: one line and nothing else on stderr (no usage dump, no log lines)."""
    assert len(stderr.strip().splitlines()) == 1, stderr
    return one_line_error(stderr, prog, *fragments)
