"""The gateway's Prometheus metrics, namespace `llmserve_`.

One `GatewayMetrics` per app, each with its own registry: no module-level collectors, so tests can
build many gateways in one process. Tokens are counters (tok/s is `rate()` in PromQL); TTFT and
end-to-end latency are histograms as the gateway observes them, including its own overhead.

Bucket choice (one set of bounds for CPU and GPU clusters, so one dashboard serves both):
- TTFT, 5 ms to 60 s: a GPU engine answers a short prompt in tens of milliseconds, vLLM-CPU in
  hundreds of milliseconds idle and several seconds queued; every decade gets 4 to 6 bounds.
- TPOT and ITL, 1 ms to 5 s: a GPU decodes one token in 5-50 ms (H100 to a 70B model over PP),
  vLLM-CPU in 20-300 ms; the bounds are densest between 5 and 100 ms, where the two overlap and
  where an SLO is usually set. Events the engine sends together land in the first bucket (gap 0).
- E2E, 10 ms to 10 min: short answers on a GPU to long generations on a CPU.
Changing a bound changes the series, so these are fixed here, not settings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.loop_metrics import CounterValue, LoopCounter, LoopHistogram

# What the gateway did with a stream broken after its first byte (gateway/api/resume.py).
ResumeOutcome = Literal["resumed", "failed", "no_replica", "limit", "deadline", "unsupported"]
RESUME_OUTCOMES: tuple[ResumeOutcome, ...] = get_args(ResumeOutcome)

_TTFT_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0,
    7.5, 10.0, 20.0, 30.0, 60.0,
)
# vllm bench serve's TPOT and ITL; the same bounds for both so their quantiles compare.
_TOKEN_GAP_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
    0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0,
)
_E2E_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)
_QUEUE_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0,
)
_BATCH_SIZE_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256)
_BATCH_DELAY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1)


class _Scraped(Collector):
    """Families built from `view` when Prometheus scrapes: nothing on the request path."""

    def describe(self) -> Iterator[Metric]:
        return iter(())


class _Table(_Scraped):
    """One gauge per column of the rows `view` returns: (label value, *column values)."""

    def __init__(self, label: str, columns: list[tuple[str, str]]) -> None:
        self._label = label
        self._columns = columns
        self.view: Callable[[], Iterable[tuple[Any, ...]]] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = [GaugeMetricFamily(name, doc, labels=[self._label])
                    for name, doc in self._columns]
        for key, *values in (self.view() if self.view is not None else ()):
            for family, value in zip(families, values, strict=True):
                family.add_metric([key], float(value))
        yield from families


class _UpstreamConnCollector(_Scraped):
    """Upstream connections opened, from the transport's own count when Prometheus scrapes."""

    def __init__(self) -> None:
        self.view: Callable[[], int] | None = None

    def collect(self) -> Iterator[CounterMetricFamily]:
        if self.view is not None:
            yield CounterMetricFamily(
                "llmserve_upstream_connections_opened",
                "TCP connections the gateway opened to backends (requests and probes); with "
                "keep-alive working, near zero per 1,000 requests", value=self.view())


# (pool, hits, misses, fallbacks by reason, keys moved, learned entries, panics) per model pool,
# from the routing policies' plain counters at scrape time.
RoutingView = Callable[[], Iterable[tuple[str, int, int, dict[str, int], int, int, int]]]


class _RoutingCollector(_Scraped):
    """Affinity routing and panic counters, read from the router when Prometheus scrapes."""

    def __init__(self) -> None:
        self.view: RoutingView | None = None

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        hits = CounterMetricFamily("llmserve_affinity_hits", "Requests sent to the replica that "
                                   "served their longest known prefix or session key",
                                   labels=["pool"])
        misses = CounterMetricFamily("llmserve_affinity_misses", "Affinity-routed requests with "
                                     "no usable learned prefix", labels=["pool"])
        fallbacks = CounterMetricFamily(
            "llmserve_affinity_fallbacks", "Requests routed least-outstanding instead of to their "
            "preferred replica (overloaded: over the load bound; unavailable: down, ejected or "
            "tried; miss_overloaded: a new prefix's home above the mean; miss_rebalanced: its "
            "home's cache took in more than one prompt beyond another's)",
            labels=["pool", "reason"])
        moved = CounterMetricFamily("llmserve_affinity_keys_moved", "Learned prefixes re-homed "
                                    "to another replica (left, restarted, ejected, overloaded)",
                                    labels=["pool"])
        entries = GaugeMetricFamily("llmserve_affinity_entries", "Prefixes the policy remembers "
                                    "(capped by GATEWAY_AFFINITY__MAX_ENTRIES)", labels=["pool"])
        panics = CounterMetricFamily("llmserve_routing_panics", "Requests routed to ejected "
                                     "backends because no backend of the pool was available",
                                     labels=["pool"])
        for pool, h, m, fb, mv, n, p in (self.view() if self.view is not None else ()):
            hits.add_metric([pool], h)
            misses.add_metric([pool], m)
            for reason, count in fb.items():
                fallbacks.add_metric([pool, reason], count)
            moved.add_metric([pool], mv)
            entries.add_metric([pool], n)
            panics.add_metric([pool], p)
        yield from (hits, misses, fallbacks, moved, entries, panics)


@dataclass(frozen=True)
class KvView:
    """What the kv_aware metrics read at scrape time: each pool's outcomes (kv_aware.OUTCOMES),
    each replica's index (blocks held, 1 if stale), the subscriber's totals (gaps replayed,
    gaps lost, engine restarts seen)."""

    outcomes: Callable[[], Iterable[tuple[str, dict[str, int]]]]
    replicas: Callable[[], Iterable[tuple[str, int, bool]]]
    events: Callable[[], tuple[int, int, int]]


class _KvCollector(_Scraped):
    """kv_aware routing (docs/routing.md): only with the policy in use."""

    def __init__(self) -> None:
        self.view: KvView | None = None

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        v = self.view
        if v is None:
            return
        routed = CounterMetricFamily(
            "llmserve_kv_routing", "kv_aware requests by outcome (hit: one replica holds the "
            "longest cached prefix; shared: several do; miss, overloaded: none within the load "
            "bound; no_tokens, short, no_events: routed by prefix_affinity instead)",
            labels=["pool", "outcome"])
        for pool, counts in v.outcomes():
            for outcome, n in counts.items():
                routed.add_metric([pool, outcome], n)
        blocks = GaugeMetricFamily("llmserve_kv_index_blocks", "Blocks the replica's engine "
                                   "holds, as its KV events tell (capped by "
                                   "GATEWAY_KV__MAX_BLOCKS)", labels=["backend"])
        stale = GaugeMetricFamily("llmserve_kv_index_stale", "1 while the replica's event "
                                  "publisher is unreachable (its requests route by history)",
                                  labels=["backend"])
        for url, n, is_stale in v.replicas():
            blocks.add_metric([url], n)
            stale.add_metric([url], 1.0 if is_stale else 0.0)
        gaps, lost, restarts = v.events()
        yield routed
        yield blocks
        yield stale
        yield CounterMetricFamily("llmserve_kv_events_gaps", "Missed event batches fetched "
                                  "from an engine's replay socket", value=gaps)
        yield CounterMetricFamily("llmserve_kv_events_resyncs", "Gaps the replay could not "
                                  "fill: the replica's index was cleared", value=lost)
        yield CounterMetricFamily("llmserve_kv_events_restarts", "Engines seen starting over "
                                  "(publisher gone, sequence reset): index cleared", value=restarts)


@dataclass(frozen=True)
class AdapterView:
    """What the LoRA adapter metrics read at scrape time: the adapters some available replica
    serves, with their base ((adapter, base) pairs: the only adapter label values, so a name a
    client made up never becomes one); residency routing's outcomes per base; adapter loads."""

    served: Callable[[], Iterable[tuple[str, str]]]
    residency: Callable[[], dict[str, dict[str, int]]]
    loads: Callable[[], dict[str, int]]


class _AdapterCollector(_Scraped):
    def __init__(self) -> None:
        self.view: AdapterView | None = None

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        info = GaugeMetricFamily(
            "llmserve_adapter_info", "1 per LoRA adapter served by an available replica, with "
            "its base model; per-adapter requests, tokens and TTFT are the model-labelled "
            "series (model = the adapter's name): join on model", labels=["adapter", "base"])
        residency = CounterMetricFamily(
            "llmserve_adapter_residency", "Adapter requests by residency routing's outcome per "
            "base model (hit: sent where the adapter is resident; miss: resident nowhere; "
            "overloaded: every holder over the load bound; idle: no more adapters than "
            "--max-loras, not narrowed)", labels=["base", "outcome"])
        loads = CounterMetricFamily(
            "llmserve_adapter_loads", "Adapter loads the gateway asked of replicas (added at "
            "run time, or re-applied to a replica that restarted or joined), by outcome",
            labels=["outcome"])
        v = self.view
        if v is not None:
            for adapter, base in v.served():
                info.add_metric([adapter, base], 1.0)
            for base, counts in sorted(v.residency().items()):
                for outcome, n in counts.items():
                    residency.add_metric([base, outcome], n)
            for outcome, n in v.loads().items():
                loads.add_metric([outcome], n)
        yield from (info, residency, loads)


class ModelSeries:
    """One model's per-request series, their label children looked up once (a `labels()` call
    per update builds a key each time; six per streamed request)."""

    __slots__ = ("_requests", "_requests_by", "_tenant_tokens", "_tenants", "adapter", "e2e",
                 "input_tokens", "itl", "model", "output_tokens", "tpot", "ttft",
                 "usage_invalid")

    def __init__(self, m: GatewayMetrics, model: str) -> None:
        self.model = model
        # A LoRA adapter: its tokens are also counted per tenant (tenant accounting per adapter).
        self.adapter = m.parent_of(model) is not None
        self._tenant_tokens = m.tenant_adapter_tokens
        # tenant -> (input child, output child): bounded by the keys file's tenants.
        self._tenants: dict[str, tuple[CounterValue, CounterValue]] = {}
        self.ttft = m.ttft.labels(model)
        self.e2e = m.e2e.labels(model)
        self.tpot = m.tpot.labels(model)
        self.itl = m.itl.labels(model)
        self.input_tokens = m.input_tokens.labels(model)
        self.output_tokens = m.output_tokens.labels(model)
        self.usage_invalid = m.usage_invalid.labels(model)
        self._requests = m.requests
        # (endpoint, backend, status) -> child: bounded by the endpoints, the pool's backends and
        # the statuses seen.
        self._requests_by: dict[tuple[str, str, str], CounterValue] = {}

    def tenant_used(self, tenant: str, prompt_tokens: int, completion_tokens: int) -> None:
        """An adapter's tokens charged to `tenant` (a no-op for a base model)."""
        if not self.adapter:
            return
        pair = self._tenants.get(tenant)
        if pair is None:
            pair = self._tenants[tenant] = (
                self._tenant_tokens.labels(tenant, self.model, "input"),
                self._tenant_tokens.labels(tenant, self.model, "output"))
        pair[0].inc(prompt_tokens)
        pair[1].inc(completion_tokens)

    def request(self, endpoint: str, backend: str, status: str) -> None:
        """Count one proxied request by its endpoint, backend and final status."""
        child = self._requests_by.get((endpoint, backend, status))
        if child is None:
            child = self._requests_by[endpoint, backend, status] = self._requests.labels(
                self.model, endpoint, backend, status)
        child.inc()


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # The per-request series are updated on the event loop only: lock-free families
        # (gateway/loop_metrics.py). The rest, rare or written from other threads, are
        # prometheus_client's.
        self.ttft = LoopHistogram(
            "llmserve_ttft_seconds",
            "Time to first token of streamed requests as the gateway observes it (request received "
            "-> first content byte sent); whole answers feed only the E2E histogram",
            ["model"],
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.e2e = LoopHistogram(
            "llmserve_e2e_request_latency_seconds",
            "Request received -> last byte sent",
            ["model"],
            buckets=_E2E_BUCKETS,
            registry=r,
        )
        # As `vllm bench serve` defines them (the help texts say how), so the gateway's and the
        # load test's figures compare.
        self.tpot = LoopHistogram(
            "llmserve_tpot_seconds",
            "Time per output token of streamed requests after the first: (E2E - TTFT) / "
            "(output tokens - 1), as vllm bench serve computes it",
            ["model"], buckets=_TOKEN_GAP_BUCKETS, registry=r,
        )
        # Filled a whole stream at a time (HistogramValue.observe_many), never per event.
        self.itl = LoopHistogram(
            "llmserve_itl_seconds",
            "Inter-token latency of streamed requests: the gap between two successive content "
            "events as the gateway relays them (as vllm bench serve's ITL)",
            ["model"], buckets=_TOKEN_GAP_BUCKETS, registry=r,
        )
        self.pool_info = Gauge(
            "llmserve_pool_info",
            "1 per configured worker pool: its served model and parallel layout (tensor and "
            "pipeline parallel sizes, nodes per replica); join on `model`",
            ["pool", "model", "tp", "pp", "nodes"], registry=r,
        )
        self.output_tokens = LoopCounter(
            "llmserve_output_tokens", "Generated tokens, from upstream usage", ["model"], registry=r
        )
        self.input_tokens = LoopCounter(
            "llmserve_input_tokens", "Prompt tokens, from upstream usage", ["model"], registry=r
        )
        self.requests = LoopCounter(
            "llmserve_requests",
            "Proxied requests by model, engine endpoint (its path as the engine declares it), "
            "backend and final status",
            ["model", "endpoint", "backend", "status"],
            registry=r,
        )
        # Read from uvicorn's set of request tasks at scrape time (gateway/server.py).
        self.in_flight = Gauge(
            "llmserve_requests_in_flight", "HTTP requests being served on the API listener",
            registry=r,
        )
        self.retries = Counter(
            "llmserve_upstream_retries",
            "Attempts moved to another replica before the first byte",
            ["model"],
            registry=r,
        )
        self.usage_invalid = LoopCounter(
            "llmserve_upstream_usage_invalid",
            "Successful upstream answers whose usage was missing or malformed (a string, a "
            "negative number, a missing field): relayed as they were, tokens not counted",
            ["model"], registry=r,
        )
        self.retries_refused = Counter(
            "llmserve_upstream_retries_refused",
            "Retries not attempted because the retry budget (GATEWAY_RETRY_BUDGET) was spent",
            ["model"], registry=r,
        )
        self.stream_resumes = Counter(
            "llmserve_stream_resumes",
            "Streams broken after their first byte, by what the gateway did (api/resume.py): "
            "resumed on another replica, or why not (failed, no_replica, limit, deadline, "
            "unsupported)",
            ["outcome"], registry=r,
        )
        # Every outcome exported from the start, at 0: a rate or an alert on one sees a series
        # before the first broken stream, not an absent one.
        for outcome in RESUME_OUTCOMES:
            self.stream_resumes.labels(outcome)
        # (backend URL, available for routing, requests in flight)
        self.backends = _Table("backend", [
            ("llmserve_backend_up", "1 if the backend is available for routing"),
            ("llmserve_backend_outstanding_requests", "Requests in flight per backend"),
        ])
        r.register(self.backends)
        self.upstream_connections = _UpstreamConnCollector()
        r.register(self.upstream_connections)
        self.routing = _RoutingCollector()
        r.register(self.routing)
        self.adapters = _AdapterCollector()
        r.register(self.adapters)
        self.kv = _KvCollector()
        r.register(self.kv)
        self._series: dict[str, ModelSeries] = {}

        # -- the HTTP edge (gateway/edge/) ------------------------------------------------------
        self.edge_events = Counter(
            "llmserve_edge_events",
            "Connections and requests refused or cut by the HTTP edge, by reason "
            "(head_too_large, too_many_headers, head_timeout, body_timeout, body_unread, "
            "connection_cap, bad_request)", ["reason"], registry=r,
        )
        self.connections_open = Gauge(
            "llmserve_connections_open", "Client connections open on the API listener", registry=r
        )

        # -- flow control (gateway/flow) ---------------------------------------------------------
        # (pool, queue depth, concurrency limit, its ceiling, admitted in flight)
        self.pools = _Table("pool", [
            ("llmserve_queue_depth", "Requests waiting in the gateway queue of a pool"),
            ("llmserve_concurrency_limit", "Current adaptive concurrency limit of a pool"),
            ("llmserve_concurrency_limit_ceiling", ("Highest the adaptive limit of a pool may "
                                                    "grow: max_limit per available replica")),
            ("llmserve_admitted_in_flight", "Admitted requests in flight per pool"),
        ])
        r.register(self.pools)
        # (pool, demand, ready replicas): the scaling signal, meant for autoscalers (KEDA, an
        # HPA's external metric), from gateway/flow/demand.py.
        self.demand = _Table("pool", [
            ("llmserve_pool_demand", (
                "Requests a pool is asked to carry now: waiting for a replica of a pool at zero, "
                "waiting in the admission queue, and in flight (the autoscaling signal; sum it "
                "over gateway replicas)")),
            ("llmserve_pool_ready_replicas", ("Replicas of a pool the gateway routes to now "
                                              "(demand / this = load per replica)")),
        ])
        r.register(self.demand)
        self.queue_time = LoopHistogram(
            "llmserve_queue_time_seconds",
            "Time an admitted request waited in the gateway queue (0 when admitted at once)",
            ["pool"], buckets=_QUEUE_BUCKETS, registry=r,
        )
        self.rejections = Counter(
            "llmserve_rejections",
            "Requests refused by admission control (rpm, tpm: 429; queue_full, queue_wait, "
            "queue_timeout, unavailable: 503) or by their pool's wake budget (wake_timeout: 503)",
            ["pool", "reason"], registry=r,
        )
        self.queue_overflows = Counter(
            "llmserve_queue_overflows",
            "Queued requests sent above the concurrency limit at their queue deadline "
            "(the wait estimate was too hopeful)", ["pool"], registry=r,
        )
        self.tenant_requests = LoopCounter(
            "llmserve_tenant_requests", "Admitted requests per tenant (API key)", ["tenant"],
            registry=r,
        )
        self.tenant_tokens = LoopCounter(
            "llmserve_tenant_tokens", "Tokens used per tenant, from upstream usage",
            ["tenant", "kind"], registry=r,
        )
        self.tenant_adapter_tokens = LoopCounter(
            "llmserve_tenant_adapter_tokens", "Tokens used per tenant on each LoRA adapter, from "
            "upstream usage (also counted in llmserve_tenant_tokens)",
            ["tenant", "adapter", "kind"], registry=r,
        )
        # Set by the app: a LoRA adapter's base model, None for a base model (routing/adapters).
        self.parent_of: Callable[[str], str | None] = lambda _: None
        self.shared_limit_errors = Counter(
            "llmserve_shared_limits_errors",
            "Per-key limit checks that Redis failed (timeout, refused, error); "
            "GATEWAY_FLOW__LIMITS_REDIS_FAIL decides what those requests got", registry=r,
        )
        self.batch_size = Histogram(
            "llmserve_batch_size", "Prompts per upstream request sent by the batcher", ["model"],
            buckets=_BATCH_SIZE_BUCKETS, registry=r,
        )
        self.batch_delay = Histogram(
            "llmserve_batch_added_delay_seconds",
            "Time a request waited in the batcher for companions", ["model"],
            buckets=_BATCH_DELAY_BUCKETS, registry=r,
        )

    def series(self, model: str) -> ModelSeries:
        """`model`'s per-request series. Only for models the router serves (the proxy calls it
        after a replica was picked): the cache is as bounded as the label values are."""
        found = self._series.get(model)
        if found is None:
            found = self._series[model] = ModelSeries(self, model)
        return found
