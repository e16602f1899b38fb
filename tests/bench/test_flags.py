"""Every benchmark script (`python -m bench.NAME`) is a CLI like the others: a bad flag is one
line and exit code 2 before anything starts, and --help explains every flag with its default
(devstack.cli's parser)."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

from tests.cli import EXIT_USAGE, usage_error

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py") if re.search(
    r'^if __name__ == "__main__":', p.read_text(encoding="utf-8"), re.MULTILINE))


def _run(name: str, monkeypatch: pytest.MonkeyPatch, *argv: str) -> int | str | None:
    main = importlib.import_module(f"bench.{name}").main
    monkeypatch.setattr(sys, "argv", [f"bench/{name}.py", *argv])
    with pytest.raises(SystemExit) as exc:
        main()
    return exc.value.code


def test_every_script_is_found() -> None:
    assert {"fake_upstream", "gateway_overhead", "pull_throughput", "real_pace"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_an_unknown_flag_is_one_line_and_exit_2(name: str, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(name, monkeypatch, "--no-such-flag") == EXIT_USAGE
    message = usage_error(capsys.readouterr().err, f"python -m bench.{name}")
    assert "--no-such-flag" in message or "arguments are required" in message


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_explains_every_flag_with_its_default(name: str, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(name, monkeypatch, "--help") == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m bench.{name} ")
    options = out.split("\noptions:\n", 1)[1]
    # One entry per flag: its line, and the help text's own lines (indented deeper).
    entries = re.split(r"\n(?=  -)", options.strip("\n"))
    for entry in entries[1:]:  # entries[0]: -h, --help
        words = " ".join(entry.split())
        flag = words.split()[0]
        required = not re.search(rf"\[{re.escape(flag)}[\] ]", out)
        assert required or "(default" in words, entry
        assert len(words.split()) > 3, f"{flag} is not explained: {entry}"
