"""One source of truth for the engine's command line: the chart gives each worker container
SETTINGS (WORKER_* env), the worker's own argv builder turns them into vLLM flags. This test takes
the env the chart renders for every worker pod (plus what LeaderWorkerSet injects into each pod of
a group), builds WorkerSettings from it, calls worker.argv.build_command, and checks the flags are
the layout the values asked for. It also checks the gateway's rendered env against
GatewaySettings, the other consumer of chart-made settings.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.settings import GatewaySettings
from tests.deploy.manifests import NAMESPACE, REPO, Pod, Release, env_of
from worker.argv import Host, build_command
from worker.settings import WorkerSettings, load_settings

pytestmark = pytest.mark.helm

HOST = Host(python="/usr/bin/python3", cpus=tuple(range(16)))


def lws_pods(pod: Pod) -> Iterator[tuple[int, dict[str, str]]]:
    """(node rank, the env LeaderWorkerSet adds) for each pod this template becomes in group 0."""
    if pod.role == "single":
        yield 0, {}
        return
    lws = pod.owner["metadata"]["name"]
    size = pod.owner["spec"]["leaderWorkerTemplate"]["size"]
    ranks = [0] if pod.role == "leader" else list(range(1, size))
    for rank in ranks:
        yield (
            rank,
            {
                "LWS_LEADER_ADDRESS": f"{lws}-0.{lws}.{NAMESPACE}",
                "LWS_WORKER_INDEX": str(rank),
                "LWS_GROUP_SIZE": str(size),
            },
        )


def settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> WorkerSettings:
    with monkeypatch.context() as m:
        for name in list(os.environ):
            if name.startswith(("WORKER_", "LWS_")):
                m.delenv(name)
        for name, value in env.items():
            m.setenv(name, value)
        return load_settings()


def flags(argv: tuple[str, ...]) -> dict[str, Any]:
    """vLLM flags as a dict: '--x v' -> {'--x': 'v'}, a bare '--x' -> {'--x': True}."""
    out: dict[str, Any] = {}
    for i, token in enumerate(argv):
        if token.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[token] = nxt if nxt is not None and not nxt.startswith("--") else True
    return out


def intended(pool: dict[str, Any], release: Release) -> dict[str, Any]:
    """The flags the values ask for, independent of how the chart or the worker get there."""
    mount = release.values.get("modelStorage", {}).get("mountPath", "/models")
    want: dict[str, Any] = {
        "--served-model-name": pool.get("servedModelName", pool["model"]),
        "--tensor-parallel-size": str(pool.get("tensorParallelSize", 1)),
        "--pipeline-parallel-size": str(pool.get("pipelineParallelSize", 1)),
    }
    device = pool.get("device", "gpu")
    dtype = pool.get("dtype", "auto")
    want["--dtype"] = "float32" if device == "cpu" and dtype == "auto" else dtype
    if pool.get("maxModelLen") is not None:
        want["--max-model-len"] = str(pool["maxModelLen"])
    for key in ("runner", "convert"):
        # vLLM's own default (auto) is left to vLLM: no flag.
        want[f"--{key}"] = None if pool.get(key, "auto") == "auto" else pool[key]
    if device == "gpu":
        want["--gpu-memory-utilization"] = str(pool.get("gpuMemoryUtilization", 0.9))
    return {"model": f"{mount}/{pool['model']}/{pool.get('revision', 'main')}", **want}


def test_rendered_worker_env_gives_the_intended_vllm_command(
    release: Release, monkeypatch: pytest.MonkeyPatch
) -> None:
    pools = {p["name"]: p for p in release.values.get("models", [])}
    for pod in release.worker_pods():
        pool = pools[pod.metadata["labels"]["llmserve.io/pool"]]
        container = pod.container("worker")
        assert container["command"] == ["python3", "-m", "worker"]  # settings in, never flags
        assert "args" not in container
        multi = pool.get("multiNode")
        for rank, lws_env in lws_pods(pod):
            settings = settings_from({**env_of(container), **lws_env}, monkeypatch)
            command = build_command(settings, HOST)
            got = flags(command.argv)
            want = intended(pool, release)
            model = want.pop("model")
            assert (
                command.argv[
                    command.argv.index("serve") + 1
                    if "serve" in command.argv
                    else command.argv.index("--model") + 1
                ]
                == model
            )
            for flag, value in want.items():
                assert got.get(flag) == value, (pod.name, rank, flag, got.get(flag))
            if pool.get("pipelineParallelSize", 1) > 1:
                assert got["--distributed-executor-backend"] == "mp"
            if multi:
                lws = pod.owner["metadata"]["name"]
                assert got["--nnodes"] == str(multi["nodes"])
                assert got["--node-rank"] == str(rank)
                assert got["--master-addr"] == f"{lws}-0.{lws}.{NAMESPACE}"
                default = WorkerSettings.model_fields["master_port"].default
                assert got["--master-port"] == str(multi.get("masterPort", default))
            else:
                assert not {"--nnodes", "--node-rank", "--master-addr"} & set(got)
            if rank == 0:
                # The leader / single pod serves on the port its probes and Service use.
                (http,) = [p for p in container["ports"] if p["name"] == "http"]
                assert got["--port"] == str(http["containerPort"]) and "--headless" not in got
            else:
                assert got["--headless"] is True and "--port" not in got
            extra = pool.get("extraArgs", [])
            assert list(command.argv[len(command.argv) - len(extra) :]) == extra
            # The GPUs the chart requests are exactly the engine ranks the worker starts here.
            limits = container["resources"]["limits"]
            gpus = sum(v for k, v in limits.items() if k.endswith("/gpu"))
            assert gpus == (settings.local_ranks if settings.device == "gpu" else 0), pod.name
            store = command.env.get("VLLM_ENABLE_RESPONSES_API_STORE")
            assert store == ("1" if pool.get("responsesStore") else None), pod.name
            if settings.device == "cpu":
                assert command.env["VLLM_CPU_KVCACHE_SPACE"] == str(
                    pool.get("cpuKvcacheSpaceGib", 1)
                )


def test_worker_cli_prints_the_same_command_for_a_rendered_follower(
    render_case: Any, tmp_path: Path,
) -> None:
    """Through the real entry point (`python -m worker argv`), as a pod would run it: with the
    model on its volume, since argv checks the layout against it as `run` does."""
    rel = render_case("preset:values-pp.yaml")
    follower = next(p for p in rel.worker_pods() if p.role == "follower")
    ((_rank, lws_env),) = lws_pods(follower)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WORKER_", "LWS_"))}
    env.update(env_of(follower.container("worker")))
    env.update(lws_env)
    env["PYTHONPATH"] = str(REPO)
    assert env["WORKER_MODEL_PATH"] == "/models/Llama-3.1-70B-Instruct/main"
    model = tmp_path / "Llama-3.1-70B-Instruct" / "main"
    model.mkdir(parents=True)
    shutil.copy(REPO / "tests/worker/configs/Llama-3.1-70B-Instruct.json", model / "config.json")
    env["WORKER_MODEL_PATH"] = str(model)
    done = subprocess.run(
        [sys.executable, "-m", "worker", "argv"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["argv"][:3] == ["vllm", "serve", str(model)]
    got = flags(tuple(printed["argv"]))
    assert got["--node-rank"] == "1" and got["--headless"] is True and got["--nnodes"] == "2"
    assert got["--tensor-parallel-size"] == "8" and got["--pipeline-parallel-size"] == "2"


def gateway_settings(release: Release, monkeypatch: pytest.MonkeyPatch) -> GatewaySettings:
    """GatewaySettings from the env the chart renders for the gateway, and nothing else."""
    gateway = next(p for p in release.pods() if p.role == "gateway")
    return settings_of_env(env_of(gateway.container("gateway")), monkeypatch)


def settings_of_env(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> GatewaySettings:
    """GatewaySettings from a container's rendered env, and nothing else."""
    with monkeypatch.context() as m:
        for name in list(os.environ):
            if name.startswith("GATEWAY_"):
                m.delenv(name)
        for name, value in env.items():
            m.setenv(name, value)
        return GatewaySettings()


def test_rendered_gateway_env_is_valid_gateway_settings(
    release: Release, monkeypatch: pytest.MonkeyPatch
) -> None:
    gateway = next(p for p in release.pods() if p.role == "gateway")
    settings = gateway_settings(release, monkeypatch)
    http, probes, *epp = gateway.container("gateway")["ports"]
    if settings.mode == "epp":
        assert [p["containerPort"] for p in epp] == [settings.epp.port]
    assert settings.port == http["containerPort"]
    assert settings.edge.probe_port == probes["containerPort"]
    # An EPP finds its pool's pods from the InferencePool, whatever gateway.discovery says.
    assert settings.discovery == ("inferencepool" if settings.mode == "epp" else
                                  release.values.get("gateway", {}).get("discovery", "kubernetes"))
    if settings.discovery == "kubernetes":
        assert (settings.k8s_namespace, settings.k8s_port) == (NAMESPACE, 8000)
    # Every pool's layout, as the pool renders it (llmserve_pool_info).
    pools = [p for p in release.pods() if p.role in ("single", "leader")]
    for layout in settings.pools:
        serving = [p for p in pools if p.metadata.get("labels", {}).get("llmserve.io/pool") == layout.name]
        assert serving, f"GATEWAY_POOLS names {layout.name}, which has no serving pod"
        w = env_of(serving[0].container("worker"))
        assert w["WORKER_SERVED_MODEL_NAME"] == layout.model
        assert int(w["WORKER_TENSOR_PARALLEL_SIZE"]) == layout.tp
        assert int(w["WORKER_PIPELINE_PARALLEL_SIZE"]) == layout.pp
    # Each EPP declares its own pool only (test_gateway_api.py); the gateway, every pool.
    expected = 1 if settings.mode == "epp" else len(release.values.get("models") or [])
    assert len(settings.pools) == expected
