"""Kubernetes discovery: list + watch the EndpointSlices of one Service.

The official `kubernetes` client is synchronous, so list/watch runs in a daemon thread and hands
each new URL set to the event loop. The watch resumes from the last resourceVersion; when the API
server says that version is gone (410), the thread lists again from scratch, which is the
documented recovery. Only endpoints whose `ready` condition is not false are routable: a
terminating or not-yet-ready pod must not receive traffic.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

log = logging.getLogger("gateway.discovery.kubernetes")

SERVICE_LABEL = "kubernetes.io/service-name"
_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def default_api_client() -> client.ApiClient:
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


def own_namespace() -> str:
    try:
        with open(_NAMESPACE_FILE, encoding="utf-8") as fh:
            return fh.read().strip() or "default"
    except OSError:
        return "default"


def _field(obj: Any, name: str, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, name, None)


def slice_addresses(slice_obj: Any) -> set[str]:
    """Ready addresses of one EndpointSlice (model object or plain dict)."""
    out: set[str] = set()
    for ep in _field(slice_obj, "endpoints", "endpoints") or []:
        cond = _field(ep, "conditions", "conditions")
        ready = _field(cond, "ready", "ready") if cond is not None else None
        if ready is False:
            continue
        out.update(_field(ep, "addresses", "addresses") or [])
    return out


class KubernetesDiscovery:
    def __init__(
        self,
        namespace: str | None,
        service: str,
        port: int,
        api_client_factory: Callable[[], client.ApiClient] = default_api_client,
        watch_timeout_s: int = 60,
        retry_s: float = 2.0,
    ) -> None:
        self._namespace = namespace or own_namespace()
        self._service = service
        self._port = port
        self._factory = api_client_factory
        self._watch_timeout_s = watch_timeout_s
        self._retry_s = retry_s
        self._stop = threading.Event()

    def _urls(self, slices: dict[str, set[str]]) -> frozenset[str]:
        addrs = set().union(*slices.values()) if slices else set()
        return frozenset(
            f"http://[{a}]:{self._port}" if ":" in a else f"http://{a}:{self._port}"
            for a in addrs
        )

    def _run(self, emit: Callable[[frozenset[str]], None]) -> None:
        # The client's models are loosely typed; treat its objects as Any at this boundary.
        api: Any = client.DiscoveryV1Api(self._factory())
        selector = f"{SERVICE_LABEL}={self._service}"
        while not self._stop.is_set():
            try:
                listed: Any = api.list_namespaced_endpoint_slice(
                    self._namespace, label_selector=selector
                )
                slices: dict[str, set[str]] = {s.metadata.name: slice_addresses(s) for s in listed.items}
                emit(self._urls(slices))
                rv = listed.metadata.resource_version
                w: Any = watch.Watch()  # type: ignore[no-untyped-call]
                while not self._stop.is_set():
                    for event in w.stream(
                        api.list_namespaced_endpoint_slice,
                        self._namespace,
                        label_selector=selector,
                        resource_version=rv,
                        timeout_seconds=self._watch_timeout_s,
                    ):
                        obj: Any = event["object"]
                        name = obj.metadata.name
                        if event["type"] == "DELETED":
                            slices.pop(name, None)
                        else:
                            slices[name] = slice_addresses(obj)
                        emit(self._urls(slices))
                        if self._stop.is_set():
                            return
                    rv = w.resource_version or rv
            except ApiException as exc:
                if exc.status != 410:
                    log.warning("EndpointSlice watch failed (%s); retrying", exc.status)
                    self._stop.wait(self._retry_s)
            except Exception as exc:  # noqa: BLE001 - any network error: keep the last set, retry
                log.warning("EndpointSlice discovery error: %s; retrying", exc)
                self._stop.wait(self._retry_s)

    async def updates(self) -> AsyncIterator[frozenset[str]]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[frozenset[str]] = asyncio.Queue()

        def emit(urls: frozenset[str]) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, urls)

        thread = threading.Thread(target=self._run, args=(emit,), daemon=True,
                                  name="k8s-discovery")
        thread.start()
        last: frozenset[str] | None = None
        try:
            while True:
                urls = await queue.get()
                if urls != last:
                    last = urls
                    yield urls
        finally:
            self._stop.set()
