"""Build the Router that GatewaySettings describe."""

from __future__ import annotations

from collections.abc import Callable

from gateway.routing.affinity import PrefixAffinity
from gateway.routing.discovery.base import Discovery
from gateway.routing.discovery.dns import Dns
from gateway.routing.discovery.static import Static
from gateway.routing.policy import LeastOutstanding, RoundRobin, RoutingPolicy
from gateway.routing.residency import Residency, ResidentFirst
from gateway.routing.retry_budget import RetryBudget
from gateway.routing.router import Router
from gateway.settings import AffinitySettings, GatewaySettings, wake_budgets
from gateway.transport.prober import HttpProber

# By name: exactly settings.PolicyName (tests/gateway/routing/test_factory.py), so every name the
# settings accept builds. Not in policy.py, which affinity.py imports.
POLICIES: dict[str, Callable[[AffinitySettings], RoutingPolicy]] = {
    "least_outstanding": lambda _: LeastOutstanding(),
    "round_robin": lambda _: RoundRobin(),
    "prefix_affinity": PrefixAffinity,
}


def build_discovery(settings: GatewaySettings) -> Discovery:
    """Raises DiscoveryError (message names the setting) when the source cannot work."""
    if settings.discovery == "dns":
        assert settings.dns_name is not None  # enforced by GatewaySettings
        return Dns(settings.dns_name, settings.dns_port, settings.dns_interval_s)
    if settings.discovery == "kubernetes":
        # Imported lazily: the kubernetes client is heavy and only this mode needs it.
        from gateway.routing.discovery.kubernetes import Kubernetes

        assert settings.k8s_service is not None  # enforced by GatewaySettings
        return Kubernetes(settings.k8s_namespace, settings.k8s_service, settings.k8s_port)
    if settings.discovery == "inferencepool":
        from gateway.routing.discovery.inferencepool import InferencePoolPods

        assert settings.epp.pool_name is not None  # enforced by GatewaySettings
        return InferencePoolPods(settings.epp.pool_namespace, settings.epp.pool_name)
    return Static(settings.backends)


def build_router(settings: GatewaySettings, prober: HttpProber,
                 residency: Residency | None = None) -> Router:
    def policy_for(model: str) -> RoutingPolicy:
        # A LoRA adapter's pool routes by residency first: the prober has told the adapter
        # registry the adapter's base before the router asks for its pool.
        name = settings.routing_policies.get(model, settings.routing_policy)
        policy = POLICIES[name](settings.affinity)
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
