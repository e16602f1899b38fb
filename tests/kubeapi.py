"""A fake Kubernetes API server for InferencePool discovery (gateway/routing/discovery/
inferencepool.py), behind the real `kubernetes` client: the seam where fakes are allowed. It serves
one InferencePool document (changeable) and, per label selector, the pods listed; each pod watch
takes the next scripted list of events, else idles 0.1 s. Every call is recorded as the RBAC
request it is (verb, API group, resource), so a Role can be checked against what the discovery
really asks. JsonHandler, serving() and collect() serve every fake Kubernetes API of the suite (the
EndpointSlice discovery's too): the wire format, the server, the discovery's first updates."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncGenerator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from kubernetes import client

from gateway.routing.discovery.inferencepool import InferencePoolPods
from gateway.routing.discovery.kubernetes import Kubernetes


def pool_doc(name: str, namespace: str, labels: dict[str, str], *ports: int) -> dict[str, Any]:
    return {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": {"matchLabels": labels},
                     "targetPorts": [{"number": p} for p in ports],
                     "endpointPickerRef": {"name": "epp", "port": {"number": 9002}}}}


def pod_doc(name: str, namespace: str, ip: str | None, ready: bool,
            deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "resourceVersion": "5"}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-27T10:00:00Z"
    status: dict[str, Any] = {"conditions": [
        {"type": "Ready", "status": "True" if ready else "False"}]}
    if ip is not None:
        status["podIP"] = ip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": status}


def rbac_request(path: str, query: dict[str, list[str]]) -> tuple[str, str, str, str]:
    """A GET as the API server authorises it: (verb, API group, resource, namespace)."""
    parts = path.strip("/").split("/")
    # /api/v1/namespaces/NS/RES[/NAME] or /apis/GROUP/VERSION/namespaces/NS/RES[/NAME]
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    assert rest[0] == "namespaces", path  # the discovery reads its own namespace only
    namespace, resource, named = rest[1], rest[2], len(rest) > 3
    verb = "get" if named else "watch" if query.get("watch") == ["true"] else "list"
    return verb, group, resource, namespace


class FakeApi:
    def __init__(self, namespace: str, pool: str) -> None:
        self.pool_path = (f"/apis/inference.networking.k8s.io/v1/namespaces/{namespace}/"
                          f"inferencepools/{pool}")
        self.pods_path = f"/api/v1/namespaces/{namespace}/pods"
        self.pool: dict[str, Any] = {}
        self.pods: dict[str, list[dict[str, Any]]] = {}
        self.watches: list[list[dict[str, Any]]] = []
        self.selectors: list[str] = []
        self.calls: list[tuple[str, str, str, str]] = []
        self.watch_timeouts: list[str] = []  # each watch's timeoutSeconds, as sent
        self.lock = threading.Lock()


class JsonHandler(BaseHTTPRequestHandler):
    """What every fake API server's handler shares: a GET parsed into its path and query for
    `get`, JSON answers and Status errors, watch streams, no access log."""

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        url = urlparse(self.path)
        self.get(url.path, parse_qs(url.query))

    def get(self, path: str, query: dict[str, list[str]]) -> None:
        raise NotImplementedError

    def _json(self, status: int, doc: dict[str, Any]) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _not_found(self) -> None:
        self._json(404, {"kind": "Status", "code": 404, "message": self.path})

    def _watch(self, events: list[dict[str, Any]]) -> None:
        """A watch answer: `events` one JSON line each, flushed as sent; the caller ends it."""
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        for event in events:
            self.wfile.write(json.dumps(event).encode() + b"\n")
            self.wfile.flush()


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[client.ApiClient]:
    """`handler` served on a free port, and a real client configured for it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{server.server_address[1]}"
    api_client = client.ApiClient(cfg)
    try:
        yield api_client
    finally:
        api_client.close()  # type: ignore[no-untyped-call]
        server.shutdown()
        server.server_close()


def _handler(fake: FakeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def get(self, path: str, q: dict[str, list[str]]) -> None:
            with fake.lock:
                fake.calls.append(rbac_request(path, q))
            if path == fake.pool_path:
                with fake.lock:
                    self._json(200, fake.pool)
                return
            if path != fake.pods_path:
                self._not_found()
                return
            selector = q.get("labelSelector", [""])[0]
            if q.get("watch") == ["true"]:
                with fake.lock:
                    fake.watch_timeouts += q.get("timeoutSeconds", [])
                    step = fake.watches.pop(0) if fake.watches else []
                self._watch(step)
                threading.Event().wait(0.1)
                return
            with fake.lock:
                fake.selectors.append(selector)
                items = fake.pods.get(selector, [])
            self._json(200, {"apiVersion": "v1", "kind": "PodList",
                             "metadata": {"resourceVersion": "10"}, "items": items})

    return Handler


@contextlib.contextmanager
def fake_api(namespace: str, pool: str) -> Iterator[tuple[FakeApi, client.ApiClient]]:
    """The fake server on a free port, and a real client configured for it."""
    fake = FakeApi(namespace, pool)
    with serving(_handler(fake)) as api_client:
        yield fake, api_client


async def collect(d: Kubernetes | InferencePoolPods, n: int) -> list[frozenset[str]]:
    """The first `n` address sets the discovery's updates() yields, each within 5 s."""
    it: AsyncGenerator[frozenset[str], None] = d.updates()
    try:
        return [await asyncio.wait_for(anext(it), 5) for _ in range(n)]
    finally:
        await it.aclose()
