"""workerDefaults.kvEventsPort: the engines publish their KV cache events there (and replay on the
next port), only the gateway may connect, and the gateway looks there (kv_aware routing)."""

from __future__ import annotations

import helm_python
import pytest

from gateway.routing.kv_events import events_endpoint, replay_endpoint
from gateway.settings import KvSettings
from tests.deploy.conftest import pool_values
from tests.deploy.manifests import env_of, render
from worker.argv import kv_events_args
from worker.settings import load_settings

pytestmark = pytest.mark.helm

KV = {"workerDefaults": {"port": 8000, "kvEventsPort": 5557}}


def test_the_engines_publish_where_the_gateway_subscribes() -> None:
    rel = render({**KV, "models": [pool_values("pp4", tensorParallelSize=2, pipelineParallelSize=4,
                                         multiNode={"nodes": 2}), pool_values("one")]})
    gateway_port = None
    for pod in rel.pods():
        if pod.role == "gateway":
            gateway_port = int(env_of(pod.container("gateway"))["GATEWAY_KV__EVENTS_PORT"])
    assert gateway_port == 5557
    served = 0
    for pod in rel.worker_pods():
        c = pod.container("worker")
        env = env_of(c)
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        if pod.role == "follower":
            assert "kv-events" not in ports  # followers publish nothing
            continue
        served += 1
        assert ports["kv-events"] == 5557 and ports["kv-replay"] == 5558
        # The worker turns the pod's env into vLLM's flag on those very ports.
        s = load_settings(model_path="/models/m", kv_events_port=int(env["WORKER_KV_EVENTS_PORT"]))
        flag = kv_events_args(s)[1]
        assert '"endpoint":"tcp://*:5557"' in flag and '"replay_endpoint":"tcp://*:5558"' in flag
    assert served == 2
    ep = events_endpoint("http://10.0.0.7:8000", KvSettings(events_port=gateway_port))
    assert (ep, replay_endpoint(ep)) == ("tcp://10.0.0.7:5557", "tcp://10.0.0.7:5558")
    # Only the gateway may connect to them.
    for policy in rel.of_kind("NetworkPolicy"):
        for rule in policy["spec"].get("ingress", []):
            names = {p["port"] for p in rule.get("ports", [])}
            if names & {"kv-events", "kv-replay"}:
                assert names == {"kv-events", "kv-replay"}
                assert [f["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
                        for f in rule["from"]] == ["gateway"]
    assert sum(1 for p in rel.of_kind("NetworkPolicy") for r in p["spec"].get("ingress", [])
               if any(x["port"] == "kv-events" for x in r.get("ports", []))) == 2


def test_off_by_default() -> None:
    rel = render({"models": [pool_values("one")]})
    for pod in rel.pods():
        for c in pod.containers():
            env = env_of(c)
            assert "WORKER_KV_EVENTS_PORT" not in env and "GATEWAY_KV__EVENTS_PORT" not in env


@pytest.mark.parametrize("port", [8000, 7999])
def test_a_port_that_collides_with_the_api_is_refused(port: int) -> None:
    with pytest.raises(helm_python.HelmError, match="kvEventsPort"):
        render({"workerDefaults": {"port": 8000, "kvEventsPort": port}, "models": [pool_values("one")]})


