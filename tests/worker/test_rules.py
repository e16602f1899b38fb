"""The layout rules shared by the planner, the worker and the chart (worker/rules.py), and the
seam with the chart's generated values.schema.json."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.argv import Host, build_command
from worker.rules import (
    CONVERTS,
    MAX_GROUP_NODES,
    POOL_NAME_MAX,
    POOL_NAME_PATTERN,
    RUNNERS,
    Placement,
    group_problem,
    is_pooling,
    model_and_revision,
    place,
    pod_gpus,
    pool_name,
    runner_problem,
)
from worker.settings import SettingsError, load_settings

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "deploy/helm/llmserve/values.schema.json").read_text())


def schema_accepts(values: dict[str, object]) -> bool:
    return jsonschema.Draft7Validator(SCHEMA).is_valid(values)


def _pool(**extra: object) -> dict[str, object]:
    return {"name": "p", "model": "m", "source": {"s3": "s3://models/m"}, **extra}


@pytest.mark.parametrize(
    ("model", "tp", "pp", "name"),
    [
        ("Qwen2.5-72B-Instruct", 1, 2, "qwen2-5-72b-instruct-tp1pp2"),  # 27 characters
        ("Llama-3.1-8B-Instruct", 2, 1, "llama-3-1-8b-instruct-tp2"),
        ("01-ai_Yi--34B", 4, 1, "m-01-ai-yi-34b-tp4"),  # a DNS label starts with a letter
        ("...", 1, 1, "model-tp1"),
    ],
)
def test_pool_names(model: str, tp: int, pp: int, name: str) -> None:
    assert pool_name(model, tp, pp) == name
    assert schema_accepts({"models": [_pool(name=name)]})


def test_long_pool_names_are_cut_with_a_hash_and_stay_apart() -> None:
    a = pool_name("Meta-Llama-3.1-405B-Instruct-FP8-dynamic-with-a-very-long-suffix-A", 8, 2)
    b = pool_name("Meta-Llama-3.1-405B-Instruct-FP8-dynamic-with-a-very-long-suffix-B", 8, 2)
    assert a != b and len(a) == len(b) == POOL_NAME_MAX
    assert a.startswith("meta-llama-3-1-405b-instruct") and a.endswith("-tp8pp2")
    assert schema_accepts({"models": [_pool(name=a), _pool(name=b)]})
    assert not schema_accepts({"models": [_pool(name=a + "x")]})


@given(st.text(min_size=0, max_size=120), st.integers(1, 64), st.integers(1, 64))
@settings(max_examples=200, deadline=None)
def test_every_pool_name_is_one_the_chart_takes(model: str, tp: int, pp: int) -> None:
    name = pool_name(model, tp, pp)
    assert len(name) <= POOL_NAME_MAX
    assert jsonschema.Draft7Validator({"type": "string", "pattern": POOL_NAME_PATTERN}).is_valid(
        name)


@pytest.mark.parametrize(
    ("path", "model", "revision"),
    [
        ("/models/Llama-3.1-8B-Instruct/main", "Llama-3.1-8B-Instruct", "main"),
        ("/models/Llama-3.1-8B-Instruct/main/config.json", "Llama-3.1-8B-Instruct", "main"),
        ("/hub/Qwen2.5-7B/0a8d2e1f", "Qwen2.5-7B", "0a8d2e1f"),
        ("/hub/Qwen2.5-7B/" + "c" * 40 + "/", "Qwen2.5-7B", "c" * 40),
        ("/models/SmolLM2-135M-Instruct", "SmolLM2-135M-Instruct", "main"),
        ("/models/SmolLM2-135M-Instruct/config.json", "SmolLM2-135M-Instruct", "main"),
        ("tests/worker/configs/Qwen2.5-72B-Instruct.json", "Qwen2.5-72B-Instruct", "main"),
        ("/models/maintenance", "maintenance", "main"),
    ],
)
def test_model_and_revision(path: str, model: str, revision: str) -> None:
    assert model_and_revision(Path(path)) == (model, revision)


def test_a_revision_directory_is_named_from_the_cwd(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "Mistral-7B" / "main").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "Mistral-7B" / "main")
    assert model_and_revision(Path(".")) == ("Mistral-7B", "main")


def test_the_worker_serves_a_revision_directory_under_its_model_name() -> None:
    s = load_settings(model_path="/models/Llama-3.1-8B-Instruct/main")
    assert s.model_name == "Llama-3.1-8B-Instruct"


@pytest.mark.parametrize(
    ("tp", "pp", "per_node", "nodes", "expected"),
    [
        (1, 2, 2, 1, Placement(1, 2, 1)),  # PP inside one node: one pod of 2 GPUs
        (1, 2, 1, 2, Placement(2, 1, 1)),  # one GPU per node: the stages split over 2 nodes
        (2, 3, 8, 2, Placement(1, 6, 2)),  # 6 GPUs fit a node: one pod, one replica per node
        (8, 2, 8, 2, Placement(2, 8, 1)),
        (4, 4, 8, 2, Placement(2, 8, 1)),
        (1, 9, 4, 3, Placement(3, 3, 1)),  # 3 pods of 3 GPUs; a 4-GPU node holds one of them
    ],
)
def test_placement(tp: int, pp: int, per_node: int, nodes: int, expected: Placement) -> None:
    assert place(tp, pp, per_node, nodes) == expected


@pytest.mark.parametrize(
    ("tp", "pp", "per_node", "nodes", "message"),
    [
        (4, 3, 8, 2, "needs 12 GPUs in one pod (a node has 8) or a group of 3 nodes"),
        (1, 3, 1, 2, "(nodes divide PP, each running whole stages); the cluster has 2"),
        (16, 1, 8, 4, "TP=16 exceeds the 8 GPUs of a node"),
        (1, 17, 1, 17, "the chart's groups hold at most 16"),
    ],
)
def test_layouts_that_do_not_place(tp: int, pp: int, per_node: int, nodes: int,
                                   message: str) -> None:
    found = place(tp, pp, per_node, nodes)
    assert isinstance(found, str) and message in found


@given(tp=st.integers(1, 16), pp=st.integers(1, 40), per_node=st.integers(1, 16),
       nodes=st.integers(1, 24))
@settings(max_examples=300, deadline=None)
def test_a_placement_obeys_the_rules_the_worker_checks(tp: int, pp: int, per_node: int,
                                                       nodes: int) -> None:
    found = place(tp, pp, per_node, nodes)
    if isinstance(found, str):
        return
    assert group_problem(tp, pp, found.nnodes) is None
    assert found.gpus_per_pod == pod_gpus(tp, pp, found.nnodes) <= per_node
    assert found.nnodes <= min(nodes, MAX_GROUP_NODES) and found.replicas >= 1
    assert found.replicas * tp * pp <= per_node * nodes
    if found.nnodes > 1:  # the worker of every pod of the group takes the layout
        for rank in range(found.nnodes):
            load_settings(model_path="/m/x", tensor_parallel_size=tp, pipeline_parallel_size=pp,
                          nnodes=found.nnodes, node_rank=rank, master_addr="leader")


@given(pp=st.integers(1, 64), nodes=st.integers(2, MAX_GROUP_NODES))
@settings(max_examples=300, deadline=None)
def test_the_chart_schema_and_the_worker_agree_on_groups(pp: int, nodes: int) -> None:
    """values.schema.json is generated from worker/rules.py: the chart refuses exactly the
    groups the worker refuses."""
    chart = schema_accepts({"models": [_pool(pipelineParallelSize=pp,
                                             multiNode={"nodes": nodes})]})
    try:
        load_settings(model_path="/m/x", pipeline_parallel_size=pp, nnodes=nodes,
                      master_addr="leader")
        worker = True
    except SettingsError as exc:
        assert "must be a multiple of WORKER_NNODES" in str(exc)
        worker = False
    assert chart == worker == (group_problem(1, pp, nodes) is None)


def test_the_chart_runs_pipeline_stages_in_one_pod() -> None:
    assert schema_accepts({"models": [_pool(tensorParallelSize=1, pipelineParallelSize=2)]})
    load_settings(model_path="/m/x", tensor_parallel_size=1, pipeline_parallel_size=2)


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.parametrize("convert", CONVERTS)
@pytest.mark.parametrize("store", [False, True])
def test_the_chart_schema_and_the_worker_agree_on_runners(runner: str, convert: str,
                                                          store: bool) -> None:
    """Every runner, conversion and responses store: the chart takes exactly what the worker
    takes, and vLLM gets the flags of the pair (none for its own default, auto)."""
    chart = schema_accepts({"models": [_pool(runner=runner, convert=convert,
                                             responsesStore=store)]})
    try:
        s = load_settings(model_path="/m/x", runner=runner, convert=convert,
                          responses_store=store)
    except SettingsError as exc:
        assert "WORKER_CONVERT" in str(exc) or "WORKER_RESPONSES_STORE" in str(exc)
        worker = False
    else:
        worker = True
        argv = build_command(s, Host(python="python", cpus=(0,))).argv
        assert ("--runner" in argv) == (runner != "auto")
        assert ("--convert" in argv) == (convert != "auto")
        if runner != "auto":
            assert argv[argv.index("--runner") + 1] == runner
    refused = runner_problem(runner, convert) is not None or (store and is_pooling(runner,
                                                                                   convert))
    assert chart == worker == (not refused)


def test_an_unset_runner_is_auto_in_the_schema_too() -> None:
    # The schema's rule reads an absent key as vLLM's default; convert alone makes a pooling pool.
    assert not schema_accepts({"models": [_pool(convert="embed", responsesStore=True)]})
    assert schema_accepts({"models": [_pool(convert="embed")]})
    assert not schema_accepts({"models": [_pool(runner="generate", convert="classify")]})
    assert not schema_accepts({"models": [_pool(runner="draft")]})


def test_pooling_pools_are_named_apart() -> None:
    assert pool_name("SmolLM2-135M-Instruct", 1, 1, pooling="embed") == (
        "smollm2-135m-instruct-embed-tp1")
    assert pool_name("SmolLM2-135M-Instruct", 1, 1) != pool_name("SmolLM2-135M-Instruct", 1, 1,
                                                                  pooling="embed")
