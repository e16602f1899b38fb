from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.worker.conftest import ModelDirFactory
from worker.argv import Command, Host, build_command, derive_threads_bind
from worker.settings import load_settings

HOST = Host(python="/venv/bin/python", cpus=(0, 1))
REPO = Path(__file__).resolve().parents[2]


def flag_value(cmd: Command, flag: str) -> str:
    """The value after ``flag``; fails the test if the flag is absent or repeated."""
    assert cmd.argv.count(flag) == 1, f"{flag} appears {cmd.argv.count(flag)} times in {cmd.argv}"
    return cmd.argv[cmd.argv.index(flag) + 1]


def test_single_node_tensor_parallel_on_gpu_uses_vllm_serve() -> None:
    s = load_settings(model_path="/models/llama", tensor_parallel_size=4, max_model_len=8192)
    cmd = build_command(s, HOST)
    assert cmd.argv[:3] == ("vllm", "serve", "/models/llama")
    assert flag_value(cmd, "--tensor-parallel-size") == "4"
    assert flag_value(cmd, "--pipeline-parallel-size") == "1"
    assert flag_value(cmd, "--max-model-len") == "8192"
    assert flag_value(cmd, "--gpu-memory-utilization") == "0.9"
    assert flag_value(cmd, "--served-model-name") == "llama"
    assert flag_value(cmd, "--dtype") == "auto"
    assert (flag_value(cmd, "--host"), flag_value(cmd, "--port")) == ("0.0.0.0", "8000")
    # The API server drains before a stop (worker/drain.py).
    assert flag_value(cmd, "--middleware") == "worker.drain.DrainMiddleware"
    # One node, no pipeline: nothing multi-node, and vLLM picks its own TP executor.
    for absent in (
        "--nnodes",
        "--node-rank",
        "--master-addr",
        "--headless",
        "--distributed-executor-backend",
    ):
        assert absent not in cmd.argv
    assert cmd.env == {}


def test_multi_node_pipeline_leader_from_lws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LWS_LEADER_ADDRESS", "llm-0.llm.serving")
    monkeypatch.setenv("LWS_WORKER_INDEX", "0")
    monkeypatch.setenv("LWS_GROUP_SIZE", "2")
    s = load_settings(model_path="/models/big", tensor_parallel_size=8, pipeline_parallel_size=2)
    cmd = build_command(s, HOST)
    assert cmd.argv[:2] == ("vllm", "serve")
    assert flag_value(cmd, "--distributed-executor-backend") == "mp"
    assert flag_value(cmd, "--nnodes") == "2"
    assert flag_value(cmd, "--node-rank") == "0"
    assert flag_value(cmd, "--master-addr") == "llm-0.llm.serving"
    assert flag_value(cmd, "--master-port") == "29500"
    assert flag_value(cmd, "--port") == "8000"
    assert "--headless" not in cmd.argv


def test_multi_node_pipeline_follower_is_headless(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LWS_LEADER_ADDRESS", "llm-0.llm.serving")
    monkeypatch.setenv("LWS_WORKER_INDEX", "1")
    monkeypatch.setenv("LWS_GROUP_SIZE", "2")
    s = load_settings(model_path="/models/big", pipeline_parallel_size=2, master_port=29600)
    cmd = build_command(s, HOST)
    assert flag_value(cmd, "--node-rank") == "1"
    assert flag_value(cmd, "--master-port") == "29600"
    assert "--headless" in cmd.argv
    # Followers serve no API.
    assert "--host" not in cmd.argv and "--port" not in cmd.argv
    assert "--middleware" not in cmd.argv


def test_sleep_mode_on_leader_and_follower(monkeypatch: pytest.MonkeyPatch) -> None:
    """The flag on every engine of the pool; the endpoints that use it (POST /sleep, /wake_up)
    exist only with vLLM's development mode, which only a serving leader has any use for."""
    leader = build_command(load_settings(model_path="/models/m", sleep_mode=True), HOST)
    assert leader.argv.count("--enable-sleep-mode") == 1
    assert leader.env == {"VLLM_SERVER_DEV_MODE": "1"}
    assert "--enable-sleep-mode" not in build_command(load_settings(model_path="/m/x"), HOST).argv
    monkeypatch.setenv("LWS_LEADER_ADDRESS", "llm-0.llm.serving")
    monkeypatch.setenv("LWS_WORKER_INDEX", "1")
    monkeypatch.setenv("LWS_GROUP_SIZE", "2")
    follower = build_command(
        load_settings(model_path="/models/m", pipeline_parallel_size=2, sleep_mode=True), HOST)
    assert "--enable-sleep-mode" in follower.argv and "--headless" in follower.argv


def test_cpu_leader_uses_module_form_float32_and_cpu_env() -> None:
    s = load_settings(model_path="/models/smol", device="cpu", cpu_kvcache_space_gib=2)
    cmd = build_command(s, HOST)
    assert cmd.argv[:5] == (
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/smol",
    )
    assert flag_value(cmd, "--dtype") == "float32"
    assert "--gpu-memory-utilization" not in cmd.argv
    assert cmd.env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert cmd.env["VLLM_TARGET_DEVICE"] == "cpu"
    # One rank: vLLM's own binding works, so none is forced.
    assert "VLLM_CPU_OMP_THREADS_BIND" not in cmd.env


def test_cpu_pipeline_binds_one_core_per_local_rank() -> None:
    s = load_settings(model_path="/models/smol", device="cpu", pipeline_parallel_size=2)
    cmd = build_command(s, HOST)
    assert cmd.env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    assert flag_value(cmd, "--distributed-executor-backend") == "mp"


def test_explicit_thread_binding_wins() -> None:
    s = load_settings(model_path="/m", device="cpu", cpu_threads_bind="1")
    assert build_command(s, HOST).env["VLLM_CPU_OMP_THREADS_BIND"] == "1"


def test_cpu_follower_uses_real_cli_through_shim() -> None:
    s = load_settings(
        model_path="/models/smol",
        device="cpu",
        pipeline_parallel_size=2,
        nnodes=2,
        node_rank=1,
        master_addr="127.0.0.1",
        cpu_threads_bind="1",
    )
    cmd = build_command(s, HOST)
    assert cmd.argv[:5] == (
        "/venv/bin/python",
        "-m",
        "worker.vllm_cli_shim",
        "serve",
        "/models/smol",
    )
    assert "--headless" in cmd.argv


@pytest.mark.parametrize(
    ("device", "launcher", "head"),
    [
        (
            "gpu",
            "module",
            ("/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model"),
        ),
        ("cpu", "cli", ("/venv/bin/python", "-m", "worker.vllm_cli_shim", "serve")),
        ("gpu", "cli", ("vllm", "serve")),
    ],
)
def test_explicit_launcher(device: str, launcher: str, head: tuple[str, ...]) -> None:
    cmd = build_command(load_settings(model_path="/m", device=device, launcher=launcher), HOST)
    assert cmd.argv[: len(head)] == head


def test_extra_args_come_last_verbatim() -> None:
    s = load_settings(model_path="/m", extra_args=["--enforce-eager", "--seed", "7"])
    assert build_command(s, HOST).argv[-3:] == ("--enforce-eager", "--seed", "7")


@pytest.mark.parametrize(
    ("ranks", "cpus", "expected"),
    [
        (1, (0, 1), None),
        (2, (0, 1), "0|1"),
        (2, (0, 1, 2, 3, 4, 5, 6, 7), "0-3|4-7"),
        (3, (0, 1), "0|1|0"),
        (2, (2, 3, 5), "2-3|5"),
        (3, (0, 1, 2, 3, 4, 5, 6), "0-2|3-4|5-6"),
        (2, (0, 2, 4, 6), "0,2|4,6"),
    ],
)
def test_derive_threads_bind(ranks: int, cpus: tuple[int, ...], expected: str | None) -> None:
    assert derive_threads_bind(ranks, cpus) == expected


def test_cli_argv_mode_prints_what_build_command_builds(make_model_dir: ModelDirFactory) -> None:
    """`python -m worker argv` is the same function, so Helm tests can rely on its output."""
    model = make_model_dir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WORKER_", "LWS_"))}
    env |= {
        "WORKER_MODEL_PATH": str(model),
        "WORKER_DEVICE": "cpu",
        "LWS_LEADER_ADDRESS": "leader",
        "LWS_WORKER_INDEX": "1",
        "LWS_GROUP_SIZE": "2",
    }
    done = subprocess.run(
        [sys.executable, "-m", "worker", "argv", "--pipeline-parallel-size", "2"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    printed = json.loads(done.stdout)
    settings = load_settings(
        model_path=model,
        device="cpu",
        pipeline_parallel_size=2,
        nnodes=2,
        node_rank=1,
        master_addr="leader",
    )
    assert printed == build_command(settings, Host.current()).to_json_dict()


def test_kv_events_on_the_port_and_replay_on_the_next_where_the_gateway_looks() -> None:
    from gateway.routing.kv_events import events_endpoint, replay_endpoint
    from gateway.settings import KvSettings

    cmd = build_command(load_settings(model_path="/models/m", kv_events_port=5601), HOST)
    config = json.loads(flag_value(cmd, "--kv-events-config"))
    assert config == {"enable_kv_cache_events": True, "publisher": "zmq",
                      "endpoint": "tcp://*:5601", "replay_endpoint": "tcp://*:5602"}
    # The gateway's side of the seam: the same ports on the replica's host.
    ep = events_endpoint("http://10.1.2.3:8000", KvSettings(events_port=5601))
    assert ep == "tcp://10.1.2.3:5601" and replay_endpoint(ep) == "tcp://10.1.2.3:5602"
    assert "--kv-events-config" not in build_command(load_settings(model_path="/m"), HOST).argv
