"""Run one vLLM engine for the life of the pod, and take all of it down when asked.

The lifecycle, in order (``Launcher.run``):

1. capture SIGTERM/SIGINT, so a stop request during any later step is honoured;
2. wait for the model directory's completion marker (never load a half-written model), and for
   each declared LoRA adapter's;
3. pre-flight: the parallel layout against config.json and the pod's accelerators; each adapter
   against the model (its base), and `--max-lora-rank` from their ranks when not set
   (worker/lora.py: the command is built again with it);
4. start vLLM in a new session, i.e. its own process group;
5. wait until the engine exits or a stop signal arrives;
6. on a stop signal, drain the requests (``drain_requests``): the API server turns not-ready
   and refuses new requests (``worker.drain``), and those in flight get up to
   ``drain_timeout_s`` to finish. A follower of a multi-node group serves no API, but its
   pipeline stages carry the leader's requests: it waits for the leader's drain
   (``wait_for_leader``), or a group removed by a scale-down or a rollout would cut the streams
   the leader is still finishing;
7. shut down the whole group: SIGTERM, what is left of ``drain_timeout_s`` (at least
   ``ENGINE_EXIT_MIN_S``) to exit, then SIGKILL;
8. exit with the engine's status.

Step 6 targets the process group, not the API server's pid: vLLM's API server leaves its
``VLLM::EngineCore`` and ``VLLM::Worker_*`` children running when it alone gets SIGTERM. Those
orphans keep the group id, so signalling the group reaches them wherever they were reparented.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from pathlib import Path
from types import FrameType

from model_store.marker import is_complete, marker_path
from worker.argv import Command, build_command
from worker.drain import DRAIN_FILE_ENV
from worker.preflight import preflight
from worker.settings import WorkerSettings
from worker.startup_cpus import release, startup_cpus
from worker.stop import Stop, StopRequest

logger = logging.getLogger("worker")

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# How often the launcher asks a vLLM started on its own cores whether it serves yet, and after how
# long without an answer it says so (a port moved by extra args, TLS: /health never answers here).
STARTUP_POLL_S = 1.0
NARROW_WARN_S = 900.0
# After SIGKILL the kernel needs a moment to tear processes down; this only bounds that wait.
KILL_GRACE_S = 10.0
# After the request drain, vLLM's own teardown (engine core, workers) takes a few seconds; a drain
# that used the whole timeout must not turn a clean exit into a SIGKILL.
ENGINE_EXIT_MIN_S = 5.0


class MarkerTimeout(RuntimeError):
    """The model directory did not become complete in time."""


class EngineStartError(RuntimeError):
    """The engine command could not be executed at all."""


def wait_for_marker(
    model_dir: Path,
    timeout_s: float,
    stop: Stop,
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
    (the gateway's refusal latency stayed as it was, docs/benchmarks.md), while the autogroup's
    nice does. The process nice is set as
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


def _loopback(host: str) -> str:
    """Where this pod reaches its own API server bound to ``host``."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _cpus(cpus: frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def _serves(url: str) -> bool:
    """The API server answers 200 on /health."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, http.client.HTTPException):
        return False  # not up, or not speaking HTTP yet: either way, not serving


# What an API server's /health says about its drain (worker.drain).
GONE = -1  # unreachable: stopped, or not serving yet
SERVING = -2  # 200: not draining
UNKNOWN = -3  # another answer: no drain middleware behind it


def _drain_state(url: str) -> int:
    """The drain middleware's count of requests in flight (>= 0) from its 503 on /health, or
    GONE, SERVING, UNKNOWN."""
    try:
        with urllib.request.urlopen(url, timeout=2):
            return SERVING
    except urllib.error.HTTPError as exc:
        with exc:
            try:
                state = json.loads(exc.read())
            except ValueError:
                return UNKNOWN
    except (urllib.error.URLError, OSError, http.client.HTTPException):
        return GONE
    count = state.get("in_flight") if isinstance(state, dict) else None
    draining = isinstance(count, int) and count >= 0 and state.get("status") == "draining"
    return count if draining else UNKNOWN


def _in_flight(url: str) -> int | None:
    """The drain middleware's count of requests in flight; None when the server is unreachable or
    not draining (no middleware behind it)."""
    state = _drain_state(url)
    return state if state >= 0 else None


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
        self.should_exit = StopRequest()  # set by the signal handler: lock-free
        self.force_exit = False
        self.received_signal: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        # The flag file that turns the API server's drain middleware on (worker.drain).
        self._drain_dir: tempfile.TemporaryDirectory[str] | None = None
        self.drain_file: Path | None = None
        # The CPUs vLLM was started on (worker.startup_cpus), until it serves; then None.
        self.startup_cpus: frozenset[int] | None = None
        self._allowed = frozenset(os.sched_getaffinity(0))
        self._engine_env: Mapping[str, str] = {}
        self._narrowed_at = 0.0

    def run(self) -> int:
        with self.capture_signals():
            # 2. Only a complete model directory may be loaded.
            logger.info("waiting for the completion marker in %s", self.settings.model_path)
            if not self.wait_for_markers():
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
            self.should_exit.close()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit.is_set():
            # A second signal skips the drain, like a second Ctrl-C in uvicorn.
            self.force_exit = True
        self.received_signal = sig
        self.should_exit.set()

    def wait_for_markers(self) -> bool:
        """The model's marker, then each adapter's (each within WORKER_MARKER_TIMEOUT_S: the
        fetches run side by side); False if a stop came first."""
        for name, path in [("", self.settings.model_path),
                           *sorted(self.settings.lora_adapters.items())]:
            if name:
                logger.info("waiting for the completion marker of adapter %s in %s", name, path)
            if not wait_for_marker(path, self.settings.marker_timeout_s, self.should_exit):
                return False
        return True

    def preflight(self) -> None:
        resolved = preflight(self.settings, self.env)  # the checks `argv` applies too
        if resolved is not self.settings:
            logger.info("LoRA: %d adapter(s) at start, --max-lora-rank %s",
                        len(resolved.lora_adapters), resolved.max_lora_rank)
            self.settings = resolved
            self.command = build_command(resolved)

    def startup(self) -> None:
        env = {**self.env, **self.command.env}
        if self.settings.is_leader:
            self._drain_dir = tempfile.TemporaryDirectory(prefix="llmserve-drain-")
            self.drain_file = Path(self._drain_dir.name) / "draining"
            env[DRAIN_FILE_ENV] = str(self.drain_file)
            # vLLM imports the middleware (--middleware worker.drain...): the same worker package
            # as this launcher's, whatever the working directory.
            here = str(Path(__file__).resolve().parents[1])
            env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        # On its bind cores until it serves (worker.startup_cpus: torch's MKL otherwise moves each
        # vLLM process onto every CPU at import, and a move onto another engine's busy core was
        # seen to hang for minutes). Only a leader has the /health that says it serves.
        self.startup_cpus = (startup_cpus(env.get("VLLM_CPU_OMP_THREADS_BIND"), self._allowed)
                             if self.settings.device == "cpu" and self.settings.is_leader
                             else None)
        self._engine_env = env
        self._narrowed_at = time.monotonic()
        # Set in the child between fork and exec: the launcher has no other thread to upset.
        pin = (partial(os.sched_setaffinity, 0, self.startup_cpus)
               if self.startup_cpus is not None else None)
        try:
            self.process = subprocess.Popen(self.command.argv, env=env, start_new_session=True,
                                            preexec_fn=pin)  # noqa: PLW1509 - no threads here
        except OSError as exc:
            raise EngineStartError(f"cannot start {self.command.argv[0]!r}: {exc}") from None
        logger.info("started vLLM: pid=%d (own process group)", self.process.pid)
        if self.startup_cpus is not None:
            logger.info("vLLM starts on CPUs %s (its bind) until it serves",
                        _cpus(self.startup_cpus))
        if self.settings.nice:
            yield_cpu(self.process.pid, self.settings.nice)

    def main_loop(self) -> None:
        assert self.process is not None
        url = self.health_url
        next_look = 0.0
        while self.process.poll() is None and not self.should_exit.is_set():
            if self.startup_cpus is not None and time.monotonic() >= next_look:
                next_look = time.monotonic() + STARTUP_POLL_S
                if _serves(url):
                    self.release_cpus()
                elif time.monotonic() - self._narrowed_at > NARROW_WARN_S:
                    logger.warning("vLLM has not answered %s for %.0f min: its API server and "
                                   "engine core stay on CPUs %s until it does", url,
                                   NARROW_WARN_S / 60, _cpus(self.startup_cpus))
                    self._narrowed_at = float("inf")  # once
            self.should_exit.wait(self.poll_s)
        if self.process.returncode is not None:
            logger.info(
                "vLLM exited by itself with status %d", exit_status(self.process.returncode)
            )
        else:
            logger.info("signal %s received; stopping vLLM", self.received_signal)

    @property
    def health_url(self) -> str:
        """Where this launcher reaches its own API server's /health (start-up and drain)."""
        return f"http://{_loopback(self.settings.host)}:{self.settings.port}/health"

    def release_cpus(self) -> None:
        """vLLM serves: its API server and engine core may use all the launcher's CPUs again."""
        assert self.process is not None
        threads = release(self.process.pid, group_members(self.process.pid), self._allowed,
                          self._engine_env)
        if threads:
            logger.info("vLLM serves: its API server and engine core may use CPUs %s again "
                        "(%d threads; workers keep their bind)", _cpus(self._allowed), threads)
        else:
            logger.info("vLLM serves; its processes keep CPUs %s (the model runs in the API "
                        "server, or no engine core was found)", _cpus(self.startup_cpus or
                                                                     self._allowed))
        self.startup_cpus = None

    def shutdown(self) -> int:
        # Runs whether vLLM died or we were asked to stop: either way stray engine processes of
        # the group must not outlive the pod's main process.
        assert self.process is not None
        pgid = self.process.pid
        timeout = self.settings.drain_timeout_s
        deadline = time.monotonic() + timeout
        if self.process.poll() is None and not self.force_exit:
            self.drain_requests(deadline)
        self._signal_group(pgid, signal.SIGTERM)
        exit_s = max(deadline - time.monotonic(), min(ENGINE_EXIT_MIN_S, timeout))
        if not self._wait_group_gone(pgid, exit_s, stop_on_force=True):
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
        if self._drain_dir is not None:
            self._drain_dir.cleanup()
        logger.info("vLLM stopped; exiting with status %d", status)
        return status

    def drain_requests(self, deadline: float) -> None:
        """Turn the API server not-ready and wait, until ``deadline``, for its requests in flight
        to end (worker.drain). Returns at once when the server does not answer with a drain
        state: still loading (nothing to drain), or started without the middleware."""
        assert self.process is not None
        if not self.settings.is_leader:
            self.wait_for_leader(deadline)
            return
        if self.drain_file is None:
            return
        self.drain_file.touch()
        url = self.health_url
        first = True
        while self.process.poll() is None and not self.force_exit:
            in_flight = _in_flight(url)
            if in_flight is None:
                if not first:
                    logger.warning("lost the drain state at %s; stopping vLLM", url)
                return
            if first:
                logger.info("draining: not ready, new requests refused, %d in flight", in_flight)
                first = False
            if in_flight == 0:
                logger.info("drained: no request in flight")
                return
            if time.monotonic() >= deadline:
                logger.warning(
                    "%d request(s) still in flight after WORKER_DRAIN_TIMEOUT_S=%gs; stopping vLLM",
                    in_flight, self.settings.drain_timeout_s,
                )
                return
            time.sleep(self.poll_s)

    @property
    def leader_health_url(self) -> str:
        """A follower's way to its leader's /health: the leader's address (LWS_LEADER_ADDRESS) and
        the pool's API port, which every pod of a group shares."""
        assert self.settings.master_addr is not None  # required for a follower (settings)
        host = self.settings.master_addr
        return f"http://{f'[{host}]' if ':' in host else host}:{self.settings.port}/health"

    def wait_for_leader(self, deadline: float) -> None:
        """A follower keeps its engine ranks up while its leader still finishes requests: until
        the leader's API server is gone or drained to zero, or ``deadline``. A leader still
        serving (its stop signal may come a moment after ours, or not at all when only this pod
        goes) is waited for until the deadline too: stopping first would cut its streams."""
        assert self.process is not None
        url = self.leader_health_url
        logger.info("follower: waiting for the leader's drain (%s) before stopping vLLM", url)
        while self.process.poll() is None and not self.force_exit:
            state = _drain_state(url)
            if state == GONE or state == 0:
                logger.info("follower: the leader %s; stopping vLLM",
                            "is gone" if state == GONE else "has drained")
                return
            if time.monotonic() >= deadline:
                logger.warning("follower: the leader still serves after WORKER_DRAIN_TIMEOUT_S="
                               "%gs; stopping vLLM", self.settings.drain_timeout_s)
                return
            time.sleep(self.poll_s)

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
