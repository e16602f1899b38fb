"""Per-tenant state: limits, queue weight and priority bounds, usage counters (cached children)."""

from __future__ import annotations

from collections.abc import Callable
from time import monotonic

from gateway.flow.buckets import KeyLimits
from gateway.flow.keys import PRIORITY_CLASS, ApiKey
from gateway.flow.shared_limits import SharedLimits
from gateway.metrics import GatewayMetrics

ANONYMOUS = "anonymous"  # the one tenant when auth is off
PRIORITY_HEADER = b"x-llmserve-priority"


class Tenant:
    __slots__ = ("_input", "_output", "_requests", "default_cls", "limits", "min_cls", "name",
                 "rpm", "shared", "tpm", "weight")

    def __init__(
        self, name: str, limits: KeyLimits, weight: float, default_cls: int, min_cls: int,
        metrics: GatewayMetrics, shared: SharedLimits | None = None,
        rpm: float | None = None, tpm: float | None = None,
    ) -> None:
        self.name = name
        self.limits = limits
        # With Redis, the limits live there (shared by every replica) and `limits` stays unlimited.
        self.shared = shared if (rpm or tpm) else None
        self.rpm = rpm
        self.tpm = tpm
        self.weight = weight
        self.default_cls = default_cls
        # The most urgent class this tenant may ask for (lower is more urgent).
        self.min_cls = min_cls
        # Label children resolved once per tenant, not per request.
        self._requests = metrics.tenant_requests.labels(name)
        self._input = metrics.tenant_tokens.labels(name, "input")
        self._output = metrics.tenant_tokens.labels(name, "output")

    def priority_class(self, headers: list[tuple[bytes, bytes]]) -> int:
        for k, v in headers:
            if k == PRIORITY_HEADER:
                cls = PRIORITY_CLASS.get(v.decode("latin-1").strip().lower())
                if cls is not None:
                    return max(cls, self.min_cls)
                break
        return self.default_cls

    def admitted(self) -> None:
        self._requests.inc()

    def refund(self) -> None:
        """Give the request back: it was charged, then refused further on (queue full)."""
        if self.shared is not None:
            self.shared.refund(self.name, self.rpm)
        else:
            self.limits.refund()

    def used(self, prompt_tokens: int, completion_tokens: int) -> None:
        if prompt_tokens:
            self._input.inc(prompt_tokens)
        if completion_tokens:
            self._output.inc(completion_tokens)
        if self.shared is not None:
            self.shared.debit(self.name, self.tpm, prompt_tokens + completion_tokens)
        else:
            self.limits.used(prompt_tokens + completion_tokens)


class Tenants:
    """Tenant objects by name, built on first use (keys are known up front; one when auth is off)."""

    def __init__(
        self, metrics: GatewayMetrics, default_priority: str,
        clock: Callable[[], float] = monotonic, *, shared: SharedLimits | None = None,
        replicas: int = 1,
    ) -> None:
        self._metrics = metrics
        self._default_cls = PRIORITY_CLASS[default_priority]
        self._clock = clock
        self._shared = shared
        # Without a shared store, N replicas each enforce 1/N of a key's limits.
        self._share = 1.0 / replicas
        self._by_name: dict[str, Tenant] = {}
        self.anonymous = Tenant(ANONYMOUS, KeyLimits(None, None), 1.0, self._default_cls, 0,
                                metrics)

    def for_key(self, key: ApiKey | None) -> Tenant:
        if key is None:
            return self.anonymous
        t = self._by_name.get(key.tenant)
        if t is None:
            default = PRIORITY_CLASS[key.priority] if key.priority else self._default_cls
            ceiling = PRIORITY_CLASS[key.max_priority] if key.max_priority else default
            if self._shared is not None:
                limits = KeyLimits(None, None)
            else:
                limits = KeyLimits(key.rpm and key.rpm * self._share,
                                   key.tpm and key.tpm * self._share, self._clock)
            t = Tenant(key.tenant, limits, key.weight, default, min(ceiling, default),
                       self._metrics, self._shared, key.rpm, key.tpm)
            self._by_name[key.tenant] = t
        return t
