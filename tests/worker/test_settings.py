from __future__ import annotations

from pathlib import Path

import pytest

from worker.settings import SettingsError, WorkerSettings, load_settings


def test_defaults_and_derived_values() -> None:
    s = load_settings(model_path="/models/SmolLM2-135M-Instruct")
    assert s.model_name == "SmolLM2-135M-Instruct"
    assert (s.tensor_parallel_size, s.pipeline_parallel_size, s.nnodes, s.node_rank) == (1, 1, 1, 0)
    assert s.device == "gpu" and s.resolved_dtype == "auto"
    assert s.is_leader and not s.multi_node and s.local_ranks == 1


def test_served_model_name_overrides_directory_name() -> None:
    assert load_settings(model_path="/m/x", served_model_name="chat").model_name == "chat"


def test_cpu_resolves_auto_dtype_to_float32() -> None:
    assert load_settings(model_path="/m/x", device="cpu").resolved_dtype == "float32"


def test_settings_are_frozen() -> None:
    s = load_settings(model_path="/m/x")
    with pytest.raises(ValueError):
        s.port = 1  # type: ignore[misc]


def test_env_is_read_with_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_MODEL_PATH", "/m/x")
    monkeypatch.setenv("WORKER_TENSOR_PARALLEL_SIZE", "3")
    monkeypatch.setenv("WORKER_DEVICE", "cpu")
    s = load_settings()
    assert s.model_path == Path("/m/x")
    assert s.tensor_parallel_size == 3 and s.device == "cpu"


def test_overrides_win_over_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_MODEL_PATH", "/m/x")
    monkeypatch.setenv("WORKER_PORT", "9000")
    assert load_settings(port="9100").port == 9100


def test_lws_env_provides_multi_node_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LWS_LEADER_ADDRESS", "llm-0.llm.ns")
    monkeypatch.setenv("LWS_WORKER_INDEX", "1")
    monkeypatch.setenv("LWS_GROUP_SIZE", "2")
    s = load_settings(model_path="/m/x", pipeline_parallel_size=2)
    assert (s.master_addr, s.node_rank, s.nnodes) == ("llm-0.llm.ns", 1, 2)
    assert not s.is_leader and s.local_ranks == 1


def test_explicit_worker_values_win_over_lws(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LWS_LEADER_ADDRESS", "from-lws")
    monkeypatch.setenv("LWS_WORKER_INDEX", "1")
    monkeypatch.setenv("LWS_GROUP_SIZE", "2")
    monkeypatch.setenv("WORKER_MASTER_ADDR", "from-worker")
    monkeypatch.setenv("WORKER_NODE_RANK", "0")
    s = load_settings(model_path="/m/x", pipeline_parallel_size=2)
    assert (s.master_addr, s.node_rank, s.nnodes) == ("from-worker", 0, 2)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('["--enforce-eager", "--seed", "7"]', ["--enforce-eager", "--seed", "7"]),
        (
            "--enforce-eager --chat-template-content-format 'string value'",
            ["--enforce-eager", "--chat-template-content-format", "string value"],
        ),
        ("", []),
    ],
)
def test_extra_args_from_env_json_or_shell(
    monkeypatch: pytest.MonkeyPatch, raw: str, expected: list[str]
) -> None:
    monkeypatch.setenv("WORKER_EXTRA_ARGS", raw)
    assert load_settings(model_path="/m/x").extra_args == expected


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({}, "WORKER_MODEL_PATH is required"),
        ({"port": "http"}, "WORKER_PORT: Input should be a valid integer"),
        ({"port": 70000}, "WORKER_PORT: Input should be less than or equal to 65535"),
        ({"master_port": 0}, "WORKER_MASTER_PORT: Input should be greater than or equal to 1"),
        ({"gpu_memory_utilization": 1.5}, "WORKER_GPU_MEMORY_UTILIZATION: Input should be less"),
        ({"gpu_memory_utilization": 0}, "WORKER_GPU_MEMORY_UTILIZATION: Input should be greater"),
        ({"tensor_parallel_size": 0}, "WORKER_TENSOR_PARALLEL_SIZE: Input should be greater"),
        ({"device": "tpu"}, "WORKER_DEVICE: Input should be 'gpu' or 'cpu'"),
        ({"dtype": "fp8"}, "WORKER_DTYPE: unknown dtype 'fp8'"),
        ({"marker_timeout_s": 0}, "WORKER_MARKER_TIMEOUT_S: Input should be greater than 0"),
        ({"extra_args": "[oops"}, "WORKER_EXTRA_ARGS: not a valid JSON list"),
        (
            {"node_rank": 2, "nnodes": 2, "master_addr": "a", "pipeline_parallel_size": 2},
            "WORKER_NODE_RANK=2 must be below WORKER_NNODES=2",
        ),
        (
            {"nnodes": 2, "pipeline_parallel_size": 2},
            "WORKER_MASTER_ADDR is required when WORKER_NNODES=2",
        ),
        (
            {"nnodes": 2, "master_addr": "a"},
            "WORKER_PIPELINE_PARALLEL_SIZE=1 must be a multiple of WORKER_NNODES=2",
        ),
        (
            {"nnodes": 2, "master_addr": "a", "pipeline_parallel_size": 3},
            "WORKER_PIPELINE_PARALLEL_SIZE=3 must be a multiple of WORKER_NNODES=2",
        ),
        (
            {"nnodes": 2, "master_addr": "a", "pipeline_parallel_size": 2, "master_port": 8000},
            "WORKER_MASTER_PORT=8000 collides with WORKER_PORT=8000",
        ),
        (
            {"device": "cpu", "dtype": "bfloat16"},
            "WORKER_DTYPE=bfloat16 is refused on WORKER_DEVICE=cpu",
        ),
        (
            {"device": "cpu", "dtype": "float16"},
            "WORKER_DTYPE=float16 is refused on WORKER_DEVICE=cpu",
        ),
        (
            {"device": "cpu", "pipeline_parallel_size": 2, "cpu_threads_bind": "0"},
            "WORKER_CPU_THREADS_BIND='0' has 1 group(s) but this node runs 2 local rank(s)",
        ),
        (
            {"device": "cpu", "cpu_threads_bind": "0||1"},
            "WORKER_CPU_THREADS_BIND='0||1' has an empty group",
        ),
        ({"cpu_threads_bind": "0"}, "WORKER_CPU_THREADS_BIND only applies to WORKER_DEVICE=cpu"),
        (
            {"device": "cpu", "sleep_mode": True},
            "WORKER_SLEEP_MODE is refused on WORKER_DEVICE=cpu: vLLM offers sleep mode on CUDA",
        ),
        (
            {
                "launcher": "module",
                "nnodes": 2,
                "node_rank": 1,
                "master_addr": "a",
                "pipeline_parallel_size": 2,
            },
            "WORKER_LAUNCHER=module cannot run a follower",
        ),
    ],
)
def test_invalid_settings_name_the_setting(overrides: dict[str, object], message: str) -> None:
    overrides = {"model_path": "/m/x", **overrides} if overrides else {}
    with pytest.raises(SettingsError) as caught:
        load_settings(**overrides)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_all_problems_are_reported_together() -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(model_path="/m/x", device="cpu", dtype="bfloat16", nnodes=2)
    text = str(caught.value)
    assert "WORKER_MASTER_ADDR" in text and "WORKER_DTYPE" in text and "WORKER_PIPELINE" in text


def test_vllm_binding_keywords_are_accepted_on_cpu() -> None:
    s = load_settings(
        model_path="/m/x", device="cpu", pipeline_parallel_size=2, cpu_threads_bind="nobind"
    )
    assert s.cpu_threads_bind == "nobind"


def test_every_field_has_a_description() -> None:
    # --help is generated from these; an undocumented setting would be an undocumented flag.
    assert all(info.description for info in WorkerSettings.model_fields.values())
