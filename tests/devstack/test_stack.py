"""devstack's wait for a process's HTTP endpoint: a hung start is told from a slow one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from devstack.procs import Proc
from devstack.stack import Stalled, wait_http_ok
from tests.ports import free_port

SILENT = "import time; print('started', flush=True); time.sleep(30)"
CHATTY = "import time\nwhile True:\n    print('compiling', flush=True); time.sleep(0.2)"


def _proc(tmp_path: Path, code: str) -> Proc:
    return Proc("engine", [sys.executable, "-c", code], {}, tmp_path / "engine.log")


def test_a_start_whose_log_goes_silent_is_a_stall(tmp_path: Path) -> None:
    p = _proc(tmp_path, SILENT)
    try:
        with pytest.raises(Stalled, match="engine silent for 1s"):
            wait_http_ok(f"http://127.0.0.1:{free_port()}/health", 20, [p], stall_s=1.0)
    finally:
        p.stop(grace_s=2)


def test_a_start_that_keeps_logging_is_only_slow(tmp_path: Path) -> None:
    p = _proc(tmp_path, CHATTY)
    try:
        with pytest.raises(TimeoutError) as info:
            wait_http_ok(f"http://127.0.0.1:{free_port()}/health", 2.5, [p], stall_s=1.0)
        assert not isinstance(info.value, Stalled)
    finally:
        p.stop(grace_s=2)
