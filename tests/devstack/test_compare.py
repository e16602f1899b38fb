"""make compare's CPU accounting: a process tree's CPU seconds, children included."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from devstack.compare import tree_cpu_seconds
from devstack.procs import Proc


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
