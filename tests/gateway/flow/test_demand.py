"""The scaling signal: a pool's demand is its requests waiting for a replica (pool at zero), queued
at the door and in flight; listed at 0 before any request, back to 0 when the load ends."""

from __future__ import annotations

import asyncio
import contextlib
import time

from gateway.flow.admission import Admission
from gateway.flow.demand import Demand
from gateway.metrics import GatewayMetrics
from gateway.routing.discovery.static import Static
from gateway.routing.policy import LeastOutstanding
from gateway.routing.router import Router
from gateway.routing.wake import WakeGate
from gateway.settings import FlowSettings
from tests import loopback
from tests.autoscaler import pool_gauge, sample_value
from tests.gateway.conftest import UpstreamFactory, run_gateway, url_of

STREAM = {"model": "demo", "prompt": "hi", "max_tokens": 2, "stream": True}


class NoProbes:
    async def health(self, base_url: str) -> bool:
        raise AssertionError("not started: nothing is probed")

    async def models(self, base_url: str) -> list[str] | None:
        raise AssertionError("not started: nothing is probed")


async def test_demand_sums_the_wake_gate_the_queue_and_the_requests_in_flight() -> None:
    metrics = GatewayMetrics()
    # A fixed clock: slow start, and no first token overdue, so the door queues the second
    # request on its promise rather than refusing it.
    admission = Admission(FlowSettings(initial_limit=1, min_limit=1), metrics, clock=lambda: 50.0)
    router = Router(Static([]), NoProbes(), lambda _: LeastOutstanding(), health_interval_s=3600,
                    eject_after_failures=1, eject_for_s=1, standby=["asleep"])
    wake = WakeGate({"asleep": 60.0}, router, metrics)
    demand = Demand(router, admission, wake)
    assert list(demand.view()) == [("asleep", 0, 0)]  # declared: listed before any request

    pool = admission.pool("busy")
    tenant = admission.tenants.for_key(None)
    assert pool.try_acquire(tenant.name, tenant.weight)  # one in flight
    queued = asyncio.create_task(pool.acquire(tenant, tenant.priority_class([])))
    waiting = asyncio.create_task(wake.wait("asleep"))
    await asyncio.sleep(0)
    try:
        assert (len(pool.queue), pool.in_flight, wake.waiting("asleep")) == (1, 1, 1)
        assert list(demand.view()) == [("asleep", 1, 0), ("busy", 2, 0)]
    finally:
        for task in (queued, waiting):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert list(demand.view()) == [("asleep", 0, 0), ("busy", 1, 0)]


async def test_a_running_pools_demand_through_a_gateway(upstreams: UpstreamFactory) -> None:
    up = upstreams(first_token_delay_s=0.5, tokens=2)  # slow first tokens hold the slots
    with run_gateway(backends=[url_of(up)]) as gw:
        assert pool_gauge(gw.url, "llmserve_pool_demand", "demo") == 0  # before any request
        assert pool_gauge(gw.url, "llmserve_pool_ready_replicas", "demo") == 1
        async with loopback.async_client(base_url=gw.url, timeout=30) as client:
            tasks = [asyncio.create_task(client.post("/v1/completions", json=STREAM))
                     for _ in range(3)]
            deadline = time.monotonic() + 5
            while pool_gauge(gw.url, "llmserve_pool_demand", "demo") != 3:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            assert sample_value(gw.url, "llmserve_admitted_in_flight", pool="demo") == 3
            assert [r.status_code for r in await asyncio.gather(*tasks)] == [200] * 3
        assert pool_gauge(gw.url, "llmserve_pool_demand", "demo") == 0
