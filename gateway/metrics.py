"""The gateway's Prometheus metrics, namespace `llmserve_`.

One `GatewayMetrics` per app, each with its own registry: no module-level collectors, so tests can
build many gateways in one process. Tokens are counters (tok/s is `rate()` in PromQL); TTFT and
end-to-end latency are histograms as the gateway observes them, including its own overhead.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# TTFT on CPU engines spans milliseconds to seconds under load; GPU clusters sit at the low end.
_TTFT_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0,
    7.5, 10.0, 20.0, 30.0, 60.0,
)
_E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.ttft = Histogram(
            "llmserve_ttft_seconds",
            "Time to first token as the gateway observes it (request received -> first content byte sent)",
            ["model"],
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "llmserve_e2e_request_latency_seconds",
            "Request received -> last byte sent",
            ["model"],
            buckets=_E2E_BUCKETS,
            registry=r,
        )
        self.output_tokens = Counter(
            "llmserve_output_tokens", "Generated tokens, from upstream usage", ["model"], registry=r
        )
        self.input_tokens = Counter(
            "llmserve_input_tokens", "Prompt tokens, from upstream usage", ["model"], registry=r
        )
        self.requests = Counter(
            "llmserve_requests",
            "Proxied requests by model, backend and final status",
            ["model", "backend", "status"],
            registry=r,
        )
        self.in_flight = Gauge(
            "llmserve_requests_in_flight", "HTTP requests being served", registry=r
        )
        self.retries = Counter(
            "llmserve_upstream_retries",
            "Attempts moved to another replica before the first byte",
            ["model"],
            registry=r,
        )
        self.backend_up = Gauge(
            "llmserve_backend_up", "1 if the backend is available for routing", ["backend"],
            registry=r,
        )
        self.backend_outstanding = Gauge(
            "llmserve_backend_outstanding_requests", "Requests in flight per backend",
            ["backend"], registry=r,
        )
