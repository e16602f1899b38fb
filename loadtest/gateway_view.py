"""What the gateway says: each target's layout (/v1/models) and its request and token counters
(/metrics), the server side of the cross-check."""

from __future__ import annotations

import socket
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from loadtest.errors import UsageError


@dataclass(frozen=True)
class Layout:
    tp: int | None
    pp: int | None
    nodes: int | None
    replicas: int | None
    source: str  # where the figures came from

    @property
    def gpus(self) -> int | None:
        """GPUs (or CPU ranks) one target costs: TP x PP per replica, times replicas."""
        if self.tp is None or self.pp is None or self.replicas is None:
            return None
        return self.tp * self.pp * self.replicas

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "gpus": self.gpus}


def auth_headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def layout_of(host: str, model: str, api_key: str = "") -> Layout:
    """The target's layout from the gateway's /v1/models `llmserve` field; a model the gateway
    does not list is an error (nothing to measure)."""
    r = httpx.get(host + "/v1/models", headers=auth_headers(api_key), timeout=10)
    if r.status_code != 200:
        raise RuntimeError(f"GET {host}/v1/models answered {r.status_code}: {r.text[:200]}")
    models = {m.get("id"): m for m in r.json().get("data", [])}
    if model not in models:
        raise UsageError(f"the gateway at {host} does not serve {model!r} "
                           f"(it lists: {', '.join(sorted(map(str, models))) or 'nothing'})")
    info = models[model].get("llmserve") or {}
    replicas = info.get("replicas")
    if "tp" in info:
        return Layout(info["tp"], info["pp"], info["nodes"], replicas,
                      "gateway /v1/models (GATEWAY_POOLS)")
    return Layout(None, None, None, replicas,
                  "gateway /v1/models: replicas only (no layout declared for this model)")


@dataclass(frozen=True)
class Counters:
    requests: float
    output_tokens: float
    by_status: dict[str, float]


def metrics_urls(host: str, sources: Sequence[str]) -> list[str]:
    """The /metrics pages the cross-check sums. A Service in front of several gateway replicas
    answers a scrape from one of them, so their counters must be read pod by pod: `dns:NAME:PORT`
    stands for every address a headless Service resolves to at the time of the scrape."""
    if not sources:
        return [host + "/metrics"]
    urls = []
    for src in sources:
        if not src.startswith("dns:"):
            urls.append(src)
            continue
        name, _, port = src[4:].rpartition(":")
        try:
            infos = socket.getaddrinfo(name, int(port), type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise RuntimeError(f"--metrics-from {src}: {name} does not resolve ({exc})") from None
        for addr in sorted({str(i[4][0]) for i in infos}):
            urls.append(f"http://[{addr}]:{port}/metrics" if ":" in addr
                        else f"http://{addr}:{port}/metrics")
    return urls


def counters(host: str, model: str, sources: Sequence[str] = ()) -> Counters:
    """The gateway's llmserve_requests_total and llmserve_output_tokens_total for one model,
    summed over every gateway replica named by `sources` (default: the one behind `host`)."""
    requests = tokens = 0.0
    by_status: dict[str, float] = {}
    for url in metrics_urls(host, sources):
        text = httpx.get(url, timeout=10).text
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.labels.get("model") != model:
                    continue
                if s.name == "llmserve_requests_total":
                    requests += s.value
                    status = s.labels.get("status", "?")
                    by_status[status] = by_status.get(status, 0.0) + s.value
                elif s.name == "llmserve_output_tokens_total":
                    tokens += s.value
    return Counters(requests, tokens, by_status)


def settled(host: str, model: str, sources: Sequence[str], at_least: float,
            timeout_s: float = 5.0) -> Counters:
    """The counters once the gateway has counted `at_least` requests of `model` (or after
    `timeout_s`): it counts a request when its last byte has gone out, a moment after the client
    read it, so a snapshot taken right after the client's last request can miss that request and
    put it into the next run's delta."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = counters(host, model, sources)
        if now.requests >= at_least or time.monotonic() > deadline:
            return now
        time.sleep(0.1)


def cross_check(before: Counters, after: Counters, client_requests: int, client_tokens: int,
                tolerance: float) -> dict[str, Any]:
    """Client counts beside the gateway's deltas; `ok` False beyond `tolerance` (relative)."""
    server_requests = after.requests - before.requests
    server_tokens = after.output_tokens - before.output_tokens

    def rel(client: float, server: float) -> float:
        return abs(client - server) / max(server, client, 1.0)

    statuses = {k: after.by_status.get(k, 0.0) - before.by_status.get(k, 0.0)
                for k in after.by_status}
    out = {
        "client_requests": client_requests, "gateway_requests": server_requests,
        "client_output_tokens": client_tokens, "gateway_output_tokens": server_tokens,
        "requests_diff": round(rel(client_requests, server_requests), 5),
        "output_tokens_diff": round(rel(client_tokens, server_tokens), 5),
        "gateway_status": {k: v for k, v in statuses.items() if v},
    }
    out["ok"] = out["requests_diff"] <= tolerance and out["output_tokens_diff"] <= tolerance
    return out
