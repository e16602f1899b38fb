"""The retry budget on a fake clock, and a brownout through a real gateway: one of two replicas
answers every other request with a 503."""

from __future__ import annotations

import asyncio

from gateway.routing.retry_budget import RetryBudget
from tests import loopback
from tests.gateway.conftest import UpstreamFactory, run_gateway, url_of
from tests.gateway.flow.conftest import FakeClock


def test_retries_are_a_share_of_recent_requests_plus_a_floor() -> None:
    clock = FakeClock()
    budget = RetryBudget(0.2, min_retries=3, clock=clock)
    assert [budget.try_retry() for _ in range(4)] == [True, True, True, False]  # the floor
    for _ in range(100):
        budget.request()
    granted = sum(budget.try_retry() for _ in range(100))
    assert granted == 20  # 20% of 100 requests (plus the floor of 3, already spent)
    clock.advance(5)  # half the previous window still counts
    assert not budget.try_retry()
    clock.advance(15)  # two windows on, those requests have aged out: only the new ones count
    for _ in range(10):
        budget.request()
    assert sum(budget.try_retry() for _ in range(10)) == 5  # 0.2 x 10 + 3
    clock.advance(100)
    assert sum(budget.try_retry() for _ in range(10)) == 3


async def test_brownout_retries_stay_in_budget_and_clients_succeed(
    upstreams: UpstreamFactory,
) -> None:
    good = upstreams()
    brown = upstreams(fail_status=503, fail_ratio=0.5)
    n, concurrency = 400, 8
    with run_gateway(backends=[url_of(good), url_of(brown)], retries=1,
                     flow={"enabled": False}) as gw:
        async with loopback.async_client(base_url=gw.url, timeout=30) as c:
            async def client(k: int) -> list[int]:
                out = []
                for i in range(n // concurrency):
                    body = {"model": "demo", "prompt": "hi", "max_tokens": 4,
                            "stream": (i + k) % 2 == 0}
                    r = await c.post("/v1/completions", json=body)
                    out.append(r.status_code if "error" not in r.text else 599)
                return out

            codes = [s for cl in await asyncio.gather(*(client(k) for k in range(concurrency)))
                     for s in cl]
        ok = codes.count(200)
        retries = gw.metric("llmserve_upstream_retries_total")
        assert ok / len(codes) >= 0.99, f"{ok}/{len(codes)} succeeded"
        assert retries <= 0.2 * len(codes) + 3, f"{retries:.0f} retries for {len(codes)}"
        assert brown.completions > 0  # it was tried, then (mostly) routed around


def test_the_window_is_a_constant_the_setting_states() -> None:
    """The budget's window is fixed (no caller chose another); GATEWAY_RETRY_BUDGET's help
    states it, and must follow it."""
    from gateway.routing.retry_budget import WINDOW_S
    from gateway.settings import GatewaySettings

    description = GatewaySettings.model_fields["retry_budget"].description or ""
    assert f"last {WINDOW_S:g} s" in description
    assert "window_s" not in RetryBudget.__init__.__code__.co_varnames
