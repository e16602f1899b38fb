"""make compare's CPU accounting: a process tree's CPU seconds, children included."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from devstack.compare import append_setup
from devstack.procs import Proc, tree_cpu_seconds


@pytest.mark.slow
def test_tree_cpu_counts_a_busy_grandchild_and_not_an_idle_tree(tmp_path: Path) -> None:
    spin = "import time\nt = time.time()\nwhile time.time() - t < 3: pass\n"
    parent = ("import subprocess, sys, time\n"
              f"subprocess.Popen([sys.executable, '-c', {spin!r}])\ntime.sleep(5)\n")
    busy = Proc("busy", [sys.executable, "-c", parent], {}, tmp_path / "busy.log")
    idle = Proc("idle", [sys.executable, "-c", "import time; time.sleep(5)"], {},
                tmp_path / "idle.log")
    try:
        time.sleep(0.5)
        b0, i0 = tree_cpu_seconds([busy]), tree_cpu_seconds([idle])
        time.sleep(1.5)
        busy_cores = (tree_cpu_seconds([busy]) - b0) / 1.5
        idle_cores = (tree_cpu_seconds([idle]) - i0) / 1.5
    finally:
        busy.stop(grace_s=1)
        idle.stop(grace_s=1)
    assert busy_cores > 0.3  # the spinning grandchild (shares 2 cores with everything else)
    assert idle_cores < 0.05


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
