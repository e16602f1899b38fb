"""bench/procs.py: the benchmarks' one CPU measure counts a process's whole tree, exactly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from bench.procs import busy_share, cpu_busy, cpu_seconds, schedstat

SPIN = ("import time\n"
        "t = time.thread_time()\n"
        "while time.thread_time() - t < 0.3:\n"
        "    pass\n"
        "time.sleep(30)\n")


def _spun(proc: subprocess.Popen[bytes]) -> float:
    """Wait until the spinning grandchild has used its 0.3 s; the tree's CPU seconds then."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        used = cpu_seconds(proc.pid)
        if used >= 0.3:
            return used
        time.sleep(0.05)
    raise AssertionError(f"the child used {cpu_seconds(proc.pid):.3f} s in 20 s")


def test_cpu_seconds_counts_the_descendants() -> None:
    # A shell that waits on a Python child: the shell itself uses next to nothing, so the tree's
    # time is the child's (nginx's master and its worker are the real case).
    # `; :` keeps the shell from exec'ing the child in its own place.
    proc = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "$0"; :', SPIN],
                            start_new_session=True)
    try:
        used = _spun(proc)
        # Exact, not per tick: what the child spun, plus its start-up, not whole ticks beyond.
        assert 0.3 <= used < 2.0
        run, wait = schedstat(proc.pid)
        assert run >= used and wait >= 0
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


def test_cpu_busy_counts_up() -> None:
    before = cpu_busy(0)
    sum(range(2_000_000))
    after = cpu_busy(0)
    assert 0 <= before[0] <= after[0] and before[1] <= after[1] and before[0] <= before[1]
    assert 0.0 <= busy_share(before, after) <= 1.0


def test_free_port_run_gives_n_consecutive_free_ports() -> None:
    import socket

    from bench.procs import free_port_run

    base = free_port_run(8)
    socks = [socket.socket() for _ in range(8)]
    try:
        for i, s in enumerate(socks):
            s.bind(("127.0.0.1", base + i))  # raises if one was not free
    finally:
        for s in socks:
            s.close()
