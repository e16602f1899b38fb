"""values-tp-vs-pp.yaml measures what it claims: the PP pool's ranks on different nodes, the TP
group inside one pod (one node), the same GPUs per model copy, and the gateway told each served
name's layout, so `python -m loadtest compare` reports it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.settings import GatewaySettings, PoolLayout, layouts_by_model
from tests.deploy.manifests import env_of, render

pytestmark = pytest.mark.helm


def test_pp_ranks_on_distinct_nodes_and_tp_group_in_one_pod(render_case: Any) -> None:
    rel = render_case("preset:values-tp-vs-pp.yaml")
    lws = rel.one("LeaderWorkerSet")
    ranks = [p for p in rel.worker_pods() if p.role in ("leader", "follower")]
    assert sorted(p.role for p in ranks) == ["follower", "leader"]
    for pod in ranks:
        # Required anti-affinity on the hostname against the pods of the same group: no two
        # pipeline ranks of one group can share a node.
        (term,) = pod.anti_affinity()
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert term["labelSelector"]["matchLabels"] == {
            "leaderworkerset.sigs.k8s.io/name": lws["metadata"]["name"]}
        assert term["matchLabelKeys"] == ["leaderworkerset.sigs.k8s.io/group-key"]
        env = env_of(pod.container("worker"))
        assert env["WORKER_PIPELINE_PARALLEL_SIZE"] == "2"
        assert env["WORKER_TENSOR_PARALLEL_SIZE"] == "4"
    # The TP pool is one pod per replica (a pod never spans nodes) holding all 8 TP ranks.
    (single,) = [p for p in rel.worker_pods() if p.role == "single"]
    assert single.owner["kind"] == "Deployment"
    assert env_of(single.container("worker"))["WORKER_TENSOR_PARALLEL_SIZE"] == "8"
    assert single.container("worker")["resources"]["limits"]["nvidia.com/gpu"] == 8


def test_gateway_is_told_each_layout(render_case: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    rel = render_case("preset:values-tp-vs-pp.yaml")
    (gw,) = [p for p in rel.pods() if p.role == "gateway"]
    raw = env_of(gw.container("gateway"))["GATEWAY_POOLS"]
    # And the gateway accepts it as rendered, from its env.
    monkeypatch.setenv("GATEWAY_POOLS", raw)
    layouts = {m: (p.tp, p.pp, p.nodes)
               for m, p in layouts_by_model(GatewaySettings().pools).items()}
    assert layouts == {"llama-70b-tp": (8, 1, 1), "llama-70b-pp": (4, 2, 2)}


def test_a_name_served_by_pools_of_different_layouts_gets_none() -> None:
    s3 = {"s3": "s3://models/m/main"}
    a = {"name": "a", "model": "m", "source": s3, "tensorParallelSize": 2}
    b = {"name": "b", "model": "m", "source": s3, "tensorParallelSize": 4}
    c = {"name": "c", "model": "n", "source": s3, "tensorParallelSize": 2, "replicas": 2}
    (gw,) = [p for p in render({"models": [a, b, c]}).pods() if p.role == "gateway"]
    pools = [PoolLayout(**p) for p in json.loads(env_of(gw.container("gateway"))["GATEWAY_POOLS"])]
    assert {m: (p.tp, p.pp, p.nodes) for m, p in layouts_by_model(pools).items()} == {
        "n": (2, 1, 1)}
