"""Kubernetes discovery: list + watch the EndpointSlices of one Service.

The `kubernetes` client is synchronous: list/watch runs in a daemon thread and hands each URL set
to the event loop. The watch resumes from the last resourceVersion; on 410 Gone it lists again.
Only endpoints whose `ready` condition is not false are routable (absent counts as ready).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncGenerator, Callable, Iterable
from functools import partial
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from gateway.routing.discovery.base import DiscoveryError

log = logging.getLogger("gateway.discovery.kubernetes")

SERVICE_LABEL = "kubernetes.io/service-name"
_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
_GONE = 410

Emit = Callable[[frozenset[str]], None]


def default_api_client() -> client.ApiClient:
    """In-cluster service account first, then the local kube config (for running outside)."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        try:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        except (config.ConfigException, OSError) as exc:
            raise DiscoveryError(
                "GATEWAY_DISCOVERY=kubernetes: no in-cluster service account and no usable "
                f"kube config ({exc})"
            ) from None
    return client.ApiClient()


def own_namespace() -> str:
    try:
        with open(_NAMESPACE_FILE, encoding="utf-8") as fh:
            return fh.read().strip() or "default"
    except OSError:
        return "default"


def slice_urls(slice_obj: Any, port: int | str) -> frozenset[str]:
    """The URLs of one EndpointSlice's ready endpoints on `port`: a number as is, a name looked
    up in the slice's ports (no URLs if it has no such port)."""
    number = port if isinstance(port, int) else next(
        (p.port for p in slice_obj.ports or [] if p.name == port and p.port is not None), None)
    if number is None:
        return frozenset()
    return frozenset(
        f"http://[{a}]:{number}" if ":" in a else f"http://{a}:{number}"
        for ep in slice_obj.endpoints or []
        if ep.conditions is None or ep.conditions.ready is not False
        for a in ep.addresses or [])


def listed(items: Iterable[Any], urls_of: Callable[[Any], frozenset[str]],
           emit: Emit) -> dict[str, frozenset[str]]:
    """A list answer's objects as name -> URLs; every URL among them is emitted."""
    known = {obj.metadata.name: urls_of(obj) for obj in items}
    emit(frozenset().union(*known.values()))
    return known


def follow(events: Iterable[dict[str, Any]], known: dict[str, frozenset[str]],
           urls_of: Callable[[Any], frozenset[str]], stop: threading.Event, emit: Emit) -> bool:
    """A watch stream's changes applied to `known` (object name -> its URLs), every URL emitted
    after each one. False if `stop` was set during the stream, True when the stream ended."""
    for event in events:
        if stop.is_set():
            return False
        kind = event["type"]
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            continue  # BOOKMARK: only moves the resourceVersion
        obj: Any = event["object"]
        if kind == "DELETED":
            known.pop(obj.metadata.name, None)
        else:
            known[obj.metadata.name] = urls_of(obj)
        emit(frozenset().union(*known.values()))
    return True


class Watching:
    """A discovery source whose list/watch loop (`_run`, blocking: the kubernetes client is
    synchronous) runs in a daemon thread and hands each URL set to the event loop."""

    def _run(self, stop: threading.Event, emit: Emit) -> None:
        raise NotImplementedError

    async def updates(self) -> AsyncGenerator[frozenset[str], None]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[frozenset[str]] = asyncio.Queue()
        stop = threading.Event()

        def emit(urls: frozenset[str]) -> None:
            if stop.is_set():
                return
            try:
                loop.call_soon_threadsafe(queue.put_nowait, urls)
            except RuntimeError:  # the loop closed under us: nobody is listening any more
                stop.set()

        # Daemon: a watch blocked on a quiet stream ends at shutdown or at its timeout_seconds.
        thread = threading.Thread(
            target=self._run, args=(stop, emit), daemon=True, name="k8s-discovery")
        thread.start()
        last: frozenset[str] | None = None
        try:
            while True:
                urls = await queue.get()
                if urls != last:
                    last = urls
                    yield urls
        finally:
            stop.set()


class Kubernetes(Watching):
    """Backends = ready endpoints of the EndpointSlices labelled kubernetes.io/service-name=S, on
    `port`: a number, or a port name (e.g. "http") resolved per slice."""

    def __init__(
        self,
        namespace: str | None,
        service: str,
        port: int | str,
        *,
        watch_timeout_s: int,
        retry_s: float,
        api_client: client.ApiClient | None = None,
    ) -> None:
        self._namespace = namespace or own_namespace()
        self._service = service
        self._port = port
        # Built here, not in the thread: a missing config fails start-up with a clear message.
        self._api_client = api_client if api_client is not None else default_api_client()
        self._watch_timeout_s = watch_timeout_s
        self._retry_s = retry_s

    def _run(self, stop: threading.Event, emit: Emit) -> None:
        # The client's models are loosely typed; treat its objects as Any at this boundary.
        api: Any = client.DiscoveryV1Api(self._api_client)
        selector = f"{SERVICE_LABEL}={self._service}"
        urls_of = partial(slice_urls, port=self._port)
        while not stop.is_set():
            try:
                answer: Any = api.list_namespaced_endpoint_slice(
                    self._namespace, label_selector=selector)
                slices = listed(answer.items, urls_of, emit)
                rv = answer.metadata.resource_version
                w: Any = watch.Watch()  # type: ignore[no-untyped-call]
                while not stop.is_set():
                    events = w.stream(api.list_namespaced_endpoint_slice, self._namespace,
                                      label_selector=selector, resource_version=rv,
                                      timeout_seconds=self._watch_timeout_s)
                    if not follow(events, slices, urls_of, stop, emit):
                        return
                    # The server closed an idle watch (timeout_seconds): resume where we were.
                    rv = w.resource_version or rv
            except ApiException as exc:
                if exc.status == _GONE:
                    log.info("EndpointSlice watch expired (410 Gone); listing again")
                else:
                    log.warning("EndpointSlice list/watch failed (HTTP %s); retrying", exc.status)
                    stop.wait(self._retry_s)
            except Exception as exc:  # noqa: BLE001 - any network error: keep the last set, retry
                log.warning("EndpointSlice discovery error: %r; retrying", exc)
                stop.wait(self._retry_s)
