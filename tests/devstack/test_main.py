"""`llmserve-devstack` and `llmserve-devstack compare`: bad usage is one line and exit code 2,
before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack.__main__ import main
from devstack.cli import PROG
from tests.cli import EXIT_USAGE, usage_error


@pytest.mark.parametrize(("argv", "prog", "fragment"), [
    ([], PROG, "the following arguments are required: --model-dir (see llmserve-devstack --help)"),
    (["--model-dir", "{tmp}/none"], PROG, ("--model-dir {tmp}/none is not a directory; build the "
                                          "demo model with `python -m model_store bootstrap-demo")),
    (["--model-dir", "{tmp}", "--workers", "0"], PROG, "--workers must be at least 1 (got 0)"),
    (["--model-dir", "{tmp}", "--pooling-workers", "-1"], PROG,
     "--pooling-workers must be at least 0 (got -1)"),
    (["compare", "--rounds", "two"], f"{PROG} compare", "argument --rounds: invalid int value"),
    (["compare", "--demo-dir", "{tmp}/none"], f"{PROG} compare",
     "{tmp}/none has no tokenizer.json (run make model first)"),
    # Values only the load test would refuse, after the pools' minutes of start-up: refused now.
    # (The missing --demo-dir makes a run without these checks fail at once too.)
    (["compare", "--demo-dir", "{tmp}/none", "--users", "1,x"], f"{PROG} compare",
     "loadtest compare would refuse: --users: '1,x' is not a comma-separated list"),
    (["compare", "--demo-dir", "{tmp}/none", "--duration", "soon"], f"{PROG} compare",
     "--duration: 'soon' is not a duration"),
    (["compare", "--demo-dir", "{tmp}/none", "--rounds", "0"], f"{PROG} compare",
     "--rounds: Input should be greater than or equal to 1"),
    (["compare", "--demo-dir", "{tmp}/none", "--idle-window-s", "-1"], f"{PROG} compare",
     "--idle-window-s must be above 0 (got -1.0)"),
])
def test_bad_usage_is_one_line_and_exit_2(argv: list[str], prog: str, fragment: str,
                                          tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    args = [a.format(tmp=tmp_path) for a in argv]
    if args[:1] == ["compare"]:
        # A --perf-dir of the test's own: with a complete one (`make up` leaves one in the
        # checkout) --demo-dir is not needed, and a missed check would start the pools.
        args += ["--perf-dir", str(tmp_path / "perf")]
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == EXIT_USAGE
    usage_error(capsys.readouterr().err, prog, fragment.format(tmp=tmp_path))


@pytest.mark.parametrize(("argv", "env", "fragment"), [
    (["--port", "70000"], {}, "GATEWAY_PORT (--port): Input should be less than or equal to 65535"),
    ([], {"GATEWAY_FLOW__MAX_QUEUE": "lots"}, "GATEWAY_FLOW__MAX_QUEUE (--flow.max-queue)"),
])
def test_the_gateways_settings_are_refused_before_any_engine_starts(
    argv: list[str], env: dict[str, str], fragment: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gateway starts last, once the engines are up (minutes): a value it would refuse ends
    the command at once, with nothing started. (Without the check the workers start; the marker
    timeout makes them give up at once here, so this fails fast rather than hangs.)"""
    monkeypatch.setenv("WORKER_MARKER_TIMEOUT_S", "0.1")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    logs = tmp_path / "logs"
    with pytest.raises(SystemExit) as exc:
        main(["--model-dir", str(tmp_path), "--log-dir", str(logs), *argv])
    assert exc.value.code == EXIT_USAGE
    usage_error(capsys.readouterr().err, PROG, "the gateway would refuse its settings", fragment)
    assert not logs.exists()  # no process was started


def test_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--users USERS closed-loop levels (default: 1,4,8)" in text
