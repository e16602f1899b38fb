"""GatewaySettings: the one immutable, validated configuration object of the gateway.

Built once at start-up from env (`GATEWAY_*`) and CLI flags, then passed down explicitly; nothing
reads the environment after that, so tests build as many independent gateways as they like.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from model_store.adapter import ADAPTER_NAME
from worker.rules import ENGINE_PORT

# A request's longest wait for a pool at zero, unless its pool says otherwise; and the cap.
DEFAULT_WAKE_BUDGET_S = 300.0
WAKE_BUDGET_MAX_S = 3600

# A key's SHA-256 as hex, as the keys file and GATEWAY_ADMIN_KEY_SHA256 give it (either case).
SHA256_HEX = r"^[A-Fa-f0-9]{64}$"

# Request priorities, highest first (a key's priority, x-llmserve-priority, the flow's default).
Priority = Literal["high", "normal", "low"]

# The routing policies by name, checked at start-up; gateway/routing/factory.py builds them.
PolicyName = Literal["prefix_affinity", "least_outstanding", "round_robin", "kv_aware"]


class Timeouts(BaseModel):
    """Every deadline of one upstream request. `first_byte_s` covers the engine's queueing and
    prefill; `idle_s` bounds the gap between two SSE events; `total_s` caps the request."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    connect_s: float = Field(2.0, gt=0, description="TCP connect to a backend")
    first_byte_s: float = Field(120.0, gt=0, description="request sent -> first response byte")
    idle_s: float = Field(60.0, gt=0, description="max gap between two upstream chunks")
    total_s: float = Field(900.0, gt=0, description="whole request, start to end")

    @model_validator(mode="after")
    def _ordered(self) -> Timeouts:
        if self.connect_s > self.total_s or self.first_byte_s > self.total_s:
            raise ValueError(
                "GATEWAY_TIMEOUTS: connect_s and first_byte_s must not exceed total_s "
                f"(connect_s={self.connect_s}, first_byte_s={self.first_byte_s}, "
                f"total_s={self.total_s})")
        return self


class FlowSettings(BaseModel):
    """Admission control per backend pool: adaptive concurrency limit, fair queue, rejections.

    A request may wait up to `queue_timeout_s` in the queue, and the limiter keeps the engines'
    TTFT under the rest of `ttft_target_s`, so admitted requests stay within the target."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(True, description="admission control (limit + queue) per model pool")
    ttft_target_s: float = Field(
        4.0, gt=0, description="TTFT target for admitted requests, queue wait included")
    queue_timeout_s: float = Field(
        1.0, gt=0, description="longest wait in the gateway queue before a 503 or a send above "
                                "the limit (a cold start's queue may wait half again as long for the "
                                "engines' verdict)")
    max_queue: int = Field(512, ge=0, description="queued requests per pool before 503")
    # Small, not to overfill a small replica with a cold burst; slow start doubles it per round
    # trip (flow/admission.py).
    initial_limit: int = Field(24, ge=1, description="starting concurrency limit per pool (at "
                               "most what one replica serves within the TTFT target)")
    min_limit: int = Field(2, ge=1, description="floor of the adaptive concurrency limit")
    max_limit: int = Field(
        1024, ge=1, description="ceiling of the adaptive concurrency limit per available replica "
                                "(a pool's ceiling is this times its model's replicas)")
    backoff: float = Field(
        0.9, gt=0, lt=1, description="multiplicative decrease when the target is missed")
    scrape_engines: bool = Field(
        True, description="also back off on engines' vllm:num_requests_waiting / kv cache usage")
    scrape_interval_s: float = Field(1.0, gt=0, description="engine /metrics scrape period")
    kv_cache_high: float = Field(
        0.95, gt=0, le=1, description="engine KV cache usage treated as saturation")
    default_priority: Priority = Field(
        "normal", description="priority when neither the key nor x-llmserve-priority sets one")
    # Per-key limits across gateway replicas: one Redis for all, or each enforcing its share.
    limits_redis_url: str | None = Field(
        None, description="Redis URL (redis://host:6379/0) holding per-key limits for every "
                          "replica, and where stored Responses API answers live (responses)"
    )
    limits_redis_fail: Literal["open", "closed"] = Field(
        "open", description="when Redis fails: admit (open) or answer 503 (closed)")
    limits_redis_timeout_s: float = Field(
        0.1, gt=0, le=5, description="Redis connect/read timeout for one limit check")
    limits_redis_retry_s: float = Field(
        2.0, gt=0, description="after a Redis failure, apply limits_redis_fail this long")
    limit_replicas: int = Field(
        1, ge=1, description="replicas sharing each key's limits without Redis (each enforces 1/N)")

    @model_validator(mode="after")
    def _consistent(self) -> FlowSettings:
        if self.limits_redis_url is not None and self.limit_replicas != 1:
            raise ValueError(
                "GATEWAY_FLOW: limit_replicas divides per-key limits between replicas that do not "
                "share them; with limits_redis_url they are shared already (set one of the two)")
        if self.limits_redis_url is not None and not self.limits_redis_url.startswith(
            ("redis://", "rediss://", "unix://")
        ):
            raise ValueError(
                "GATEWAY_FLOW: limits_redis_url must be a redis://, rediss:// or unix:// URL")
        if not self.min_limit <= self.initial_limit <= self.max_limit:
            raise ValueError(
                "GATEWAY_FLOW: need min_limit <= initial_limit <= max_limit "
                f"(got {self.min_limit}, {self.initial_limit}, {self.max_limit})")
        if self.queue_timeout_s >= self.ttft_target_s:
            raise ValueError(
                "GATEWAY_FLOW: queue_timeout_s must be below ttft_target_s (the rest is the "
                f"engines' share of the target; got {self.queue_timeout_s} >= "
                f"{self.ttft_target_s})")
        return self


class BatchSettings(BaseModel):
    """Adaptive batching of non-streaming /v1/completions into one multi-prompt request."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Off by default: vLLM batches continuously, and this did not win there (docs/benchmarks.md).
    enabled: bool = Field(False, description="coalesce compatible non-streaming completions")
    max_size: int = Field(16, ge=1, le=256, description="most prompts in one upstream request")
    max_delay_s: float = Field(
        0.005, ge=0, le=1, description="longest a request waits for companions (under load)")


class EdgeSettings(BaseModel):
    """The HTTP edge against hostile and slow clients (gateway/edge/), enforced in the protocol
    before a request reaches the app: head caps, head/body timeouts, a connection cap, and a
    separate listener for the probes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # As Envoy's caps (60 KiB, 100 headers); an OpenAI client sends well under 2 KiB.
    max_head_bytes: int = Field(
        64 * 1024, ge=1024, le=16 * 1024 * 1024,
        description="largest request head (request line + headers), and most chunk sizes, "
                    "extensions and trailers in a row in a chunked body; larger gets 431")
    max_headers: int = Field(100, ge=8, le=10_000, description="most request headers; more: 431")
    head_timeout_s: float = Field(
        10.0, gt=0, description="a connection's first byte, or a request's, to the end of its head")
    body_timeout_s: float = Field(
        30.0, gt=0, description="longest gap between two reads of a request body")
    max_connections: int = Field(
        8192, ge=1, description="open client connections per process; more are closed at accept")
    probe_port: int | None = Field(
        None, ge=1, le=65535,
        description="separate listener for /health, /ready and /metrics (unset: none)")


class EppSettings(BaseModel):
    """EPP mode (`--mode epp`, gateway/epp/): the scheduler served to a Gateway API gateway
    (Envoy Gateway, Istio, kgateway...) as an Envoy ext_proc endpoint picker, instead of proxying
    itself. Routing, flow control and limits are the gateway's settings above."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    port: int = Field(9002, ge=1, le=65535,
                      description="ext_proc gRPC port (GIE's convention: 9002), with gRPC health")
    metrics_port: int | None = Field(
        9090, ge=1, le=65535, description="HTTP port of /metrics (unset: none)")
    chunk_bytes: int = Field(
        62_000, ge=1024, le=64_000,
        description="largest body chunk sent back to Envoy (Envoy takes 64 KiB at most)")
    pool_name: str | None = Field(
        None, description="the InferencePool whose selector finds the endpoints "
                          "(discovery=inferencepool)")
    pool_namespace: str | None = Field(
        None, description="the InferencePool's namespace (discovery=inferencepool; default: own)")


class ResponsesSettings(BaseModel):
    """Which replica holds each stored Responses API answer (gateway/routing/responses.py), so
    previous_response_id, GET and cancel by id reach it. Shared through flow.limits_redis_url
    when set (any gateway replica then serves the next turn), else kept by each replica."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ttl_s: float = Field(
        7 * 86400.0, gt=0,
        description="how long a response's replica is remembered (vLLM keeps a stored response "
                    "as long as its engine runs)")
    max_entries: int = Field(
        100_000, ge=1,
        description="responses remembered in this replica's memory (least recently used go "
                    "first; about 200 bytes each)")


class PoolLayout(BaseModel):
    """One worker pool as the chart deploys it: vLLM's API does not tell a replica's layout, which
    dashboards (`llmserve_pool_info`) and benchmark reports (`/v1/models`) show.

    A pool that may scale to zero (`scale_to_zero`) names its model here, as no engine does then;
    its requests wait up to `wake_budget_s` for a replica, not a fast 503 (routing/wake.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, description="the pool's name (the engines' `pool` label)")
    model: str = Field(min_length=1, description="the model name the pool serves")
    tp: int = Field(1, ge=1, description="tensor parallel size")
    pp: int = Field(1, ge=1, description="pipeline parallel size")
    nodes: int = Field(1, ge=1, description="nodes (pods) per replica")
    scale_to_zero: bool = Field(
        False, description="the pool may have no replica: its model stays listed and requests "
                           "wait up to wake_budget_s for one (not a fast 503)")
    wake_budget_s: float = Field(
        DEFAULT_WAKE_BUDGET_S, gt=0, le=WAKE_BUDGET_MAX_S,
        description="longest a request waits for a replica of a scale_to_zero pool; then 503 "
                    "with Retry-After")
    adapters: list[Annotated[str, Field(pattern=ADAPTER_NAME)]] = Field(
        default=[],
        description="LoRA adapters every replica of the pool loads at start: known (and waited "
                    "for at zero) before any replica lists them")

    @model_validator(mode="after")
    def _budget_needs_zero(self) -> PoolLayout:
        if "wake_budget_s" in self.model_fields_set and not self.scale_to_zero:
            raise ValueError(
                f"GATEWAY_POOLS: pool {self.name!r} sets wake_budget_s without scale_to_zero "
                "(only a pool that may have no replica makes requests wait)")
        return self


class AffinitySettings(BaseModel):
    """The prefix_affinity routing policy (gateway/routing/affinity.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    balance: float = Field(
        0.25, gt=0, le=10,
        description="bounded load: a cache hit may take its replica to (1 + balance) x mean load")
    slack: int = Field(
        0, ge=0, le=1024,
        description="a cache hit may exceed the bound by this many requests (SGLang's "
        "balance_abs_threshold): at low load a cold prefill elsewhere costs more than queueing")
    miss_cost_bytes: int = Field(
        1024, ge=0, le=1 << 20,
        description="a cache hit may exceed the bound by one request per this many cached prompt "
        "bytes: a cold prefill of that much costs about one queued request (0: off)")
    chunk_bytes: int = Field(
        512, ge=16, le=65536, description="prompt prefix hashed in chunks of this many bytes")
    max_chunks: int = Field(64, ge=1, le=4096, description="chunks hashed per prompt at most")
    max_entries: int = Field(
        100_000, ge=1, description="learned prefixes kept (LRU); caps the policy's memory")
    session_header: str = Field(
        "x-session-id", min_length=1, description="request header carrying an explicit session key")


def declared_adapters(pools: list[PoolLayout]) -> dict[str, str]:
    """Each adapter the pools declare, with the model (its base) of its pool."""
    return {a: p.model for p in pools for a in p.adapters}


class KvSettings(BaseModel):
    """The kv_aware routing policy: routing on the engines' KV cache events (docs/routing.md,
    gateway/routing/kv_events.py, kv_aware.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    events_port: int = Field(
        5557, ge=1, le=65534,
        description="each replica's KV events port (its WORKER_KV_EVENTS_PORT), on the replica "
        "URL's host; the replay socket is the next port")
    endpoints: dict[str, str] = Field(
        default={},
        description='per replica, its events endpoint instead, JSON: {"http://h:8001": '
        '"tcp://h:5601"} (replicas sharing a host: a local stack)')
    topic: str = Field("", description="the engines' KV events topic (vLLM's default: empty)")
    tokenizers: dict[str, Path] = Field(
        default={},
        description='tokenizer directory per served model, JSON: {"model": "/models/m"} (the '
        "model's own files: tokenizer and chat template); a model without one routes by "
        "prefix_affinity")
    hash_algo: Literal["sha256", "sha256_cbor"] = Field(
        "sha256", description="the engines' --prefix-caching-hash-algo (sha256: vLLM's default)")
    hash_seed: str = Field(
        "vllm-none-hash", min_length=1,
        description="the engines' PYTHONHASHSEED if they set one (vLLM's default seed otherwise)")
    max_blocks: int = Field(
        1_000_000, ge=1, description="block hashes kept per replica (about 100 bytes each)")
    max_prompt_blocks: int = Field(
        512, ge=1, description="blocks of a prompt hashed at most (a longer prompt: its start)")
    miss_cost_tokens: int = Field(
        256, ge=0,
        description="a replica holding the prompt's prefix may exceed the load bound by one "
        "request per this many cached tokens (a cold prefill that long costs about one queued "
        "request; 0: off)")
    replay_timeout_s: float = Field(
        1.0, gt=0, le=60, description="wait for an engine's replay socket to fill a gap")

    @field_validator("endpoints")
    @classmethod
    def _tcp(cls, v: dict[str, str]) -> dict[str, str]:
        out = {}
        for url, ep in v.items():
            port = ep.rpartition(":")[2]
            if not ep.startswith("tcp://") or not port.isdigit():
                raise ValueError(f"GATEWAY_KV__ENDPOINTS: {ep!r} is not tcp://host:port")
            out[url.rstrip("/")] = ep
        return out


def wake_budgets(pools: list[PoolLayout]) -> dict[str, float]:
    """Each model that may have no replica (one of its pools scales to zero), with the longest
    wake budget its scalable pools declare."""
    out: dict[str, float] = {}
    for p in pools:
        if p.scale_to_zero:
            out[p.model] = max(out.get(p.model, 0.0), p.wake_budget_s)
    return out


class LoraSettings(BaseModel):
    """LoRA adapters (docs/lora.md): adapters added at run time re-applied to every replica, and
    routing by where an adapter is resident (gateway/routing/adapters.py, residency.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_loras: dict[str, int] = Field(
        default={},
        description='adapters each replica of a base model holds at once (its vLLM --max-loras), '
        'JSON: {"base model": 2}; a base not listed: default_max_loras',
    )
    default_max_loras: int = Field(
        1, ge=1, description="--max-loras of a base model not in max_loras (vLLM's default)"
    )
    residency: bool = Field(
        True, description="when a base has more adapters than --max-loras, prefer replicas where "
                          "the requested adapter is resident (within a load bound)",
    )
    balance: float = Field(
        0.25, gt=0, le=10, description="bounded load: a replica holding the adapter may take up "
                                       "to (1 + balance) x the mean load",
    )
    slack: int = Field(
        1, ge=0, le=1024, description="... plus this many requests: an adapter swap costs more "
                                      "than a short queue",
    )
    load_timeout_s: float = Field(
        60.0, gt=0, description="one adapter load on one replica (vLLM reads it from the volume)"
    )

    @field_validator("max_loras")
    @classmethod
    def _positive(cls, v: dict[str, int]) -> dict[str, int]:
        bad = {k: n for k, n in v.items() if n < 1}
        if bad:
            raise ValueError(f"GATEWAY_LORA__MAX_LORAS: values must be >= 1 (got {bad})")
        return v

    def max_loras_of(self, base: str) -> int:
        return self.max_loras.get(base, self.default_max_loras)


# The admin key's shortest length: a key an attacker could enumerate is no key.
ADMIN_KEY_MIN = 16


def layouts_by_model(pools: list[PoolLayout]) -> dict[str, PoolLayout]:
    """Each served model's layout; a model served by pools of different layouts has none."""
    seen: dict[str, PoolLayout | None] = {}
    for p in pools:
        other = seen.get(p.model, p)
        same = other is not None and (other.tp, other.pp, other.nodes) == (p.tp, p.pp, p.nodes)
        seen[p.model] = p if same else None
    return {m: p for m, p in seen.items() if p is not None}


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="GATEWAY_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid")

    mode: Literal["gateway", "epp"] = Field(
        "gateway", description="gateway: serve the OpenAI API and proxy; epp: be the endpoint "
                               "picker of a Gateway API gateway (Envoy ext_proc, see --epp.*)")
    host: str = Field("0.0.0.0", description="address to listen on")
    port: int = Field(8000, ge=1, le=65535, description="port to listen on")

    discovery: Literal["static", "dns", "kubernetes", "inferencepool"] = Field(
        "static", description="how backends are found: static list, DNS A records, "
                              "EndpointSlices, or an InferencePool's selector (pods)")
    # NoDecode: the env var takes a URL, comma-separated URLs or a JSON list (_split_backends).
    backends: Annotated[list[str], NoDecode] = Field(
        default=[],
        description="static backend base URLs, e.g. http://10.0.0.7:8000; several: repeat the "
                    "flag, or comma-separated, or a JSON list")
    dns_name: str | None = Field(None, description="headless Service name (discovery=dns)")
    dns_port: int = Field(ENGINE_PORT, ge=1, le=65535, description="backend port (discovery=dns)")
    dns_interval_s: float = Field(5.0, gt=0, description="DNS re-resolution period")
    k8s_namespace: str | None = Field(
        None, description="namespace of the worker Service (discovery=kubernetes; default: own)")
    k8s_service: str | None = Field(None, description="worker Service name (discovery=kubernetes)")
    k8s_port: int = Field(
        ENGINE_PORT, ge=1, le=65535, description="backend port (discovery=kubernetes)")
    k8s_watch_timeout_s: int = Field(
        60, ge=1, description="discovery=kubernetes or inferencepool: how long one watch of the "
        "API server runs before the discovery lists again (a changed InferencePool takes effect "
        "within it)")
    k8s_retry_s: float = Field(
        2.0, gt=0, description="discovery=kubernetes or inferencepool: the wait before asking "
        "the API server again after it failed")

    routing_policy: PolicyName = Field(
        "prefix_affinity",
        description="replica selection: prefix_affinity, least_outstanding, round_robin or "
                    "kv_aware (the engines' KV cache events; needs kv.tokenizers)")
    routing_policies: dict[str, PolicyName] = Field(
        default={}, description='per model pool, JSON: {"model name": "policy"} (else the default)')
    # Defaults as (frozen) instances, not factories, so that --help shows each nested default.
    affinity: AffinitySettings = AffinitySettings()
    kv: KvSettings = KvSettings()
    health_interval_s: float = Field(2.0, gt=0, description="active /health probe period")
    eject_after_failures: int = Field(
        3, ge=1, description="consecutive request failures before a backend is ejected")
    eject_for_s: float = Field(10.0, gt=0, description="how long an ejected backend sits out")
    max_ejection_percent: int = Field(
        50, ge=0, le=100, description="most of a pool passively ejected at once (at least one)")
    retries: int = Field(
        1, ge=0, le=5, description="extra attempts on other replicas, only before the first byte")
    # Off by default: asking for token ids costs ~7% CPU per streamed request (docs/routing.md).
    stream_resumes: int = Field(
        0, ge=0, le=10,
        description="a stream broken after its first byte is resumed token-exact on another "
                    "ready replica up to this many times (docs/routing.md); 0: never, and "
                    "engines are not asked for the token ids it needs")
    retry_budget: float = Field(
        0.2, ge=0, le=1, description="retries may be at most this share of the requests of the "
                                     "last 10 s (plus retry_budget_min): a bound on retry load")
    retry_budget_min: int = Field(
        3, ge=0, description="retries allowed per 10 s whatever the traffic")
    eject_failure_rate: float = Field(
        0.3, gt=0, le=1, description="a backend whose recent requests fail at this rate (moving "
                                     "average) is ejected, unless it is the last one available")

    timeouts: Timeouts = Timeouts()
    flow: FlowSettings = FlowSettings()
    batch: BatchSettings = BatchSettings()
    edge: EdgeSettings = EdgeSettings()
    epp: EppSettings = EppSettings()
    api_keys_file: Path | None = Field(
        None, description="JSON file of API keys (sha256 hashes, limits); unset: auth off")
    admin_key: SecretStr | None = Field(
        None, description=f"the admin API's Bearer key (/admin/..., at least {ADMIN_KEY_MIN} "
                          "characters; from a Secret, as GATEWAY_ADMIN_KEY); unset, and no "
                          "admin_key_sha256: no admin API",
    )
    admin_key_sha256: str | None = Field(
        None, pattern=SHA256_HEX,
        description="the admin key's SHA-256 (hex) instead of the key itself, so the "
                    "configuration holds no working key: printf %s KEY | sha256sum",
    )
    lora: LoraSettings = LoraSettings()
    responses: ResponsesSettings = ResponsesSettings()
    max_body_bytes: int = Field(
        8 * 1024 * 1024, ge=1024, description="largest request body accepted (counted, not trusted)"
    )
    discard_body_bytes: int = Field(
        64 * 1024 * 1024, ge=0, le=1024**3,
        description="a body over max_body_bytes is read and dropped up to this many bytes before "
                    "the 413, so a client that sends its whole body before reading "
                    "(AsyncOpenAI, httpx.AsyncClient) gets the 413, not a reset connection; a "
                    "larger one is answered at once")
    drain_timeout_s: float | None = Field(
        None, ge=0, description="on SIGTERM, how long in-flight requests may finish; unset: "
        "timeouts.total_s, so a drain never cuts a request the gateway lets run (a shorter "
        "value is refused)")
    pools: list[PoolLayout] = Field(
        default=[],
        description='worker pools: layouts for llmserve_pool_info and /v1/models, and which '
        'may scale to zero, JSON: [{"name": "tp", "model": "m", "tp": 2, "pp": 1, "nodes": 1, '
        '"scale_to_zero": false, "wake_budget_s": 300}]')
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="the gateway's log level (uvicorn's access log is off)")

    @field_validator("backends", mode="before")
    @classmethod
    def _split_backends(cls, v: object) -> object:
        if not isinstance(v, str):
            return v
        text = v.strip()
        if text.startswith("["):
            try:
                return json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"{text!r} is not a JSON list ({exc}); give "
                    '\'["http://a:8000", "http://b:8000"]\' or http://a:8000,http://b:8000'
                ) from None
        return [url for url in text.split(",") if url.strip()]

    @field_validator("backends")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        out = []
        for url in v:
            url = url.strip().rstrip("/")
            if not url.startswith(("http://", "https://")):  # "http://" alone was cut to "http:"
                raise ValueError(
                    f"GATEWAY_BACKENDS: {url!r} is not a base URL like http://host:port")
            out.append(url)
        return out

    @property
    def drain_s(self) -> float:
        """How long in-flight requests get on SIGTERM: drain_timeout_s, or timeouts.total_s."""
        return self.timeouts.total_s if self.drain_timeout_s is None else self.drain_timeout_s

    @property
    def admin_digest(self) -> bytes | None:
        """The admin key's SHA-256, from whichever setting holds it; None: no admin API."""
        if self.admin_key is not None:
            return hashlib.sha256(self.admin_key.get_secret_value().encode()).digest()
        if self.admin_key_sha256 is not None:
            return bytes.fromhex(self.admin_key_sha256)
        return None

    @model_validator(mode="after")
    def _consistent(self) -> GatewaySettings:
        if self.discovery == "dns" and not self.dns_name:
            raise ValueError("GATEWAY_DNS_NAME is required when GATEWAY_DISCOVERY=dns")
        if self.discovery == "kubernetes" and not self.k8s_service:
            raise ValueError("GATEWAY_K8S_SERVICE is required when GATEWAY_DISCOVERY=kubernetes")
        if self.discovery == "inferencepool" and not self.epp.pool_name:
            raise ValueError(
                "GATEWAY_EPP__POOL_NAME is required when GATEWAY_DISCOVERY=inferencepool")
        if self.discovery == "static" and len(set(self.backends)) != len(self.backends):
            raise ValueError("GATEWAY_BACKENDS lists the same backend twice")
        if self.admin_key is not None and len(self.admin_key.get_secret_value()) < ADMIN_KEY_MIN:
            raise ValueError(f"GATEWAY_ADMIN_KEY must be at least {ADMIN_KEY_MIN} characters")
        if self.admin_key is not None and self.admin_key_sha256 is not None:
            raise ValueError("set GATEWAY_ADMIN_KEY or GATEWAY_ADMIN_KEY_SHA256, not both")
        if "kv_aware" in {self.routing_policy, *self.routing_policies.values()} \
                and not self.kv.tokenizers:
            raise ValueError("routing policy kv_aware needs GATEWAY_KV__TOKENIZERS (a "
                             "tokenizer directory per model): it scores tokens, not bytes")
        if self.drain_timeout_s is not None and self.drain_timeout_s < self.timeouts.total_s:
            raise ValueError(
                f"GATEWAY_DRAIN_TIMEOUT_S={self.drain_timeout_s:g} is shorter than "
                f"GATEWAY_TIMEOUTS__TOTAL_S={self.timeouts.total_s:g}: a drain would cut "
                "requests the gateway lets run (raise it, or lower the total)")
        if self.edge.probe_port == self.port:
            raise ValueError("GATEWAY_EDGE__PROBE_PORT must differ from GATEWAY_PORT")
        if self.mode == "epp" and self.epp.port in (self.port, self.epp.metrics_port):
            raise ValueError("GATEWAY_EPP__PORT must differ from GATEWAY_PORT and "
                             "GATEWAY_EPP__METRICS_PORT")
        names = [p.name for p in self.pools]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"GATEWAY_POOLS: pool name(s) {twice} declared twice")
        models = {p.model for p in self.pools}
        adapters = [a for p in self.pools for a in p.adapters]
        clash = sorted(set(adapters) & models)
        if clash:
            raise ValueError(
                f"GATEWAY_POOLS: adapter(s) {clash} named like a pool's model (a request for "
                "that name could mean either)")
        again = sorted({a for a in adapters if adapters.count(a) > 1})
        if again:
            raise ValueError(f"GATEWAY_POOLS: adapter(s) {again} declared by two pools")
        return self
