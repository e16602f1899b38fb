"""Start N data-parallel vLLM-CPU workers and the gateway on this machine, and stop them cleanly."""

from __future__ import annotations

import os
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from devstack.procs import Proc, tree_cpu_seconds


class Stalled(TimeoutError):
    """A process we wait for neither wrote to its log nor used any CPU for too long: hung, not
    slow (a start starved of CPU still accrues CPU time)."""


def _progress(procs: list[Proc]) -> list[tuple[int, float]]:
    return [(p.log_size(), tree_cpu_seconds([p])) for p in procs]


# A start that makes progress uses at least this share of a core. The worker's launcher polls
# while vLLM starts, using a little CPU itself, so "any CPU at all" would let a vLLM stuck in the
# kernel under a live launcher pass for a slow start.
STALL_CPU_SHARE = 0.01


def wait_http_ok(url: str, timeout_s: float, procs: list[Proc],
                 stall_s: float | None = None, cpu_share: float = STALL_CPU_SHARE) -> None:
    """Poll `url` until it answers 200; fail fast if a process we depend on has died, or (with
    `stall_s`) if none of them has logged a byte or used `cpu_share` of a core for that long."""
    deadline = time.monotonic() + timeout_s
    seen = _progress(procs) if stall_s is not None else []
    moved = time.monotonic()
    while time.monotonic() < deadline:
        for p in procs:
            if not p.alive():
                raise RuntimeError(f"{p.name} exited with {p.popen.returncode}:\n{p.tail()}")
        if stall_s is not None:
            now = _progress(procs)
            if any(log != log0 or cpu - cpu0 >= stall_s * cpu_share
                   for (log, cpu), (log0, cpu0) in zip(now, seen, strict=True)):
                seen, moved = now, time.monotonic()
            else:
                # A child that exited takes its CPU out of the tree's total: measure from the
                # lower figure, or the tree would have to earn that CPU back to show progress.
                seen = [(log0, min(cpu, cpu0))
                        for (_, cpu), (log0, cpu0) in zip(now, seen, strict=True)]
            if time.monotonic() - moved > stall_s:
                names = ", ".join(p.name for p in procs)
                raise Stalled(f"{url} not ready; {names} silent and idle for {stall_s:.0f}s")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    raise TimeoutError(f"{url} not ready after {timeout_s:.0f}s")


# A vLLM-CPU start that neither logs nor uses CPU for this long is hung (a healthy one logs well
# within it even through its longest step, the compile warm-up, and uses CPU all along).
STALL_S = 300.0


# The gateway's default TTFT target (4 s, 1 s of it queueing) suits GPU engines. One vLLM-CPU
# replica per core takes seconds to the first token of a 32-stream burst with nothing wrong, and
# at that target admission control would refuse part of every burst the local stack can serve.
CPU_FLOW_ARGS = ("--flow.ttft-target-s", "20", "--flow.queue-timeout-s", "5")


@dataclass
class LocalStack:
    model_dir: Path
    workers: int = 2
    gateway_port: int = 8000
    worker_base_port: int = 8101
    host: str = "127.0.0.1"
    log_dir: Path = Path("run/logs")
    kv_cache_gib: int = 1
    engine_nice: int = 10
    drain_timeout_s: float = 15
    gateway_args: list[str] = field(default_factory=list)
    # More worker flags for every worker (LoRA adapters: --lora-adapters, --max-loras, ...).
    worker_args: list[str] = field(default_factory=list)
    # KV cache events (the kv_aware policy): worker i publishes on base + 2i, replays on base + 2i
    # + 1; None: no events.
    kv_events_base_port: int | None = None
    # vLLM's store of Responses API answers on the generating workers (worker --responses-store):
    # previous_response_id, GET and cancel by id (docs/responses.md).
    responses_store: bool = False
    # Workers of a pooling pool of their own (embeddings, score, rerank), started with the others
    # and serving the model as `pooling_model`; behind the gateway unless told otherwise.
    pooling_workers: int = 0
    pooling_args: list[str] = field(default_factory=lambda: ["--runner", "pooling",
                                                             "--convert", "embed"])
    pooling_base_port: int | None = None  # default: right after the generating workers' ports
    pooling_behind_gateway: bool = True
    worker_procs: list[Proc] = field(default_factory=list)
    pooling_procs: list[Proc] = field(default_factory=list)
    gateway_proc: Proc | None = None

    @property
    def worker_urls(self) -> list[str]:
        return [f"http://{self.host}:{self.worker_base_port + i}" for i in range(self.workers)]

    def kv_events_port(self, i: int) -> int:
        assert self.kv_events_base_port is not None
        return self.kv_events_base_port + 2 * i

    def kv_endpoints(self) -> dict[str, str]:
        """Each worker's events endpoint, for GATEWAY_KV__ENDPOINTS (they share one host)."""
        return {u: f"tcp://{self.host}:{self.kv_events_port(i)}"
                for i, u in enumerate(self.worker_urls)}

    @property
    def pooling_urls(self) -> list[str]:
        base = (self.worker_base_port + self.workers if self.pooling_base_port is None
                else self.pooling_base_port)
        return [f"http://{self.host}:{base + j}" for j in range(self.pooling_workers)]

    @property
    def pooling_model(self) -> str:
        return f"{self.model_dir.name}-embed"

    @property
    def gateway_url(self) -> str:
        return f"http://{self.host}:{self.gateway_port}"

    def start_workers(self) -> None:
        """Every worker at once, the pooling pool's too: they start in parallel."""
        for i in range(self.workers):
            self.worker_procs.append(self._worker_proc(i))
        for j in range(self.pooling_workers):
            self.pooling_procs.append(self._pooling_proc(j))

    def _pooling_proc_argv(self, j: int) -> list[str]:
        port = int(self.pooling_urls[j].rsplit(":", 1)[1])
        return [*self._worker_argv(self.workers + j, port),
                "--served-model-name", self.pooling_model, *self.pooling_args]

    def _pooling_proc(self, j: int) -> Proc:
        env = dict(os.environ)
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        return Proc(f"pooling-{j}", self._pooling_proc_argv(j), env,
                    self.log_dir / f"pooling-{j}.log")

    def _generating_argv(self, i: int) -> list[str]:
        argv = [*self._worker_argv(i, self.worker_base_port + i), *self.worker_args]
        if self.responses_store:
            argv.append("--responses-store")
        if self.kv_events_base_port is not None:
            argv += ["--kv-events-port", str(self.kv_events_port(i))]
        return argv

    def _worker_proc(self, i: int) -> Proc:
        env = dict(os.environ)
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        return Proc(f"worker-{i}", self._generating_argv(i), env,
                    self.log_dir / f"worker-{i}.log")

    def _worker_argv(self, i: int, port: int) -> list[str]:
        """The flags every worker of the stack gets: the model, one core, drain and priority."""
        cores = os.cpu_count() or 1
        return [
            sys.executable, "-m", "worker",
            "--model-path", str(self.model_dir),
            "--device", "cpu",
            "--host", self.host,
            "--port", str(port),
            "--cpu-kvcache-space-gib", str(self.kv_cache_gib),
            # One core per replica: DP replicas sharing cores just fight over them.
            "--cpu-threads-bind", str(i % cores),
            # The worker drains its requests in flight for up to this long before it stops vLLM.
            "--drain-timeout-s", str(self.drain_timeout_s),
            # The gateway shares these cores; at the engines' priority it waits for a core
            # under overload and its refusals slow down (docs/benchmarks.md, flow control).
            "--nice", str(self.engine_nice),
        ]

    def restart_worker(self, i: int, timeout_s: float = 600, kill: bool = False) -> None:
        """Stop worker `i` as Kubernetes would (SIGTERM: it drains, then stops vLLM), or with
        `kill` as a crash would (SIGKILL to the launcher and its engine), wait for every process
        of it to be gone, start it again and wait until it is healthy."""
        if kill:
            self.worker_procs[i].kill_hard()
        # The launcher's own bound (drain, then the engine's exit) plus a margin; past it the
        # whole tree is SIGKILLed, so no engine outlives the old worker.
        self.worker_procs[i].stop(grace_s=self.drain_timeout_s + 15)
        self.worker_procs[i] = self._worker_proc(i)
        self._wait_worker(i, timeout_s)

    def wait_workers(self, timeout_s: float = 600) -> None:
        for i in range(self.workers):
            self._wait_worker(i, timeout_s)
        for j, url in enumerate(self.pooling_urls):
            wait_http_ok(url + "/health", timeout_s, [self.pooling_procs[j]], stall_s=STALL_S)

    def _wait_worker(self, i: int, timeout_s: float) -> None:
        """Until worker `i` is healthy. A start that hangs (no log line and no CPU used for
        STALL_S) is killed and started once more, as a Kubernetes startupProbe would; the log says
        so. A start that is only slow, starved of CPU by its neighbours, is waited for. (A
        restarted vLLM-CPU can hang in the kernel's affinity change that torch's MKL makes at
        import; worker/startup_cpus.py keeps that from happening, and this catches it if something
        else ever does the same.)"""
        url = self.worker_urls[i] + "/health"
        try:
            wait_http_ok(url, timeout_s, [self.worker_procs[i]], stall_s=STALL_S)
        except Stalled as exc:
            proc = self.worker_procs[i]
            proc.note(f"devstack: {exc}; killing it and starting it again")
            proc.kill_hard()
            proc.stop(grace_s=5)
            self.worker_procs[i] = self._worker_proc(i)
            wait_http_ok(url, timeout_s, [self.worker_procs[i]], stall_s=STALL_S)

    def gateway_flags(self) -> list[str]:
        argv = ["--host", self.host, "--port", str(self.gateway_port), *CPU_FLOW_ARGS]
        pooling = self.pooling_urls if self.pooling_behind_gateway else []
        for url in self.worker_urls + pooling:
            argv += ["--backend", url]
        return argv + self.gateway_args  # after the defaults above: argparse keeps the last value

    def start_gateway(self) -> None:
        argv = [sys.executable, "-m", "gateway", *self.gateway_flags()]
        self.gateway_proc = Proc("gateway", argv, dict(os.environ), self.log_dir / "gateway.log")

    def wait_gateway(self, timeout_s: float = 60) -> None:
        assert self.gateway_proc is not None
        wait_http_ok(self.gateway_url + "/ready", timeout_s, [self.gateway_proc])

    def all_procs(self) -> list[Proc]:
        return (([self.gateway_proc] if self.gateway_proc else []) + self.worker_procs
                + self.pooling_procs)

    def stop(self) -> None:
        # Gateway first so no new request reaches a worker that is going away.
        for p in self.all_procs():
            p.stop()
