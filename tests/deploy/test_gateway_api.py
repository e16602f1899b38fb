"""The Gateway API Inference Extension objects (templates/gatewayapi/): an InferencePool per pool
whose selector finds exactly its serving pods on their API port, with the gateway in EPP mode as
its endpoint picker; the HTTPRoute to them. test_validate.py checks both against the vendored
CRDs; here, that the references between the objects hold."""

from __future__ import annotations

from typing import Any

import helm_python
import pytest

from tests.deploy.conftest import RenderCase
from tests.deploy.manifests import Release, env_of, render
from tests.deploy.test_worker_argv import gateway_settings

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


def test_the_endpoint_picker_is_the_gateway_in_epp_mode(rel: Release,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    service = rel.one("Service", "llm-llmserve-gateway")
    gateway = next(p for p in rel.pods() if p.role == "gateway").container("gateway")
    env = env_of(gateway)
    for pool in rel.of_kind("InferencePool"):
        ref = pool["spec"]["endpointPickerRef"]
        assert (ref["kind"], ref["name"]) == ("Service", service["metadata"]["name"])
        (port,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"]]
        assert port["appProtocol"] == "kubernetes.io/h2c"
        (target,) = [p for p in gateway["ports"] if p["name"] == port["targetPort"]]
        assert str(target["containerPort"]) == env["GATEWAY_EPP__PORT"]
    # What the container gets is what the EPP accepts, with its gRPC health as the probes.
    settings = gateway_settings(rel, monkeypatch)
    assert settings.mode == "epp"
    assert settings.epp.metrics_port == settings.edge.probe_port  # scraped where it was
    assert gateway["readinessProbe"]["grpc"] == {"port": settings.epp.port,
                                                 "service": "readiness"}
    assert gateway["livenessProbe"]["grpc"]["service"] == "liveness"


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


@pytest.mark.parametrize(("values", "message"), [
    ({"gatewayAPI": {"inferencePools": {"enabled": True}}}, "needs gateway.mode=epp"),
    ({"gateway": {"mode": "epp"}, "gatewayAPI": {"httpRoute": {"enabled": True}}},
     "needs gatewayAPI.inferencePools.enabled"),
    ({"gateway": {"mode": "epp"}, "gatewayAPI": {"inferencePools": {"enabled": True},
                                                 "httpRoute": {"enabled": True}}},
     "parentRefs is empty"),
    ({"gateway": {"mode": "epp", "eppPort": 8000}}, "eppPort must differ"),
])
def test_inconsistent_values_are_refused(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmError, match=message):
        render({"models": [{"name": "a", "model": "m", "source": {"preloaded": True}}],
                **values})
