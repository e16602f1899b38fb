"""InferencePool discovery against the real `kubernetes` client, with a fake API server at its
HTTP boundary: the pool's selector and target ports, the pods' Ready condition, watch events,
and a changed pool read again when a watch ends."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gateway.routing.discovery.inferencepool import InferencePoolPods
from gateway.routing.factory import build_discovery
from gateway.settings import GatewaySettings
from tests.kubeapi import FakeApi, collect, fake_api, pod_doc, pool_doc


def pool(labels: dict[str, str], *ports: int) -> dict[str, Any]:
    return pool_doc("chat", "ns", labels, *ports)


def pod(name: str, ip: str | None, ready: bool, deleting: bool = False) -> dict[str, Any]:
    return pod_doc(name, "ns", ip, ready, deleting)


@pytest.fixture
def api() -> Iterator[tuple[FakeApi, client.ApiClient]]:
    with fake_api("ns", "chat") as served:
        yield served


async def test_the_pools_ready_pods_on_its_target_ports(
        api: tuple[FakeApi, client.ApiClient]) -> None:
    fake, api_client = api
    fake.pool = pool({"app": "vllm", "pool": "chat"}, 8000, 8001)
    fake.pods["app=vllm,pool=chat"] = [
        pod("a", "10.0.0.1", True), pod("b", "10.0.0.2", False), pod("c", None, True),
        pod("d", "10.0.0.4", True, deleting=True), pod("e", "fd00::5", True)]
    fake.watches = [[
        {"type": "MODIFIED", "object": pod("b", "10.0.0.2", True)},
        {"type": "DELETED", "object": pod("a", "10.0.0.1", True)},
    ]]
    d = InferencePoolPods("ns", "chat", api_client=api_client, watch_timeout_s=1, retry_s=2.0)
    first, second, third = await collect(d, 3)
    assert first == {"http://10.0.0.1:8000", "http://10.0.0.1:8001",
                     "http://[fd00::5]:8000", "http://[fd00::5]:8001"}
    assert second == first | {"http://10.0.0.2:8000", "http://10.0.0.2:8001"}
    assert third == second - {"http://10.0.0.1:8000", "http://10.0.0.1:8001"}


async def test_a_changed_pool_is_read_again(api: tuple[FakeApi, client.ApiClient]) -> None:
    fake, api_client = api
    fake.pool = pool({"pool": "chat"}, 8000)
    fake.pods["pool=chat"] = [pod("a", "10.0.0.1", True)]
    fake.pods["pool=chat-v2"] = [pod("b", "10.0.0.2", True)]
    d = InferencePoolPods("ns", "chat", api_client=api_client, watch_timeout_s=1, retry_s=2.0)
    it = d.updates()
    try:
        assert await asyncio.wait_for(anext(it), 5) == {"http://10.0.0.1:8000"}
        with fake.lock:
            fake.pool = pool({"pool": "chat-v2"}, 9000)
        assert await asyncio.wait_for(anext(it), 5) == {"http://10.0.0.2:9000"}
    finally:
        await it.aclose()
    assert fake.selectors[:2] == ["pool=chat", "pool=chat-v2"]


def test_the_setting_names_the_pool() -> None:
    with pytest.raises(ValueError, match="GATEWAY_EPP__POOL_NAME is required"):
        GatewaySettings(discovery="inferencepool")
    s = GatewaySettings(discovery="inferencepool", epp={"pool_name": "chat"})
    assert s.epp.pool_name == "chat"


async def test_the_watch_timeout_is_the_gateways_setting(
    api: tuple[FakeApi, client.ApiClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GATEWAY_K8S_WATCH_TIMEOUT_S reaches the API server as the watch's timeoutSeconds: the
    discovery built from the settings, through a kube config, as `python -m gateway` builds it
    (issue 37, item 17: no parameter only a test sets)."""
    fake, api_client = api
    fake.pool = pool({"pool": "chat"}, 8000)
    fake.pods["pool=chat"] = [pod("a", "10.0.0.1", True)]
    # The client reads ~/.kube/config (KUBECONFIG is read once, when it is imported).
    kubeconfig = tmp_path / ".kube" / "config"
    kubeconfig.parent.mkdir()
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": api_client.configuration.host}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        "users": [{"name": "fake", "user": {"token": "t"}}]}))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    settings = GatewaySettings(discovery="inferencepool", k8s_watch_timeout_s=7,
                               epp={"pool_name": "chat", "pool_namespace": "ns"})
    d = build_discovery(settings)
    assert isinstance(d, InferencePoolPods)
    assert await collect(d, 1) == [{"http://10.0.0.1:8000"}]
    deadline = time.monotonic() + 5
    while not fake.watch_timeouts:
        assert time.monotonic() < deadline, "no watch was asked"
        await asyncio.sleep(0.02)
    assert fake.watch_timeouts[0] == "7"
