"""The Gateway API Inference Extension objects (templates/gatewayapi/): an InferencePool per pool
whose selector finds exactly its serving pods on their API port, with the gateway in EPP mode as
its endpoint picker; the HTTPRoute to them. test_validate.py checks both against the vendored
CRDs; here, that the references between the objects hold."""

from __future__ import annotations

import asyncio
from typing import Any

import helm_python
import pytest

from gateway.routing.discovery.inferencepool import GROUP, PLURAL, InferencePoolPods
from tests.deploy.conftest import ALL_CASES, RenderCase
from tests.deploy.manifests import Release, env_of, render
from tests.deploy.test_worker_argv import settings_of_env
from tests.kubeapi import fake_api, pod_doc

pytestmark = pytest.mark.helm

CASE = "gateway-api-epp"


@pytest.fixture(scope="module")
def rel(render_case: RenderCase) -> Release:
    return render_case(CASE)


def _matches(selector: dict[str, str], labels: dict[str, Any]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_each_pool_has_an_inferencepool_selecting_its_serving_pods(rel: Release) -> None:
    pools = {p["metadata"]["name"]: p for p in rel.of_kind("InferencePool")}
    workers = rel.worker_pods()
    assert len(pools) == 2
    for name, pool in pools.items():
        selector = pool["spec"]["selector"]["matchLabels"]
        chosen = [w for w in workers if _matches(selector, w.metadata["labels"])]
        # Its own pool's single-node pods or LWS leaders: the pods that serve the API.
        assert chosen and all(w.role in ("single", "leader") for w in chosen), name
        assert {w.metadata["labels"]["llmserve.io/pool"] for w in chosen} == {
            pool["metadata"]["labels"]["llmserve.io/pool"]}
        for w in chosen:
            ports = {p["name"]: p["containerPort"] for p in w.container("worker")["ports"]}
            assert pool["spec"]["targetPorts"] == [{"number": ports["http"]}]
        assert pool["spec"]["endpointPickerRef"]["failureMode"] == "FailOpen"


def test_each_pool_has_its_own_endpoint_picker(rel: Release,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """As GIE deploys them: one EPP per InferencePool, behind the Service its endpointPickerRef
    names, started for that pool (InferencePool discovery of its name and namespace), declaring
    only that pool's layout, with the EPP protocol's gRPC health as its probes."""
    deployments = [d for d in rel.of_kind("Deployment")
                   if d["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway"]
    pools = rel.of_kind("InferencePool")
    assert len(deployments) == len(pools) == 2
    picked = set()
    for pool in pools:
        ref = pool["spec"]["endpointPickerRef"]
        assert ref["kind"] == "Service"
        service = rel.one("Service", ref["name"])
        (port,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"]]
        assert port["appProtocol"] == "kubernetes.io/h2c"
        selector = service["spec"]["selector"]
        (epp,) = [d for d in deployments
                  if _matches(selector, d["spec"]["template"]["metadata"]["labels"])]
        picked.add(epp["metadata"]["name"])
        container = epp["spec"]["template"]["spec"]["containers"][0]
        (target,) = [p for p in container["ports"] if p["name"] == port["targetPort"]]
        settings = settings_of_env(env_of(container), monkeypatch)
        assert settings.mode == "epp" and settings.discovery == "inferencepool"
        assert (settings.epp.pool_name, settings.epp.pool_namespace) == (
            pool["metadata"]["name"], pool["metadata"]["namespace"])
        assert target["containerPort"] == settings.epp.port
        assert [p.name for p in settings.pools] == [pool["metadata"]["labels"]["llmserve.io/pool"]]
        assert settings.epp.metrics_port == settings.edge.probe_port  # scraped where it was
        assert container["readinessProbe"]["grpc"] == {"port": settings.epp.port,
                                                       "service": "readiness"}
        assert container["livenessProbe"]["grpc"]["service"] == "liveness"
        # Its pods read the API (the token mounted), as the Role below allows.
        assert epp["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
        # Its own disruption budget, over its own pods only.
        (pdb,) = [b for b in rel.of_kind("PodDisruptionBudget")
                  if b["metadata"]["name"] == epp["metadata"]["name"]]
        assert pdb["spec"]["selector"]["matchLabels"] == epp["spec"]["selector"]["matchLabels"]
    assert len(picked) == 2  # one each, none shared


async def test_the_role_allows_what_the_discovery_asks(rel: Release) -> None:
    """Each EPP's InferencePool discovery, run against a fake API server serving the rendered
    InferencePool (and a pod its selector matches): every call it makes (get the pool, list and
    watch the pods) is allowed by the namespaced Role bound to the EPPs' account, and the Role
    allows nothing more; nothing cluster-wide."""
    role = rel.one("Role")
    allowed = {(verb, group, resource)
               for rule in role["rules"] for group in rule["apiGroups"]
               for resource in rule["resources"] for verb in rule["verbs"]}
    binding = rel.one("RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    epps = [d for d in rel.of_kind("Deployment")
            if d["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway"]
    assert {d["spec"]["template"]["spec"]["serviceAccountName"] for d in epps} == {
        s["name"] for s in binding["subjects"]}
    assert not rel.of_kind("ClusterRole") and not rel.of_kind("ClusterRoleBinding")
    asked: set[tuple[str, str, str]] = set()
    for pool in rel.of_kind("InferencePool"):
        meta, spec = pool["metadata"], pool["spec"]
        with fake_api(meta["namespace"], meta["name"]) as (fake, api_client):
            fake.pool = pool
            selector = ",".join(f"{k}={v}" for k, v in sorted(spec["selector"]["matchLabels"].items()))
            fake.pods[selector] = [pod_doc("w-0", meta["namespace"], "10.0.0.9", True)]
            d = InferencePoolPods(meta["namespace"], meta["name"], api_client=api_client,
                                  watch_timeout_s=1, retry_s=2.0)
            updates = d.updates()
            try:
                port = spec["targetPorts"][0]["number"]
                assert await asyncio.wait_for(anext(updates), 10) == {f"http://10.0.0.9:{port}"}
                for _ in range(100):  # and its watch has begun
                    if any(c[0] == "watch" for c in fake.calls):
                        break
                    await asyncio.sleep(0.05)
            finally:
                await updates.aclose()
            with fake.lock:
                calls = list(fake.calls)
        assert {c[3] for c in calls} == {meta["namespace"]} == {role["metadata"]["namespace"]}
        asked |= {c[:3] for c in calls}
    assert asked == {("get", GROUP, PLURAL), ("list", "", "pods"), ("watch", "", "pods")}
    # The Role: what the discovery asks, plus `get` on pods and `list`/`watch` on pools (the
    # read verbs, as GIE's EPP role), nothing else.
    assert asked <= allowed
    assert {r for _, _, r in allowed} == {"pods", PLURAL}
    assert {v for v, _, _ in allowed} == {"get", "list", "watch"}


def test_the_httproute_sends_each_model_to_its_pool(rel: Release) -> None:
    route = rel.one("HTTPRoute")
    pools = {p["metadata"]["name"] for p in rel.of_kind("InferencePool")}
    served = {}
    for rule in route["spec"]["rules"]:
        (ref,) = rule["backendRefs"]
        assert (ref["group"], ref["kind"]) == ("inference.networking.k8s.io", "InferencePool")
        (match,) = rule["matches"]
        (header,) = match["headers"]
        served[header["value"]] = ref["name"]
        assert rule["timeouts"]["request"] == "0s"
    assert set(served.values()) == pools
    assert set(served) == {"m-tp", "m-pp"}
    assert route["spec"]["parentRefs"] == [{"name": "inference-gateway", "namespace": "gateways"}]


def test_the_data_plane_may_reach_the_workers_and_the_epp(rel: Release) -> None:
    policies = {p["metadata"]["name"]: p for p in rel.of_kind("NetworkPolicy")}
    gateways_ns = {"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "gateways"}}}
    for pool in rel.of_kind("InferencePool"):
        ingress = policies[pool["metadata"]["name"]]["spec"]["ingress"]
        assert gateways_ns in ingress[0]["from"]
    gateway_rules = policies["llm-llmserve-gateway"]["spec"]["ingress"]
    assert any(r["ports"] == [{"port": "grpc", "protocol": "TCP"}] for r in gateway_rules)


def test_the_notes_name_the_timeouts_the_data_plane_needs(
        rel: Release, loaded_chart: helm_python.Chart, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request waits inside its EPP (queued, or its pool waking from zero) with nothing moving:
    the notes name the data plane's timers that must outlast it, and the longest wake budget
    (tests/gateway/epp/test_envoy.py shows stream_idle_timeout cutting such a wait)."""
    assert "stream_idle_timeout" in rel.notes and "message_timeout" in rel.notes
    assert "must exceed GATEWAY_FLOW__QUEUE_TIMEOUT_S," in rel.notes  # no pool at zero here
    for name in ("llm-llmserve-tp1-epp", "llm-llmserve-pp2-epp"):
        assert f"Service {name}" in rel.notes
    zero = ALL_CASES["keda-scale-to-zero"]
    waking = render({**ALL_CASES[CASE], "models": zero["models"],
                     "workerDefaults": zero["workerDefaults"], "metrics": zero["metrics"]},
                    loaded=loaded_chart)
    budgets = set()
    for d in waking.of_kind("Deployment"):
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway":
            env = env_of(d["spec"]["template"]["spec"]["containers"][0])
            budgets |= {p.wake_budget_s for p in settings_of_env(env, monkeypatch).pools
                        if p.scale_to_zero}
    assert budgets == {900, 600}
    assert "must exceed GATEWAY_FLOW__QUEUE_TIMEOUT_S and 900 s" in waking.notes


@pytest.mark.parametrize(("values", "message"), [
    ({"gatewayAPI": {"inferencePools": {"enabled": True}}}, "needs gateway.mode=epp"),
    ({"gateway": {"mode": "epp"}, "gatewayAPI": {"httpRoute": {"enabled": True}}},
     "needs gatewayAPI.inferencePools.enabled"),
    ({"gateway": {"mode": "epp"}, "gatewayAPI": {"inferencePools": {"enabled": True},
                                                 "httpRoute": {"enabled": True}}},
     "parentRefs is empty"),
    ({"gateway": {"mode": "epp", "eppPort": 8000}}, "eppPort must differ"),
    ({"gateway": {"mode": "epp", "ingress": {"enabled": True}}}, "serve no HTTP API"),
    ({"gateway": {"mode": "epp"}, "compare": {"enabled": True, "targets": ["a=m", "b=m"],
                                              "users": "1"}}, "do not serve"),
])
def test_inconsistent_values_are_refused(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmError, match=message):
        render({"models": [{"name": "a", "model": "m", "source": {"preloaded": True}}],
                **values})
