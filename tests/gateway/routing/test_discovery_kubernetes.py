"""Kubernetes discovery against the real `kubernetes` client, with a fake API server at its HTTP
boundary (no API server can run here): list, then a watch stream, then 410 Gone and a re-list."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from kubernetes import client

from gateway.routing.discovery.kubernetes import KubernetesDiscovery, slice_addresses


def eps(name: str, *addrs: tuple[str, bool | None]) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": "1",
                     "labels": {"kubernetes.io/service-name": "workers"}},
        "endpoints": [
            {"addresses": [a], **({} if r is None else {"conditions": {"ready": r}})}
            for a, r in addrs
        ],
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
    }


class FakeApi:
    """Scripted responses: lists in order, and watch event batches in order."""

    def __init__(self) -> None:
        self.lists: list[list[dict[str, Any]]] = []
        self.watches: list[list[dict[str, Any]]] = []
        self.requests: list[tuple[str, dict[str, list[str]]]] = []
        self.lock = threading.Lock()


@pytest.fixture
def api() -> Iterator[tuple[FakeApi, str]]:
    fake = FakeApi()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            url = urlparse(self.path)
            q = parse_qs(url.query)
            with fake.lock:
                fake.requests.append((url.path, q))
            assert url.path == "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices"
            assert q["labelSelector"] == ["kubernetes.io/service-name=workers"]
            if q.get("watch") == ["true"]:
                with fake.lock:
                    batch = fake.watches.pop(0) if fake.watches else []
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.end_headers()
                for ev in batch:
                    self.wfile.write(json.dumps(ev).encode() + b"\n")
                    self.wfile.flush()
                if not batch:
                    threading.Event().wait(0.2)  # an idle watch that then times out
                return
            with fake.lock:
                items = fake.lists.pop(0) if len(fake.lists) > 1 else fake.lists[0]
            body = json.dumps({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList",
                               "metadata": {"resourceVersion": "10"}, "items": items}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def api_client(host: str) -> client.ApiClient:
    cfg = client.Configuration()
    cfg.host = host
    return client.ApiClient(cfg)


def test_ready_condition_filters_addresses() -> None:
    s = eps("a", ("10.0.0.1", True), ("10.0.0.2", False), ("10.0.0.3", None))
    assert slice_addresses(s) == {"10.0.0.1", "10.0.0.3"}


async def test_list_watch_and_relist_after_410(api: tuple[FakeApi, str]) -> None:
    fake, host = api
    fake.lists = [[eps("s1", ("10.0.0.1", True))], [eps("s1", ("10.0.0.7", True))]]
    fake.watches = [
        [
            {"type": "ADDED", "object": eps("s2", ("10.0.0.2", True))},
            {"type": "MODIFIED", "object": eps("s1", ("10.0.0.1", False))},
            {"type": "DELETED", "object": eps("s2")},
            {"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "code": 410,
                                          "status": "Failure", "reason": "Expired",
                                          "message": "too old resource version"}},
        ],
    ]
    d = KubernetesDiscovery("ns", "workers", 8000, api_client_factory=lambda: api_client(host),
                            watch_timeout_s=1, retry_s=0.05)
    it = d.updates().__aiter__()
    seen = [await asyncio.wait_for(it.__anext__(), 10) for _ in range(5)]
    await it.aclose()  # type: ignore[attr-defined]
    assert seen == [
        {"http://10.0.0.1:8000"},
        {"http://10.0.0.1:8000", "http://10.0.0.2:8000"},
        {"http://10.0.0.2:8000"},  # 10.0.0.1 turned not-ready
        frozenset(),  # s2 deleted
        {"http://10.0.0.7:8000"},  # re-listed after 410 Gone
    ]
    watch_calls = [q for _, q in fake.requests if q.get("watch") == ["true"]]
    assert watch_calls[0]["resourceVersion"] == ["10"]
