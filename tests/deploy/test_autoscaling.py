"""Worker autoscaling in the chart: KEDA ScaledObjects on the gateway's demand signal, for a
Deployment pool and a LeaderWorkerSet pool, validated against KEDA's vendored CRD; pools parked at
zero declared to the gateway; the checks the chart makes (cooldown against the start-up probe,
scale to zero only with KEDA, one autoscaled pool per model); vLLM's sleep mode. The query KEDA
runs is run on a real Prometheus scraping two real gateways, labelled as the ServiceMonitor labels
them: the chart and the gateway agree on the series."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import pytest

from gateway.settings import GatewaySettings, wake_budgets
from tests import loopback
from tests.deploy.conftest import RenderCase, pool_values
from tests.deploy.manifests import NAMESPACE, Manifest, Release, env_of, render
from tests.deploy.test_validate import crd_validators
from tests.gateway.conftest import run_gateway
from tests.ports import free_port
from tests.prometheusserver import Target, prometheus_server

pytestmark = pytest.mark.helm

PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"
KEDA = {"workerDefaults": {"autoscaling": {"prometheusAddress": PROMETHEUS}},
        "metrics": {"serviceMonitor": {"enabled": True}}}


def scaled(rel: Release) -> dict[str, Manifest]:
    return {m["spec"]["scaleTargetRef"]["name"]: m for m in rel.of_kind("ScaledObject")}


def gateway_pools(rel: Release) -> list[dict[str, Any]]:
    (gw,) = [p for p in rel.pods() if p.role == "gateway"]
    pools: list[dict[str, Any]] = json.loads(env_of(gw.container("gateway"))["GATEWAY_POOLS"])
    return pools


def test_scaled_objects_for_a_deployment_and_a_leaderworkerset_pool(
    render_case: RenderCase,
) -> None:
    rel = render_case("keda-scale-to-zero")
    objects = scaled(rel)
    assert sorted(objects) == ["llm-llmserve-pp2", "llm-llmserve-tp1"]
    validator = crd_validators()[("keda.sh/v1alpha1", "ScaledObject")]
    for so in objects.values():
        errors = sorted(validator.iter_errors(so), key=lambda e: list(e.path))
        assert not errors, [f"{list(e.path)}: {e.message}" for e in errors]
    tp, pp = objects["llm-llmserve-tp1"]["spec"], objects["llm-llmserve-pp2"]["spec"]
    # Each names the workload the release runs, by the kind that owns the pool's pods.
    assert tp["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                    "name": "llm-llmserve-tp1"}
    assert pp["scaleTargetRef"] == {"apiVersion": "leaderworkerset.x-k8s.io/v1",
                                    "kind": "LeaderWorkerSet", "name": "llm-llmserve-pp2"}
    assert rel.one("Deployment", "llm-llmserve-tp1") and rel.one("LeaderWorkerSet",
                                                                 "llm-llmserve-pp2")
    # The autoscaler owns the replica count: the workloads leave it unset.
    assert "replicas" not in rel.one("Deployment", "llm-llmserve-tp1")["spec"]
    assert "replicas" not in rel.one("LeaderWorkerSet", "llm-llmserve-pp2")["spec"]
    # minReplicas 0 renders as KEDA's minReplicaCount 0; the cooldown defaults to what the
    # start-up probe allows (10 s x 180), or is the explicit one.
    assert (tp["minReplicaCount"], tp["maxReplicaCount"], tp["cooldownPeriod"]) == (0, 3, 1800)
    assert (pp["minReplicaCount"], pp["maxReplicaCount"], pp["cooldownPeriod"]) == (0, 2, 900)
    assert tp["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"][
        "stabilizationWindowSeconds"] == 600
    (trigger,) = tp["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metadata"] == {
        "serverAddress": PROMETHEUS,
        "query": f'sum(llmserve_pool_demand{{namespace="{NAMESPACE}", '
                 f'job="llm-llmserve-gateway", pool="m-tp"}})',
        "threshold": "16", "activationThreshold": "0",
    }
    assert pp["triggers"][0]["metadata"]["threshold"] == "8"
    assert 'pool="m-pp"' in pp["triggers"][0]["metadata"]["query"]


def test_the_query_selects_what_the_service_monitor_scrapes(render_case: RenderCase) -> None:
    rel = render_case("keda-scale-to-zero")
    sm = rel.one("ServiceMonitor")
    services = [s for s in rel.of_kind("Service")
                if all(s["metadata"]["labels"].get(k) == v
                       for k, v in sm["spec"]["selector"]["matchLabels"].items())]
    (service,) = services  # Prometheus Operator labels the series job=<Service name>
    for so in rel.of_kind("ScaledObject"):
        assert f'job="{service["metadata"]["name"]}"' in so["spec"]["triggers"][0]["metadata"][
            "query"]


def test_pools_at_zero_are_declared_to_the_gateway(render_case: RenderCase) -> None:
    pools = gateway_pools(render_case("keda-scale-to-zero"))
    settings = GatewaySettings(pools=pools)
    # The wake budget given, or where the values leave it out what the pool's start-up probe
    # allows a cold start (10 s x 60): a request waits as long as a replica may take to start.
    assert wake_budgets(settings.pools) == {"m-tp": 900.0, "m-pp": 600.0}
    notes = render_case("keda-scale-to-zero").notes
    assert "pool tp1 follows the gateway's demand for \"m-tp\"" in notes
    assert "wait in the gateway, up to 900s (autoscaling.wakeBudgetSeconds" in notes
    assert "wait in the gateway, up to 600s (autoscaling.wakeBudgetSeconds" in notes
    # A pool that never goes below one replica is not declared.
    one = render({**KEDA, "models": [pool_values(autoscaling={"enabled": True, "minReplicas": 1})]})
    assert wake_budgets(GatewaySettings(pools=gateway_pools(one)).pools) == {}


@pytest.mark.parametrize(("probe", "budget"), [
    ({"periodSeconds": 10, "failureThreshold": 180}, 1800),  # the chart's default probe
    ({"periodSeconds": 5, "failureThreshold": 30}, 150),
    ({"periodSeconds": 30, "failureThreshold": 200}, 3600),  # 6000 s: the gateway's limit
])
def test_the_default_wake_budget_covers_the_start_up_probe(
    probe: dict[str, int], budget: int,
) -> None:
    """Not the gateway's 300 s beside a cold start the probe allows 1,800 s for: by default a
    request waits as long as the pool may take to start (at most the gateway's limit), and NOTES
    prints the number."""
    rel = render({**KEDA, "models": [pool_values(startupProbe=probe, autoscaling={
        "enabled": True, "minReplicas": 0})]})
    assert wake_budgets(GatewaySettings(pools=gateway_pools(rel)).pools) == {
        "demo-model": budget}
    assert f"wait in the gateway, up to {budget}s (autoscaling.wakeBudgetSeconds" in rel.notes


def test_a_pool_overrides_workerdefaults_key_by_key() -> None:
    """values.yaml: any key of workerDefaults may be set per pool and wins. The schema refused a
    pool's partial override (`autoscaling: {minReplicas: 0}` without `enabled`, a start-up probe
    with only its failureThreshold), although the chart merges it over the default key by key."""
    rel = render({
        "workerDefaults": {"autoscaling": {"enabled": True, "prometheusAddress": PROMETHEUS}},
        "metrics": {"serviceMonitor": {"enabled": True}},
        "models": [pool_values(autoscaling={"minReplicas": 0}, startupProbe={"failureThreshold": 30},
                         rollout={"maxSurge": 1})]})
    spec = rel.one("ScaledObject")["spec"]
    # The default's enabled/engine with the pool's minimum; the cooldown from the pool's probe.
    assert (spec["minReplicaCount"], spec["cooldownPeriod"]) == (0, 300)
    assert wake_budgets(GatewaySettings(pools=gateway_pools(rel)).pools) == {"demo-model": 300}
    (pod,) = rel.worker_pods()
    probe = pod.container("worker")["startupProbe"]
    assert (probe["periodSeconds"], probe["failureThreshold"]) == (10, 30)
    assert rel.one("Deployment", "llm-llmserve-p")["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": 1, "maxUnavailable": 0}


def test_a_cooldown_matters_only_at_zero() -> None:
    """KEDA's cooldown is the wait before scaling to zero: a short one at minReplicas 1 is
    harmless, so it renders; at 0 it is refused (below)."""
    rel = render({**KEDA, "models": [pool_values(autoscaling={
        "enabled": True, "minReplicas": 1, "cooldownSeconds": 60})]})
    assert rel.one("ScaledObject")["spec"]["cooldownPeriod"] == 60


def _refusal(values: dict[str, Any]) -> str:
    with pytest.raises(helm_python.HelmError) as err:
        render(values)
    return str(err.value)


def test_a_cooldown_shorter_than_a_cold_start_is_refused() -> None:
    message = _refusal({**KEDA, "models": [pool_values(autoscaling={
        "enabled": True, "minReplicas": 0, "cooldownSeconds": 300})]})
    assert ("models[p].autoscaling.cooldownSeconds=300 is shorter than a cold start may take "
            "(startupProbe.periodSeconds x failureThreshold = 10 x 180 = 1800s)") in message
    assert "\n" not in message
    # The same cooldown passes once the start-up probe allows no more than it.
    ok = render({**KEDA, "models": [pool_values(
        startupProbe={"periodSeconds": 10, "failureThreshold": 30},
        autoscaling={"enabled": True, "minReplicas": 0, "cooldownSeconds": 300})]})
    assert ok.one("ScaledObject")["spec"]["cooldownPeriod"] == 300


@pytest.mark.parametrize(("values", "fragment"), [
    ({**KEDA, "models": [pool_values(autoscaling={"enabled": True, "engine": "hpa",
                                            "minReplicas": 0})]},
     "models[p].autoscaling: minReplicas=0 needs engine=keda"),
    ({"metrics": {"serviceMonitor": {"enabled": True}},
      "models": [pool_values(autoscaling={"enabled": True})]},
     "models[p].autoscaling.prometheusAddress is required with engine=keda"),
    ({"workerDefaults": KEDA["workerDefaults"], "models": [pool_values(autoscaling={"enabled": True})]},
     "enable metrics.serviceMonitor, or give models[p].autoscaling.query"),
    ({**KEDA, "models": [pool_values("a", autoscaling={"enabled": True}),
                         pool_values("b", autoscaling={"enabled": True})]},
     'models[b].autoscaling: pool a autoscales model "demo-model" too'),
    ({"models": [pool_values(servedModelName="org/model", autoscaling={"enabled": True,
                                                                 "engine": "hpa"})]},
     "not a Kubernetes label value"),
    ({"models": [pool_values(device="cpu", sleepMode=True)]},
     "models[p].sleepMode: vLLM's sleep mode runs on CUDA and ROCm GPUs only"),
    # Accepted and ignored before (issue 37, item 7).
    ({**KEDA, "models": [pool_values(autoscaling={"enabled": True, "minReplicas": 1,
                                            "wakeBudgetSeconds": 600})]},
     "models[p].autoscaling.wakeBudgetSeconds is set but minReplicas=1"),
    ({**KEDA, "models": [pool_values(replicas=3, autoscaling={"enabled": True})]},
     "models[0] (p): replicas is set, but autoscaling.enabled: the autoscaler sets the count"),
    ({**KEDA, "models": [pool_values(autoscaling={"enabled": True, "engine": "hpa",
                                            "pollingIntervalSeconds": 5})]},
     "models[0] (p): autoscaling.pollingIntervalSeconds is read by KEDA only"),
    ({**KEDA, "models": [pool_values(autoscaling={"enabled": True, "engine": "hpa", "query": "up"})]},
     "models[0] (p): autoscaling.query is read by KEDA only"),
    ({"models": [pool_values(lora={"enabled": True})]},
     "models[p].lora.enabled lists no adapter and gateway.adminKey is unset"),
    ({"models": [pool_values("a", lora={"adapters": [{"name": "other", "s3": "s3://models/a/v1"}]}),
                 pool_values("b", model="other", source={"s3": "s3://models/other/main"})]},
     'models[a].lora.adapters: "other" is the model name of pool b'),
])
def test_what_cannot_work_is_refused(values: dict[str, Any], fragment: str) -> None:
    assert fragment in _refusal(values)


def test_a_query_of_ones_own_needs_no_service_monitor() -> None:
    query = 'sum(llmserve_pool_demand{pool="demo-model"})'
    rel = render({"workerDefaults": KEDA["workerDefaults"],
                  "models": [pool_values(autoscaling={"enabled": True, "query": query})]})
    assert rel.one("ScaledObject")["spec"]["triggers"][0]["metadata"]["query"] == query


def test_sleep_mode_reaches_the_engine_flags(render_case: RenderCase) -> None:
    rel = render_case("keda-scale-to-zero")
    envs = {p.owner["metadata"]["name"]: env_of(p.container("worker")) for p in rel.worker_pods()}
    assert envs["llm-llmserve-tp1"]["WORKER_SLEEP_MODE"] == "true"
    assert "WORKER_SLEEP_MODE" not in envs["llm-llmserve-pp2"]


# --- the query on a real Prometheus -------------------------------------------------------------


@contextlib.contextmanager
def _gateways(n: int) -> Iterator[list[str]]:
    """`n` gateways in front of a pool at zero (its backend's port is closed), as replicas."""
    backend = f"http://127.0.0.1:{free_port()}"
    pools = [{"name": "tp1", "model": "m-tp", "scale_to_zero": True, "wake_budget_s": 60}]
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(run_gateway(backends=[backend], pools=pools,
                                               expect_ready=False)).url for _ in range(n)]


@pytest.mark.prometheus
async def test_keda_query_sums_the_demand_of_every_gateway_replica(
    render_case: RenderCase, tmp_path: Path
) -> None:
    so = render_case("keda-scale-to-zero").one("ScaledObject", "llm-llmserve-tp1")
    query = so["spec"]["triggers"][0]["metadata"]["query"]
    with _gateways(3) as (a, b, elsewhere):
        labels = {"namespace": NAMESPACE}
        targets = [Target("llm-llmserve-gateway", a, {**labels, "pod": "gw-0"}),
                   Target("llm-llmserve-gateway", b, {**labels, "pod": "gw-1"}),
                   # Another release's gateway: its demand is not this pool's.
                   Target("other-llmserve-gateway", elsewhere, {**labels, "pod": "gw-x"})]
        body = {"model": "m-tp", "prompt": "hi", "max_tokens": 1}
        async with loopback.async_client(timeout=60) as client:
            waiting = [asyncio.create_task(client.post(url + "/v1/completions", json=body))
                       for url, n in ((a, 2), (b, 3), (elsewhere, 4)) for _ in range(n)]
            with prometheus_server(tmp_path, targets) as prom:
                value = None
                for _ in range(150):
                    result = await asyncio.to_thread(prom.query, query)
                    value = float(result[0]["value"][1]) if result else None
                    if value == 5.0:
                        break
                    await asyncio.sleep(0.2)
                assert value == 5.0, (query, result)
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
