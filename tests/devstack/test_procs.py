"""A process of the local stack and its log."""

from __future__ import annotations

import sys
from pathlib import Path

from devstack.procs import Proc


def test_tail_is_this_runs_output_not_an_earlier_runs(tmp_path: Path) -> None:
    """The log is appended to across runs; a failure is reported with what this process said,
    not with an error an earlier run left in the same file."""
    log = tmp_path / "worker-0.log"
    log.write_text("llmserve-worker: error: WORKER_NICE: an earlier run's mistake\n")
    proc = Proc("worker-0", [sys.executable, "-c", "print('this run')"], {}, log)
    proc.popen.wait(10)
    assert proc.tail() == "this run"
    assert "earlier run" in log.read_text()  # kept in the file
    proc.stop()
