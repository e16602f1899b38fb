"""Run one vLLM engine for the life of the pod, and take all of it down when asked.

The lifecycle, in order (``Launcher.run``):

1. capture SIGTERM/SIGINT, so a stop request during any later step is honoured;
2. wait for the model directory's completion marker (never load a half-written model);
3. pre-flight: the parallel layout against config.json and the pod's accelerators;
4. start vLLM in a new session, i.e. its own process group;
5. wait until the engine exits or a stop signal arrives;
6. shut down the whole group: SIGTERM, up to ``drain_timeout_s`` to drain, then SIGKILL;
7. exit with the engine's status.

Step 6 targets the process group, not the API server's pid: vLLM's API server leaves its
``VLLM::EngineCore`` and ``VLLM::Worker_*`` children running when it alone gets SIGTERM. Those
orphans keep the group id, so signalling the group reaches them wherever they were reparented.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import FrameType

from model_store.marker import is_complete, marker_path
from worker.accelerators import check_accelerators, pod_accelerators
from worker.argv import Command
from worker.model_checks import check_layout, read_model_shape
from worker.settings import WorkerSettings

logger = logging.getLogger("worker")

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# After SIGKILL the kernel needs a moment to tear processes down; this only bounds that wait.
KILL_GRACE_S = 10.0


class MarkerTimeout(RuntimeError):
    """The model directory did not become complete in time."""


class EngineStartError(RuntimeError):
    """The engine command could not be executed at all."""


def wait_for_marker(
    model_dir: Path,
    timeout_s: float,
    stop: threading.Event,
    poll_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Block until ``model_dir`` carries the completion marker.

    Returns False if ``stop`` was set first; raises MarkerTimeout after ``timeout_s``.
    """
    deadline = clock() + timeout_s
    while not is_complete(model_dir):
        if stop.is_set():
            return False
        remaining = deadline - clock()
        if remaining <= 0:
            raise MarkerTimeout(
                f"model directory {model_dir} is not complete: no valid "
                f"{marker_path(model_dir).name} after WORKER_MARKER_TIMEOUT_S={timeout_s:g}s "
                "(is the model download running?)"
            )
        stop.wait(min(poll_s, remaining))
    return True


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``, from /proc."""
    members: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", encoding="utf-8", errors="replace") as fh:
                stat = fh.read()
        except OSError:
            continue  # exited while we looked
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


def exit_status(returncode: int) -> int:
    """Popen's returncode as a shell would report it (killed by signal N -> 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def yield_cpu(pid: int, nice: int) -> None:
    """Lower the CPU priority of the engine's session, best effort.

    With autogroup scheduling (sched_autogroup_enabled=1, the default on most distributions) the
    kernel first shares the CPUs between sessions, weighted by each session's autogroup nice; a
    process's own nice only weighs it against the rest of its session. The engine runs in a
    session of its own, so a plain renice changes nothing against a gateway on the same cores
    (measured: refusal p99 unchanged), while the autogroup's nice does. The process nice is set as
    well for kernels without autogroup; vLLM forks its EngineCore after seconds of imports, and
    the child inherits it.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    except OSError as exc:
        logger.warning("cannot renice vLLM (pid %d) to %d: %s", pid, nice, exc)
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice), encoding="ascii")
    except FileNotFoundError:
        pass  # a kernel built without autogroup: the process nice is what counts
    except OSError as exc:
        logger.warning("cannot set vLLM's autogroup nice to %d: %s", nice, exc)
    else:
        logger.info("vLLM's session yields the CPU: nice %d", nice)


class Launcher:
    def __init__(
        self,
        settings: WorkerSettings,
        command: Command,
        env: Mapping[str, str] | None = None,
        poll_s: float = 0.2,
    ) -> None:
        self.settings = settings
        self.command = command
        self.env = dict(os.environ if env is None else env)
        self.poll_s = poll_s
        self.should_exit = threading.Event()
        self.force_exit = False
        self.received_signal: int | None = None
        self.process: subprocess.Popen[bytes] | None = None

    def run(self) -> int:
        with self.capture_signals():
            # 2. Only a complete model directory may be loaded.
            logger.info("waiting for the completion marker in %s", self.settings.model_path)
            if not wait_for_marker(
                self.settings.model_path, self.settings.marker_timeout_s, self.should_exit
            ):
                logger.info("stop requested before the model was complete; not starting vLLM")
                return 128 + (self.received_signal or signal.SIGTERM)

            # 3. Fail in milliseconds, with the setting's name, instead of deep inside vLLM.
            self.preflight()

            # 4. Its own session = its own process group, so the group can be ended as a whole.
            self.startup()

            # 5. Serve until the engine exits by itself or we are told to stop.
            self.main_loop()

            # 6 and 7.
            return self.shutdown()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # 1. Handlers only set flags; all work happens in the main flow. Restored on the way out.
        original = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit.is_set():
            # A second signal skips the drain, like a second Ctrl-C in uvicorn.
            self.force_exit = True
        self.received_signal = sig
        self.should_exit.set()

    def preflight(self) -> None:
        check_layout(self.settings, read_model_shape(self.settings.model_path))
        check_accelerators(self.settings, pod_accelerators(self.settings, self.env))

    def startup(self) -> None:
        env = {**self.env, **self.command.env}
        try:
            self.process = subprocess.Popen(self.command.argv, env=env, start_new_session=True)
        except OSError as exc:
            raise EngineStartError(f"cannot start {self.command.argv[0]!r}: {exc}") from None
        logger.info("started vLLM: pid=%d (own process group)", self.process.pid)
        if self.settings.nice:
            yield_cpu(self.process.pid, self.settings.nice)

    def main_loop(self) -> None:
        assert self.process is not None
        while self.process.poll() is None and not self.should_exit.is_set():
            self.should_exit.wait(self.poll_s)
        if self.process.returncode is not None:
            logger.info(
                "vLLM exited by itself with status %d", exit_status(self.process.returncode)
            )
        else:
            logger.info("signal %s received; stopping vLLM", self.received_signal)

    def shutdown(self) -> int:
        # Runs whether vLLM died or we were asked to stop: either way stray engine processes of
        # the group must not outlive the pod's main process.
        assert self.process is not None
        pgid = self.process.pid
        self._signal_group(pgid, signal.SIGTERM)
        if not self._wait_group_gone(pgid, self.settings.drain_timeout_s, stop_on_force=True):
            left = group_members(pgid)
            logger.warning(
                "%d vLLM process(es) still running after WORKER_DRAIN_TIMEOUT_S=%gs; SIGKILL",
                len(left),
                self.settings.drain_timeout_s,
            )
            self._signal_group(pgid, signal.SIGKILL)
            if not self._wait_group_gone(pgid, KILL_GRACE_S, stop_on_force=False):
                logger.error("processes %s survived SIGKILL", group_members(pgid))
        status = exit_status(self.process.wait())
        logger.info("vLLM stopped; exiting with status %d", status)
        return status

    def _signal_group(self, pgid: int, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)

    def _wait_group_gone(self, pgid: int, timeout_s: float, stop_on_force: bool) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            # Reap the API server through Popen (keeps its status); reap reparented group
            # members only afterwards, so waitpid never steals that status.
            if self.process is not None and self.process.poll() is not None:
                self._reap_group(pgid)
                if not group_members(pgid):
                    return True
            if stop_on_force and self.force_exit:
                return False
            if time.monotonic() >= deadline:
                return False
            time.sleep(min(self.poll_s, 0.05))

    @staticmethod
    def _reap_group(pgid: int) -> None:
        # Orphans are reparented to us only if we are PID 1 or a subreaper; then their zombies
        # are ours to collect. waitpid(-pgid) touches nothing outside the engine's group.
        while True:
            try:
                pid, _ = os.waitpid(-pgid, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
