"""The processes a benchmark runs, and what they cost: the helpers every benchmark here shares.

Processes under test are pinned to one core with `taskset` (which execs them: the pid is the
process's own) and started in a session of their own, so `stop_all` ends each with every child.

CPU time has one method here, `cpu_seconds`: the exact on-CPU time the scheduler keeps per thread
(/proc/PID/task/TID/schedstat), summed over the process and all its descendants (nginx's worker,
say). Not utime/stime: the kernel samples those per tick, and two processes sharing a core then
split one tick's worth between them. `cpu_busy` is something else: how busy a whole core was
(/proc/stat), read to tell whether the load generator, not the proxy, set the pace.
"""

from __future__ import annotations

import os
import random
import shlex
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

from devstack.procs import process_table


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out on its own (ip_local_port_range)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_pair() -> int:
    """A port P such that P and P+1 are both free now (for servers numbered from a base)."""
    return free_port_run(2)


def free_port_run(n: int) -> int:
    """A port P such that P ... P+n-1 are all free now (for servers numbered from a base).

    Taken below the kernel's ephemeral range: Linux gives bind(0) odd ports there and outgoing
    connections the even ones, one after another, so P+1 of a pair made from bind(0) is the kind
    of port the next health poll takes as its source port. A vLLM worker binds its port tens of
    seconds after it was chosen, and the second of two failed with "Address already in use"."""
    top = _ephemeral_low()
    rng = random.Random()
    while True:
        base = rng.randrange(max(1024, top - 12_000), top - n)
        socks = []
        try:
            for i in range(n):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()


def wait_ok(url: str, timeout_s: float = 30) -> None:
    """Until GET `url` answers 200; TimeoutError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(url)


def start(cmd: str, cpu: str, cwd: str | None = None,
          stderr: Path | None = None) -> subprocess.Popen[bytes]:
    """`cmd` pinned to `cpu`, in a session of its own; its stderr to the file `stderr` if given
    (read it when the process does not come up), else dropped."""
    err = stderr.open("wb") if stderr is not None else subprocess.DEVNULL
    try:
        return subprocess.Popen(["taskset", "-c", cpu, *shlex.split(cmd)],
                                stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True, cwd=cwd)
    finally:
        if stderr is not None:
            err.close()  # type: ignore[union-attr]  # the child holds its own copy


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process group started by `start`, then reap it."""
    for proc in procs:
        try:
            os.killpg(proc.pid, 15)
        except ProcessLookupError:
            pass
        proc.wait(10)


def schedstat(pid: int) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) of `pid`'s threads and those of
    every process below it, from /proc/*/task/*/schedstat."""
    children, _ = process_table()
    run = wait = 0
    todo, seen = [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        for f in Path(f"/proc/{p}/task").glob("*/schedstat"):
            try:
                fields = f.read_text().split()
            except OSError:
                continue
            run, wait = run + int(fields[0]), wait + int(fields[1])
        todo += children.get(p, [])
    return run / 1e9, wait / 1e9


def cpu_seconds(pid: int) -> float:
    """Exact CPU time of `pid` and its descendants so far: the benchmarks' one CPU measure."""
    return schedstat(pid)[0]


def cpu_busy(cpu: int) -> tuple[int, int]:
    """(busy, total) jiffies of one CPU since boot, from /proc/stat."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{cpu} "):
            v = [int(x) for x in line.split()[1:]]
            idle = v[3] + v[4]  # idle + iowait
            return sum(v) - idle, sum(v)
    raise RuntimeError(f"cpu{cpu} not in /proc/stat")


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share of a CPU that was busy between two `cpu_busy` readings."""
    return (after[0] - before[0]) / max(after[1] - before[1], 1)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


_TCP_LISTEN = "0A"  # the state column of /proc/net/tcp


def tcp_sockets(pid: int, *, local_port: int | None = None,
                remote_port: int | None = None) -> int:
    """Open fds of `pid` that are TCP connections (listeners excluded) with the given local or
    remote port on loopback, from /proc/PID/net/tcp (socket inode -> ports, state)."""
    inodes: set[str] = set()
    with open(f"/proc/{pid}/net/tcp") as fh:
        next(fh)
        for line in fh:
            cols = line.split()
            if cols[3] == _TCP_LISTEN:
                continue
            local, remote = (int(c.rsplit(":", 1)[1], 16) for c in cols[1:3])
            if local_port in (None, local) and remote_port in (None, remote):
                inodes.add(cols[9])
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            n += 1
    return n
