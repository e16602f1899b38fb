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
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping

import httpx
import pytest

from tests import loopback
from tests.autoscaler import pool_gauge
from tests.deploy.manifests import REPO, env_of, render
from tests.gateway.lora_upstream import LoraReplica, serve
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
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update(rendered)
    env.update(GATEWAY_HOST="127.0.0.1", GATEWAY_PORT=str(port),
               GATEWAY_EDGE__PROBE_PORT=str(free_port()), GATEWAY_HEALTH_INTERVAL_S="0.2")
    proc = subprocess.Popen([sys.executable, "-m", "gateway"], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(httpx.TransportError):
                if loopback.get(url + "/v1/models", timeout=1).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read() if proc.stderr else ""
                raise RuntimeError(f"gateway did not start: {err[-2000:]}")
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


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
            replica = LoraReplica("r0", base=PARKED, port=port,
                                  declared={"chat": "/models/adapters/chat/v1"})
            with serve(replica):
                resp = await waiting
        assert resp.status_code == 200, resp.text
        assert "chat@r0" in resp.text
        assert pool_gauge(url, "llmserve_pool_demand", PARKED) == 0
