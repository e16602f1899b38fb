"""InferencePool discovery (`GATEWAY_DISCOVERY=inferencepool`): the endpoints an InferencePool
(inference.networking.k8s.io/v1) names, as an endpoint picker finds them: the pods its
`selector` matches in its namespace, on each of its `targetPorts`.

The pool is read, then its pods are listed and watched (the same thread and resume machinery as
the EndpointSlice discovery, kubernetes.py). A pod counts when it has an IP, its `Ready`
condition is True and it is not being deleted. When a watch ends (its timeout) the pool is read
again, so a changed selector or port list takes effect within `watch_timeout_s` (GATEWAY_K8S_WATCH_TIMEOUT_S).
"""

from __future__ import annotations

import logging
import threading
from functools import partial
from typing import Any

from kubernetes import client, watch

# Imported here, not on the thread's first use: the core API's module takes seconds to load, and
# start-up is the time for that, not the first discovery.
from kubernetes.client import CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from gateway.routing.discovery.kubernetes import (
    Emit,
    Watching,
    default_api_client,
    follow,
    listed,
    own_namespace,
)

log = logging.getLogger("gateway.discovery.inferencepool")

GROUP = "inference.networking.k8s.io"
VERSION = "v1"
PLURAL = "inferencepools"
_GONE = 410


def pod_urls(pod: Any, ports: list[int]) -> frozenset[str]:
    """The URLs of one pod on `ports`, if it is ready to serve (else none)."""
    ip = pod.status.pod_ip if pod.status is not None else None
    if not ip or pod.metadata.deletion_timestamp is not None:
        return frozenset()
    ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
    if not ready:
        return frozenset()
    host = f"[{ip}]" if ":" in ip else ip
    return frozenset(f"http://{host}:{p}" for p in ports)


def pool_spec(pool: dict[str, Any]) -> tuple[str, list[int]]:
    """An InferencePool's label selector (as the API's query string) and target ports."""
    labels = pool["spec"]["selector"]["matchLabels"]
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return selector, [int(p["number"]) for p in pool["spec"]["targetPorts"]]


class InferencePoolPods(Watching):
    def __init__(
        self,
        namespace: str | None,
        pool: str,
        *,
        watch_timeout_s: int,
        retry_s: float,
        api_client: client.ApiClient | None = None,
    ) -> None:
        self._namespace = namespace or own_namespace()
        self._pool = pool
        # Built here, not in the thread: a missing config fails start-up with a clear message.
        self._api_client = api_client if api_client is not None else default_api_client()
        self._watch_timeout_s = watch_timeout_s
        self._retry_s = retry_s

    def _run(self, stop: threading.Event, emit: Emit) -> None:
        # The client's models are loosely typed; treat its objects as Any at this boundary.
        custom: Any = CustomObjectsApi(self._api_client)
        core: Any = CoreV1Api(self._api_client)
        ns = self._namespace
        while not stop.is_set():
            try:
                pool = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, self._pool)
                selector, ports = pool_spec(pool)
                answer: Any = core.list_namespaced_pod(ns, label_selector=selector)
                urls_of = partial(pod_urls, ports=ports)
                pods = listed(answer.items, urls_of, emit)
                w: Any = watch.Watch()  # type: ignore[no-untyped-call]
                events = w.stream(core.list_namespaced_pod, ns, label_selector=selector,
                                  resource_version=answer.metadata.resource_version,
                                  timeout_seconds=self._watch_timeout_s)
                if not follow(events, pods, urls_of, stop, emit):
                    return
                # The watch timed out: read the pool again (selector, ports) and list again.
            except ApiException as exc:
                if exc.status == _GONE:
                    log.info("pod watch expired (410 Gone); listing again")
                    continue
                log.warning("InferencePool %s/%s discovery failed (HTTP %s); retrying", ns,
                            self._pool, exc.status)
                stop.wait(self._retry_s)
            except Exception as exc:  # noqa: BLE001 - any network error: keep the last set, retry
                log.warning("InferencePool discovery error: %r; retrying", exc)
                stop.wait(self._retry_s)
