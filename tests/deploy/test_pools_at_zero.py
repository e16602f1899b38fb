"""Pools before their first replica, from the chart to the running gateway: the chart's values
rendered, the gateway's GATEWAY_* taken from the rendered Deployment as they are, and
`python -m gateway` started with them in front of a replica that is not there yet (a free port;
then the fake LoRA replica at the seam). A fresh gateway must know the declared adapter of a pool
parked at zero (its request waits, counted in the demand, and is served once a replica comes),
and a declared pool with no replica must answer 503 with Retry-After and export its demand at 0
(issue 37, items 4-6)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping

import pytest

from tests import loopback
from tests.autoscaler import pool_gauge
from tests.deploy.manifests import env_of, render
from tests.gateway.conftest import spawned_gateway
from tests.gateway.lora_upstream import answered_by_a_new_replica
from tests.ports import free_port
from tests.waiting import wait_for

pytestmark = pytest.mark.helm

PARKED, ALWAYS = "demo-model", "big-model"
VALUES = {
    "workerDefaults": {"autoscaling": {"prometheusAddress": "http://prom:9090"}},
    "metrics": {"serviceMonitor": {"enabled": True}},
    "models": [
        {"name": "parked", "model": PARKED, "source": {"s3": "s3://models/demo-model/main"},
         "startupProbe": {"periodSeconds": 10, "failureThreshold": 6},
         "autoscaling": {"enabled": True, "minReplicas": 0},
         "lora": {"adapters": [{"name": "chat", "s3": "s3://models/adapters/chat/v1"}]}},
        {"name": "always", "model": ALWAYS, "source": {"s3": "s3://models/big-model/main"}},
    ],
}


@contextlib.contextmanager
def gateway_from_chart(backend_port: int) -> Iterator[str]:
    """`python -m gateway` with the rendered Deployment's GATEWAY_* env; only the addresses are
    the test's (loopback ports, the static backend)."""
    rel = render({**VALUES, "gateway": {
        "discovery": "static", "backends": [f"http://127.0.0.1:{backend_port}"]}})
    (pod,) = [p for p in rel.pods() if p.role == "gateway"]
    rendered: Mapping[str, str] = env_of(pod.container("gateway"))
    env = {**rendered, "GATEWAY_EDGE__PROBE_PORT": str(free_port()),
           "GATEWAY_HEALTH_INTERVAL_S": "0.2"}
    # /v1/models, not /ready: a gateway whose pools are all at zero is not ready.
    with spawned_gateway(env=env, ready_path="/v1/models") as (_, url):
        yield url


async def test_a_fresh_gateway_waits_for_a_declared_adapter_and_a_declared_pool_answers_503(
) -> None:
    port = free_port()
    chat = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with gateway_from_chart(port) as url:
        # The pool parked at zero and the one that has no replica yet: both have a signal.
        assert pool_gauge(url, "llmserve_pool_demand", PARKED) == 0
        assert pool_gauge(url, "llmserve_pool_demand", ALWAYS) == 0
        r = loopback.post(url + "/v1/chat/completions", json={**chat, "model": ALWAYS},
                          timeout=10)
        assert r.status_code == 503, r.text
        assert int(r.headers["retry-after"]) >= 1
        async with loopback.async_client(base_url=url, timeout=30) as client:
            waiting = asyncio.create_task(client.post("/v1/chat/completions", json=chat))
            # The adapter's request waits in its base's pool, where the autoscaler reads it.
            await asyncio.to_thread(
                wait_for, lambda: pool_gauge(url, "llmserve_pool_demand", PARKED) == 1)
            assert not waiting.done()
            await answered_by_a_new_replica(waiting, PARKED, port)
        assert pool_gauge(url, "llmserve_pool_demand", PARKED) == 0
