"""make compare's CPU accounting: a process tree's CPU seconds, children included."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from devstack.compare import append_setup
from devstack.procs import Proc, tree_cpu_seconds
from tests.waiting import wait_for


@pytest.mark.slow
def test_tree_cpu_counts_a_busy_grandchild_and_not_an_idle_tree(tmp_path: Path) -> None:
    # Waited on, not timed: on a loaded machine the spinning grandchild may get little CPU
    # in a fixed window, and a start may fall into it. The busy tree must accrue 0.45 s of CPU
    # (0.3 cores for 1.5 s; its parent only sleeps, so only the grandchild can), while the idle
    # one, started and asleep, accrues next to none in the same time.
    spin = "print('spinning', flush=True)\nwhile True: pass\n"
    parent = ("import subprocess, sys, time\n"
              f"subprocess.Popen([sys.executable, '-c', {spin!r}])\ntime.sleep(60)\n")
    busy = Proc("busy", [sys.executable, "-c", parent], {}, tmp_path / "busy.log")
    idle = Proc("idle", [sys.executable, "-c",
                         "import time\nprint('started', flush=True)\ntime.sleep(60)"], {},
                tmp_path / "idle.log")
    try:
        wait_for(lambda: b"spinning" in busy.log_path.read_bytes()
                 and b"started" in idle.log_path.read_bytes(), 30, "the processes never started")
        b0, i0 = tree_cpu_seconds([busy]), tree_cpu_seconds([idle])
        wait_for(lambda: tree_cpu_seconds([busy]) - b0 >= 0.45, 30,
                 "the busy tree accrued no CPU: its spinning grandchild is not counted")
        idle_cpu = tree_cpu_seconds([idle]) - i0
    finally:
        busy.stop(grace_s=1)
        idle.stop(grace_s=1)
    assert idle_cpu < 0.05


def test_setup_section_reports_idle_cost_and_the_a_a_ratio(tmp_path: Path) -> None:
    (tmp_path / "tp-vs-pp").mkdir()
    (tmp_path / "tp-vs-pp" / "report.md").write_text("# tp vs pp\n")
    (tmp_path / "a-a").mkdir()
    run = {"users": 4, "output_tok_s": 100.0, "ttft_ms": {"p50": 50.0}}
    (tmp_path / "a-a" / "summary.json").write_text(json.dumps(
        {"rounds": 2, "runs": [run, {**run, "output_tok_s": 95.0}]}))
    cost = {"tp_idle_cores": 0.01, "pp_idle_cores": 0.02, "tp_busy_cores": 1.9,
            "pp_idle_cores_while_tp_serves": 0.03, "tp_idle_cores_while_pp_serves": 0.04,
            "pp_busy_cores": 1.8}
    append_setup(tmp_path, {"cpu_cores": cost})
    text = (tmp_path / "tp-vs-pp" / "report.md").read_text()
    assert text.startswith("# tp vs pp\n")
    assert "| both idle | 0.01 | 0.02 |" in text
    assert "| TP pool serving 4 streams | 1.9 | 0.03 |" in text
    assert "ratio 0.950" in text
