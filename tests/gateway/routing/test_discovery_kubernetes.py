"""Kubernetes discovery against the real `kubernetes` client, with a fake API server at its HTTP
boundary (no API server can run here): list, watch streams, resume, 410 Gone and re-list."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client

from gateway.routing.discovery.base import DiscoveryError
from gateway.routing.discovery.kubernetes import Kubernetes, follow, listed
from tests.kubeapi import JsonHandler, collect, serving

PATH = "/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices"
SELECTOR = "kubernetes.io/service-name=workers"
GONE = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
        "reason": "Expired", "message": "too old resource version"}


def eps(name: str, *addrs: tuple[str, bool | None], rv: str = "1",
        ports: tuple[tuple[str, int], ...] = (("http", 8000),)) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv,
                     "labels": {"kubernetes.io/service-name": "workers"}},
        "endpoints": [
            {"addresses": [a], **({} if r is None else {"conditions": {"ready": r}})}
            for a, r in addrs
        ],
        "ports": [{"name": n, "port": p, "protocol": "TCP"} for n, p in ports],
    }


def ev(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


class FakeApi:
    """Scripted API server. Each list and each watch request takes the next script entry:
    a list of items / of watch events, or an int for an HTTP error status. An exhausted watch
    script serves idle watches that end after 0.1 s (like timeoutSeconds)."""

    def __init__(self) -> None:
        self.lists: list[list[dict[str, Any]] | int] = []
        self.watches: list[list[dict[str, Any]] | int] = []
        self.requests: list[dict[str, list[str]]] = []
        self.lock = threading.Lock()

    def watch_requests(self) -> list[dict[str, list[str]]]:
        with self.lock:
            return [q for q in self.requests if q.get("watch") == ["true"]]


def _make_handler(fake: FakeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(JsonHandler):
        def get(self, path: str, q: dict[str, list[str]]) -> None:
            with fake.lock:
                fake.requests.append(q)
            if path != PATH or q.get("labelSelector") != [SELECTOR]:
                self._not_found()
                return
            if q.get("watch") == ["true"]:
                with fake.lock:
                    step = fake.watches.pop(0) if fake.watches else []
                if isinstance(step, int):
                    self._json(step, {**GONE, "code": step})
                    return
                self._watch(step)
                if not step:
                    threading.Event().wait(0.1)
                return
            with fake.lock:
                page = fake.lists.pop(0) if len(fake.lists) > 1 else fake.lists[0]
            if isinstance(page, int):
                self._json(page, {"kind": "Status", "code": page, "message": "boom"})
                return
            self._json(200, {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList",
                             "metadata": {"resourceVersion": "10"}, "items": page})

    return Handler


@pytest.fixture
def api() -> Iterator[tuple[FakeApi, client.ApiClient]]:
    fake = FakeApi()
    with serving(_make_handler(fake)) as api_client:
        yield fake, api_client


async def test_ready_condition_filters_addresses(api: tuple[FakeApi, client.ApiClient]) -> None:
    fake, api_client = api
    fake.lists = [[eps("a", ("10.0.0.1", True), ("10.0.0.2", False), ("10.0.0.3", None))]]
    d = Kubernetes("ns", "workers", 8000, api_client=api_client, watch_timeout_s=1, retry_s=2.0)
    assert await collect(d, 1) == [{"http://10.0.0.1:8000", "http://10.0.0.3:8000"}]


async def test_ports_by_number_or_name_and_ipv6(api: tuple[FakeApi, client.ApiClient]) -> None:
    fake, api_client = api
    fake.lists = [[eps("a", ("10.0.0.1", True), ports=(("metrics", 9100), ("http", 8080))),
                   eps("b", ("fd00::7", True))]]
    for port, want in ((8000, {"http://10.0.0.1:8000", "http://[fd00::7]:8000"}),
                       ("http", {"http://10.0.0.1:8080", "http://[fd00::7]:8000"}),
                       ("grpc", frozenset())):  # no such named port: nothing routable
        d = Kubernetes("ns", "workers", port, api_client=api_client, watch_timeout_s=1, retry_s=2.0)
        assert await collect(d, 1) == [want]


async def test_list_watch_and_relist_after_410_event(
    api: tuple[FakeApi, client.ApiClient],
) -> None:
    fake, api_client = api
    fake.lists = [[eps("s1", ("10.0.0.1", True))], [eps("s1", ("10.0.0.7", True))]]
    fake.watches = [[
        ev("ADDED", eps("s2", ("10.0.0.2", True), rv="11")),
        ev("MODIFIED", eps("s1", ("10.0.0.1", False), rv="12")),
        ev("DELETED", eps("s2", rv="13")),
        {"type": "ERROR", "object": GONE},
    ]]
    d = Kubernetes("ns", "workers", 8000, api_client=api_client, watch_timeout_s=1, retry_s=0.05)
    assert await collect(d, 5) == [
        {"http://10.0.0.1:8000"},
        {"http://10.0.0.1:8000", "http://10.0.0.2:8000"},
        {"http://10.0.0.2:8000"},  # 10.0.0.1 turned not-ready
        frozenset(),  # s2 deleted
        {"http://10.0.0.7:8000"},  # re-listed after 410 Gone
    ]
    watch = fake.watch_requests()[0]
    assert watch["resourceVersion"] == ["10"]  # the watch starts where the list ended
    assert watch["timeoutSeconds"] == ["1"]


async def test_watch_resumes_from_last_resource_version(
    api: tuple[FakeApi, client.ApiClient],
) -> None:
    fake, api_client = api
    fake.lists = [[eps("s1", ("10.0.0.1", True))]]
    fake.watches = [
        [ev("ADDED", eps("s2", ("10.0.0.2", True), rv="17"))],  # then the server closes it
        [ev("DELETED", eps("s1", rv="18"))],
    ]
    d = Kubernetes("ns", "workers", 8000, api_client=api_client, watch_timeout_s=1, retry_s=0.05)
    assert await collect(d, 3) == [
        {"http://10.0.0.1:8000"},
        {"http://10.0.0.1:8000", "http://10.0.0.2:8000"},
        {"http://10.0.0.2:8000"},
    ]
    resumed = [q["resourceVersion"] for q in fake.watch_requests()[:2]]
    assert resumed == [["10"], ["17"]]
    lists = [q for q in fake.requests if "watch" not in q]
    assert len(lists) == 1  # a closed watch is resumed, not re-listed


async def test_relist_after_410_status_and_retry_after_server_error(
    api: tuple[FakeApi, client.ApiClient],
) -> None:
    fake, api_client = api
    fake.lists = [
        500,  # API server hiccup: retried after retry_s
        [eps("s1", ("10.0.0.1", True))],
        [eps("s1", ("10.0.0.1", True), ("10.0.0.3", True))],
    ]
    fake.watches = [410]  # the watch request itself answers 410 Gone
    d = Kubernetes("ns", "workers", 8000, api_client=api_client, watch_timeout_s=1, retry_s=0.05)
    assert await collect(d, 2) == [
        {"http://10.0.0.1:8000"},
        {"http://10.0.0.1:8000", "http://10.0.0.3:8000"},
    ]


async def test_named_port_resolved_per_slice(api: tuple[FakeApi, client.ApiClient]) -> None:
    fake, api_client = api
    fake.lists = [[
        eps("s1", ("10.0.0.1", True), ports=(("http", 8000),)),
        eps("s2", ("10.0.0.2", True), ports=(("http", 8001), ("metrics", 9100))),
    ]]
    d = Kubernetes("ns", "workers", "http", api_client=api_client, watch_timeout_s=1, retry_s=2.0)
    assert await collect(d, 1) == [{"http://10.0.0.1:8000", "http://10.0.0.2:8001"}]


def test_missing_cluster_config_is_a_clear_startup_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(DiscoveryError, match="GATEWAY_DISCOVERY=kubernetes"):
        Kubernetes("ns", "workers", 8000, watch_timeout_s=60, retry_s=2.0)


async def test_a_terminating_pod_leaves_at_once_though_it_still_serves(
    api: tuple[FakeApi, client.ApiClient],
) -> None:
    """A scale-down deletes a pod: the EndpointSlice controller keeps its endpoint, with ready
    false, serving true and terminating true, while the pod runs its preStop sleep and drains.
    The gateway stops routing to it on that update, before the engine refuses anything."""
    fake, api_client = api
    fake.lists = [[eps("s1", ("10.0.0.1", True), ("10.0.0.2", True))]]
    going = eps("s1", ("10.0.0.1", True), ("10.0.0.2", None), rv="12")
    going["endpoints"][1]["conditions"] = {"ready": False, "serving": True, "terminating": True}
    fake.watches = [[ev("MODIFIED", going)]]
    d = Kubernetes("ns", "workers", 8000, api_client=api_client, watch_timeout_s=1, retry_s=0.05)
    assert await collect(d, 2) == [
        {"http://10.0.0.1:8000", "http://10.0.0.2:8000"},
        {"http://10.0.0.1:8000"},
    ]


def test_follow_applies_changes_skips_bookmarks_and_stops() -> None:
    """The watch loop both Kubernetes discoveries share (EndpointSlices, InferencePool pods)."""
    def obj(name: str) -> SimpleNamespace:
        return SimpleNamespace(metadata=SimpleNamespace(name=name))

    def urls_of(o: SimpleNamespace) -> frozenset[str]:
        return frozenset({f"http://{o.metadata.name}:1"})

    emitted: list[frozenset[str]] = []
    stop = threading.Event()
    known = listed([obj("a")], urls_of, emitted.append)
    assert known == {"a": {"http://a:1"}} and emitted == [{"http://a:1"}]
    events = [{"type": "ADDED", "object": obj("b")}, {"type": "BOOKMARK", "object": obj("x")},
              {"type": "DELETED", "object": obj("a")}, {"type": "MODIFIED", "object": obj("b")}]
    assert follow(iter(events), known, urls_of, stop, emitted.append) is True
    assert emitted[1:] == [{"http://a:1", "http://b:1"}, {"http://b:1"}, {"http://b:1"}]
    assert known == {"b": {"http://b:1"}}
    stop.set()  # the consumer left: the stream is abandoned before its next event is applied
    assert follow(iter(events), known, urls_of, stop, emitted.append) is False
    assert len(emitted) == 4
