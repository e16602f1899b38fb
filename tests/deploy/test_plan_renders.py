"""Every layout `python -m worker plan` calls "fits" renders through the chart (Helm's Go SDK),
and each rendered worker pod passes the worker's pre-flight with the env the chart gives it.

Over the model matrix of tests/worker/planmatrix.py and a few clusters, all feasible layouts of a
model go into one release, one pool each, as `--helm-values` prints them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from tests.deploy.manifests import Release, env_of, render
from tests.deploy.test_worker_argv import lws_pods, settings_from
from tests.worker.planmatrix import MODELS, feasible, model_matrix, worker_preflight
from worker.layout import read_spec
from worker.plan import helm_values
from worker.rules import pod_gpus

pytestmark = pytest.mark.helm

# (GPU, GPUs per node, nodes): one GPU per node (PP only across nodes), a pair in one node (PP in
# one pod), and two 8-GPU nodes (both).
CLUSTERS = (("A100-80GB", 1, 2), ("A100-80GB", 2, 1), ("H100", 8, 2), ("L40S", 4, 2))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return model_matrix(tmp_path_factory.mktemp("models"))


def planned(path: Path, cluster: tuple[str, int, int]) -> list[dict[str, Any]]:
    """Each feasible layout as the pool --helm-values prints."""
    layouts, args = feasible(path, *cluster, None, 8192)
    spec = read_spec(path)
    return [yaml.safe_load(helm_values(spec, x, args))["models"][0] for x in layouts]


@pytest.mark.parametrize("cluster", CLUSTERS, ids=lambda c: "{}x{}x{}".format(*c))
@pytest.mark.parametrize("case", MODELS)
def test_every_feasible_layout_renders_and_its_pods_pass_the_worker_checks(
    models: dict[str, Path], loaded_chart: helm_python.Chart, case: str,
    cluster: tuple[str, int, int], monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = models[case]
    pools = planned(path, cluster)
    if not pools:
        pytest.skip(f"nothing fits {case} on {cluster}")
    release: Release = render({"models": pools}, loaded=loaded_chart)
    for pool in pools:
        nodes = pool.get("multiNode", {}).get("nodes", 1)
        tp, pp = pool["tensorParallelSize"], pool["pipelineParallelSize"]
        pods = [p for p in release.worker_pods()
                if p.metadata["labels"]["llmserve.io/pool"] == pool["name"]]
        assert {p.role for p in pods} == ({"single"} if nodes == 1 else {"leader", "follower"})
        for pod in pods:
            container = pod.container("worker")
            gpus = container["resources"]["limits"]["nvidia.com/gpu"]
            assert gpus == pod_gpus(tp, pp, nodes), pod.name
            probe = container.get("startupProbe")
            if pod.role != "follower":
                assert probe is not None
                assert probe["failureThreshold"] == pool["startupProbe"]["failureThreshold"]
            for _rank, lws_env in lws_pods(pod):
                settings = settings_from({**env_of(container), **lws_env}, monkeypatch)
                assert settings.model_name == pool["servedModelName"]
                assert (settings.nnodes, settings.local_ranks) == (nodes, gpus)
                worker_preflight(path, settings, gpus)


def test_the_acceptance_layouts_render(models: dict[str, Path],
                                       loaded_chart: helm_python.Chart) -> None:
    """Qwen2.5-72B: TP=1 x PP=2 over 2 nodes of one A100 (a LeaderWorkerSet group), and on one
    node of 2 A100s (one Deployment pod of 2 GPUs)."""
    across = [p for p in planned(models["dense GQA"], ("A100-80GB", 1, 2))
              if (p["tensorParallelSize"], p["pipelineParallelSize"]) == (1, 2)]
    inside = [p for p in planned(models["dense GQA"], ("A100-80GB", 2, 1))
              if (p["tensorParallelSize"], p["pipelineParallelSize"]) == (1, 2)]
    assert len(across) == len(inside) == 1
    lws = render({"models": across}, loaded=loaded_chart).one("LeaderWorkerSet")
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    name = f"llm-llmserve-{inside[0]['name']}"
    deployment = render({"models": inside}, loaded=loaded_chart).one("Deployment", name)
    (worker,) = deployment["spec"]["template"]["spec"]["containers"]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert env_of(worker)["WORKER_PIPELINE_PARALLEL_SIZE"] == "2"
