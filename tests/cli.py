"""The one shape of a failed llmserve command, for every test package: the last line of stderr is
`<prog>: error: <message>`, it is the only error line, and there is no traceback."""

from __future__ import annotations

EXIT_USAGE = 2


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
