"""Build the Router that GatewaySettings describe."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.routing.affinity import PrefixAffinity
from gateway.routing.discovery.base import Discovery
from gateway.routing.discovery.dns import Dns
from gateway.routing.discovery.static import Static
from gateway.routing.policy import LeastOutstanding, RoundRobin, RoutingPolicy
from gateway.routing.residency import Residency, ResidentFirst
from gateway.routing.retry_budget import RetryBudget
from gateway.routing.router import Router
from gateway.settings import GatewaySettings, wake_budgets

if TYPE_CHECKING:  # the kv extra (pyzmq, msgspec, transformers): imported only when used
    from gateway.routing.kv_events import KvEvents
    from gateway.routing.kv_prompt import PromptTokens
from gateway.transport.prober import HttpProber


class PolicyContext:
    """What a pool's policy is built from: the settings, the KV events (only with kv_aware)
    and the tokenizers loaded for it (by model)."""

    def __init__(self, settings: GatewaySettings, kv_events: KvEvents | None = None) -> None:
        self.settings = settings
        self.kv_events = kv_events
        self._tokens: dict[str, PromptTokens | None] = {}

    def tokens(self, model: str) -> PromptTokens | None:
        """`model`'s tokenizer (loaded once: seconds, so at start-up, see load_tokenizers)."""
        if model not in self._tokens:
            from gateway.routing.kv_prompt import PromptTokens

            directory = self.settings.kv.tokenizers.get(model)
            self._tokens[model] = PromptTokens(directory) if directory is not None else None
        return self._tokens[model]

    def load_tokenizers(self) -> None:
        for model in self.settings.kv.tokenizers:
            self.tokens(model)


def _kv_aware(ctx: PolicyContext, model: str) -> RoutingPolicy:
    s = ctx.settings
    if ctx.kv_events is None:  # no subscriber (a router built without one): history only
        return PrefixAffinity(s.affinity)
    from gateway.routing.kv_aware import KvAware

    return KvAware(s.affinity, s.kv, ctx.kv_events, ctx.tokens(model))


# By name: exactly settings.PolicyName (tests/gateway/routing/test_factory.py), so every name the
# settings accept builds. Not in policy.py, which affinity.py imports.
POLICIES: dict[str, Callable[[PolicyContext, str], RoutingPolicy]] = {
    "least_outstanding": lambda _, __: LeastOutstanding(),
    "round_robin": lambda _, __: RoundRobin(),
    "prefix_affinity": lambda ctx, _: PrefixAffinity(ctx.settings.affinity),
    "kv_aware": _kv_aware,
}


def uses_kv_events(settings: GatewaySettings) -> bool:
    """Some pool routes on KV events: the gateway subscribes to the replicas' publishers."""
    return "kv_aware" in {settings.routing_policy, *settings.routing_policies.values()}


def build_discovery(settings: GatewaySettings) -> Discovery:
    """Raises DiscoveryError (message names the setting) when the source cannot work."""
    if settings.discovery == "dns":
        assert settings.dns_name is not None  # enforced by GatewaySettings
        return Dns(settings.dns_name, settings.dns_port, settings.dns_interval_s)
    if settings.discovery == "kubernetes":
        # Imported lazily: the kubernetes client is heavy and only this mode needs it.
        from gateway.routing.discovery.kubernetes import Kubernetes

        assert settings.k8s_service is not None  # enforced by GatewaySettings
        return Kubernetes(settings.k8s_namespace, settings.k8s_service, settings.k8s_port,
                          watch_timeout_s=settings.k8s_watch_timeout_s,
                          retry_s=settings.k8s_retry_s)
    if settings.discovery == "inferencepool":
        from gateway.routing.discovery.inferencepool import InferencePoolPods

        assert settings.epp.pool_name is not None  # enforced by GatewaySettings
        return InferencePoolPods(settings.epp.pool_namespace, settings.epp.pool_name,
                                 watch_timeout_s=settings.k8s_watch_timeout_s,
                                 retry_s=settings.k8s_retry_s)
    return Static(settings.backends)


def build_router(settings: GatewaySettings, prober: HttpProber,
                 residency: Residency | None = None, kv_events: KvEvents | None = None) -> Router:
    ctx = PolicyContext(settings, kv_events)
    if kv_events is not None:
        ctx.load_tokenizers()  # now, not on the event loop at a pool's first request

    def policy_for(model: str) -> RoutingPolicy:
        # A LoRA adapter's pool routes by residency first: the prober has told the adapter
        # registry the adapter's base before the router asks for its pool.
        name = settings.routing_policies.get(model, settings.routing_policy)
        policy = POLICIES[name](ctx, model)
        if residency is not None and residency.adapters.parent_of(model) is not None:
            return ResidentFirst(policy, residency)
        return policy

    return Router(
        build_discovery(settings),
        prober,
        policy_for,
        health_interval_s=settings.health_interval_s,
        eject_after_failures=settings.eject_after_failures,
        eject_for_s=settings.eject_for_s,
        eject_failure_rate=settings.eject_failure_rate,
        retry_budget=RetryBudget(settings.retry_budget, settings.retry_budget_min),
        max_ejection_percent=settings.max_ejection_percent,
        # Known without a replica: their pools may be at zero (gateway/routing/wake.py).
        standby=wake_budgets(settings.pools),
        # Known before their first replica: 503, not 404 (a pool still starting, or parked).
        declared=[p.model for p in settings.pools])
