from __future__ import annotations

from typing import get_args

import pytest
from pydantic import ValidationError

from gateway.routing.discovery.base import DiscoveryError
from gateway.routing.factory import POLICIES, build_discovery, build_router
from gateway.settings import GatewaySettings, PolicyName
from tests.waiting import settle


class NoProber:
    def __init__(self) -> None:
        self.probed: set[str] = set()  # URLs whose health was asked

    async def health(self, base_url: str) -> bool:
        self.probed.add(base_url)
        return False

    async def models(self, base_url: str) -> list[str] | None:
        return None


async def test_static_settings_build_a_router_over_the_list() -> None:
    s = GatewaySettings(backends=["http://127.0.0.1:1", "http://127.0.0.1:2"])
    prober = NoProber()
    router = build_router(s, prober)
    await router.start()
    try:
        # Discovery's first update, then a probe of each (a failed one is acted on at once).
        await settle(lambda: len(prober.probed) == 2)
        assert sorted(b.url for b in router.backends()) == ["http://127.0.0.1:1",
                                                             "http://127.0.0.1:2"]
        assert not router.ready()  # nothing answered a probe
    finally:
        await router.stop()


async def test_dns_settings_resolve_the_name() -> None:
    s = GatewaySettings(discovery="dns", dns_name="localhost", dns_port=8123)
    it = build_discovery(s).updates()
    assert "http://127.0.0.1:8123" in await anext(it)
    await it.aclose()  # type: ignore[attr-defined]


def test_the_settings_accept_exactly_the_policies_the_factory_builds() -> None:
    # One list of names: the settings refuse at start-up what the factory could not build.
    assert set(get_args(PolicyName)) == set(POLICIES)
    kv = {"tokenizers": {"m": "/models/m"}}
    for name in get_args(PolicyName):
        assert GatewaySettings(routing_policy=name, routing_policies={"m": name}, kv=kv)
    for bad in ({"routing_policy": "nope"}, {"routing_policies": {"m": "nope"}}):
        with pytest.raises(ValidationError, match="routing_polic"):
            GatewaySettings(**bad)  # type: ignore[arg-type]


def test_kubernetes_without_cluster_config_fails_at_build(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path}/absent")
    s = GatewaySettings(discovery="kubernetes", k8s_namespace="ns", k8s_service="workers")
    with pytest.raises(DiscoveryError, match="GATEWAY_DISCOVERY=kubernetes"):
        build_router(s, NoProber())


def test_policy_per_model_pool_from_settings() -> None:
    s = GatewaySettings(routing_policy="least_outstanding",
                        routing_policies={"llama": "prefix_affinity"})
    router = build_router(s, NoProber())
    # The pools' policies are made when a model first shows up; the factory hands them out.
    policy_for = router._policy_for  # the seam the factory fills
    llama, qwen = policy_for("llama"), policy_for("qwen")
    assert llama.uses_affinity and not qwen.uses_affinity
    assert policy_for("llama") is not llama  # one object per pool, each with its own state


def test_prefix_affinity_is_the_default_and_least_outstanding_one_setting_away() -> None:
    # The default changed on the issue-12 benchmark (docs/routing.md); the old one stays one
    # setting away.
    default = build_router(GatewaySettings(), NoProber())._policy_for
    old = build_router(GatewaySettings(routing_policy="least_outstanding"), NoProber())._policy_for
    assert type(default("m")).__name__ == "PrefixAffinity" and default("m").uses_affinity
    assert not old("m").uses_affinity


def test_kv_aware_without_a_tokenizer_is_refused_naming_the_setting() -> None:
    for bad in ({"routing_policy": "kv_aware"}, {"routing_policies": {"m": "kv_aware"}}):
        with pytest.raises(ValidationError, match="GATEWAY_KV__TOKENIZERS"):
            GatewaySettings(**bad)  # type: ignore[arg-type]


def test_kv_aware_without_a_subscriber_routes_by_history() -> None:
    # A router built without KV events (no kv_aware pool at start-up) cannot score on them.
    s = GatewaySettings(routing_policy="kv_aware", kv={"tokenizers": {"m": "/models/m"}})
    assert type(build_router(s, NoProber())._policy_for("m")).__name__ == "PrefixAffinity"
