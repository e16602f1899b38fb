"""Child processes that always die with their whole process group.

vLLM forks `VLLM::EngineCore` and `VLLM::Worker_*` children that survive a SIGTERM to the API
server alone; every process here gets its own session so the group can be ended as a unit.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    """A port free on 127.0.0.1 right now (the OS picks it; a later bind may still race)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def process_table() -> tuple[dict[int, list[int]], dict[int, list[str]]]:
    """Live processes from /proc: parent pid -> child pids, and pid -> the fields of its
    /proc/PID/stat after the command name (field 1 is the ppid, 11 and 12 utime and stime)."""
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2 :].split()
        pid = int(stat.parent.name)
        stats[pid] = fields
        children.setdefault(int(fields[1]), []).append(pid)
    return children, stats


TICKS = os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(procs: list[Proc]) -> float:
    """User + system CPU seconds of these processes and all their live descendants."""
    children, stats = process_table()
    total, todo, seen = 0.0, [p.pid for p in procs], set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in stats:
            continue
        seen.add(pid)
        total += (int(stats[pid][11]) + int(stats[pid][12])) / TICKS  # utime, stime
        todo.extend(children.get(pid, []))
    return total


class Proc:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")  # noqa: SIM115 - lives as long as the process
        # The file keeps earlier runs (and restarts); what this process wrote starts here.
        self._log_start = self._log.tell()
        self.popen = subprocess.Popen(
            argv, env=env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def note(self, line: str) -> None:
        """Append a line of ours to the process's log (the same file it writes)."""
        if not self._log.closed:
            self._log.write(line.encode() + b"\n")
            self._log.flush()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def descendant_groups(self) -> set[int]:
        """Process groups of every descendant. The worker launcher starts vLLM in a session of its
        own, so vLLM is not in our group: killing the launcher alone would orphan it."""
        children, _ = process_table()
        groups: set[int] = set()
        todo = list(children.get(self.popen.pid, []))
        while todo:
            pid = todo.pop()
            try:
                groups.add(os.getpgid(pid))
            except ProcessLookupError:
                continue
            todo.extend(children.get(pid, []))
        return groups

    def kill_hard(self) -> None:
        """SIGKILL this process and everything it started, as a crash would."""
        groups = self.descendant_groups() | {self.popen.pid}
        for g in groups:
            try:
                os.killpg(g, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def group_alive(self) -> bool:
        try:
            os.killpg(self.popen.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the group, wait up to `grace_s`, then SIGKILL whatever is left of it.

        The worker launcher drains and ends its engine's group itself; the groups recorded here
        are the net if the launcher cannot (it crashed, or the drain hangs)."""
        groups = self.descendant_groups()
        self.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if self.popen.poll() is not None and not self.group_alive():
                break
            time.sleep(0.1)
        self.signal_group(signal.SIGKILL)
        for g in groups:
            try:
                os.killpg(g, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()

    def tail(self, lines: int = 30) -> str:
        """The last lines this process wrote (not an earlier run's: the file is appended to)."""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self._log_start)
                text = fh.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])
