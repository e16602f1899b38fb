"""Every layout the planner calls "fits" is one the chart and the worker take.

Over a matrix of models (dense, GQA, multi-head, MoE, latent attention, long names, revision
directories) and clusters, each feasible layout's `--helm-values` output must pass the chart's
values.schema.json, and the worker settings of every pod of its group must pass the worker's
pre-flight: settings validation, the accelerator count the chart gives the pod, and the model
checks. (tests/deploy/test_plan_renders.py renders the same through Helm.)
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.worker.planmatrix import MODELS, feasible, model_matrix, worker_accepts
from worker.layout import read_spec
from worker.plan import GPUS, helm_values
from worker.rules import CONVERTS, POOL_NAME_MAX, RUNNERS, pooling_tag, runner_problem

REPO = Path(__file__).resolve().parents[2]
# Built once: jsonschema.validate() would check the schema itself on every call.
CHART = jsonschema.Draft7Validator(
    json.loads((REPO / "deploy/helm/llmserve/values.schema.json").read_text()))
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return model_matrix(tmp_path_factory.mktemp("models"))


def test_the_matrix_is_the_one_the_strategies_draw_from(models: dict[str, Path]) -> None:
    assert sorted(models) == sorted(MODELS)


@given(case=st.sampled_from(MODELS), gpu=st.sampled_from(sorted(GPUS)),
       per_node=st.sampled_from([1, 2, 4, 8]), nodes=st.integers(1, 4),
       dtype=st.sampled_from([None, "bfloat16", "fp8"]),
       max_len=st.sampled_from([2048, 8192, 32768]),
       pair=st.sampled_from([(r, c) for r in RUNNERS for c in CONVERTS
                             if runner_problem(r, c) is None]))
@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_every_feasible_layout_renders_values_the_chart_and_the_worker_take(
    models: dict[str, Path], case: str, gpu: str, per_node: int, nodes: int,
    dtype: str | None, max_len: int, pair: tuple[str, str],
) -> None:
    path = models[case]
    layouts, args = feasible(path, gpu, per_node, nodes, dtype, max_len, *pair)
    for layout in layouts:
        text = helm_values(read_spec(path), layout, args)
        values = yaml.load(text, Loader=LOADER)
        CHART.validate(values)
        (pool,) = values["models"]
        assert len(pool["name"]) <= POOL_NAME_MAX
        assert pool.get("multiNode", {}).get("nodes", 1) == layout.nodes
        # A pooling pool is named and served apart from the model's generating pool.
        tag = pooling_tag(*pair)
        assert (pool["servedModelName"] != pool["model"]) == (tag is not None)
        assert (pool.get("runner", "auto"), pool.get("convert", "auto")) == pair
        assert layout.dp * layout.gpus <= per_node * nodes
        worker_accepts(path, pool)
        # The saturated figure is the lower of the two bounds, and says which binds.
        assert layout.decode_tok_s_aggregate == pytest.approx(
            min(layout.bandwidth_tok_s, layout.compute_tok_s), abs=0.1)
        assert layout.bound == ("compute" if layout.compute_tok_s < layout.bandwidth_tok_s
                                else "bandwidth")


def test_the_matrix_covers_pp_inside_a_node_and_across_nodes(models: dict[str, Path]) -> None:
    """The property above sees both chart forms of pipeline parallel, and MoE layouts."""
    in_pod, groups = set(), set()
    for case in MODELS:
        layouts, _ = feasible(models[case], "A100-80GB", 4, 2, None, 8192)
        in_pod |= {case for x in layouts if x.pp > 1 and x.nodes == 1}
        groups |= {case for x in layouts if x.nodes > 1}
    assert {"dense GQA", "MoE, Mixtral", "long name"} <= in_pod
    assert {"dense GQA", "MoE, Qwen3 in a revision directory"} <= groups
