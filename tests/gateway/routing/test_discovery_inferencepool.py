"""InferencePool discovery against the real `kubernetes` client, with a fake API server at its
HTTP boundary: the pool's selector and target ports, the pods' Ready condition, watch events,
and a changed pool read again when a watch ends."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncGenerator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from kubernetes import client

from gateway.routing.discovery.inferencepool import InferencePoolPods
from gateway.settings import GatewaySettings

POOL_PATH = "/apis/inference.networking.k8s.io/v1/namespaces/ns/inferencepools/chat"
PODS_PATH = "/api/v1/namespaces/ns/pods"


def pool(labels: dict[str, str], *ports: int) -> dict[str, Any]:
    return {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": "chat", "namespace": "ns"},
            "spec": {"selector": {"matchLabels": labels},
                     "targetPorts": [{"number": p} for p in ports],
                     "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}}}


def pod(name: str, ip: str | None, ready: bool, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "resourceVersion": "5"}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-27T10:00:00Z"
    status: dict[str, Any] = {"conditions": [
        {"type": "Ready", "status": "True" if ready else "False"}]}
    if ip is not None:
        status["podIP"] = ip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": status}


class FakeApi:
    """The pool document (changeable), and per label selector the pods listed; each watch
    request takes the next script entry (events), else idles 0.1 s."""

    def __init__(self) -> None:
        self.pool: dict[str, Any] = {}
        self.pods: dict[str, list[dict[str, Any]]] = {}
        self.watches: list[list[dict[str, Any]]] = []
        self.selectors: list[str] = []
        self.lock = threading.Lock()


def _handler(fake: FakeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _json(self, status: int, doc: dict[str, Any]) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            url = urlparse(self.path)
            q = parse_qs(url.query)
            if url.path == POOL_PATH:
                with fake.lock:
                    self._json(200, fake.pool)
                return
            if url.path != PODS_PATH:
                self._json(404, {"kind": "Status", "code": 404, "message": self.path})
                return
            selector = q.get("labelSelector", [""])[0]
            if q.get("watch") == ["true"]:
                with fake.lock:
                    step = fake.watches.pop(0) if fake.watches else []
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.end_headers()
                for event in step:
                    self.wfile.write(json.dumps(event).encode() + b"\n")
                    self.wfile.flush()
                threading.Event().wait(0.1)
                return
            with fake.lock:
                fake.selectors.append(selector)
                items = fake.pods.get(selector, [])
            self._json(200, {"apiVersion": "v1", "kind": "PodList",
                             "metadata": {"resourceVersion": "10"}, "items": items})

    return Handler


@pytest.fixture
def api() -> Iterator[tuple[FakeApi, client.ApiClient]]:
    fake = FakeApi()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{server.server_address[1]}"
    api_client = client.ApiClient(cfg)
    yield fake, api_client
    api_client.close()  # type: ignore[no-untyped-call]
    server.shutdown()
    server.server_close()


async def collect(d: InferencePoolPods, n: int) -> list[frozenset[str]]:
    it: AsyncGenerator[frozenset[str], None] = d.updates()
    try:
        return [await asyncio.wait_for(anext(it), 5) for _ in range(n)]
    finally:
        await it.aclose()


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
    d = InferencePoolPods("ns", "chat", api_client=api_client, watch_timeout_s=1)
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
    d = InferencePoolPods("ns", "chat", api_client=api_client, watch_timeout_s=1)
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
