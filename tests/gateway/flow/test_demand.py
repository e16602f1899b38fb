"""The scaling signal through a real gateway: a running pool's demand is its queue plus its
requests in flight, listed at 0 before any request, and back to 0 when the load ends."""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.autoscaler import pool_gauge, sample_value
from tests.gateway.conftest import UpstreamFactory, run_gateway, url_of

STREAM = {"model": "demo", "prompt": "hi", "max_tokens": 2, "stream": True}


async def test_demand_is_queue_plus_in_flight_per_ready_replica(upstreams: UpstreamFactory) -> None:
    # Slow first tokens hold the slots. A limit of 2 admits two at once; slow start's promise
    # queues as many more as are in flight (flow/admission.py), and refuses the rest.
    up = upstreams(first_token_delay_s=1.5, tokens=2)
    flow = {"initial_limit": 2, "min_limit": 1}
    with run_gateway(backends=[url_of(up)], flow=flow) as gw:
        assert pool_gauge(gw.url, "llmserve_pool_demand", "demo") == 0  # listed before any request
        assert pool_gauge(gw.url, "llmserve_pool_ready_replicas", "demo") == 1
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
            tasks = [asyncio.create_task(client.post("/v1/completions", json=STREAM))
                     for _ in range(6)]
            deadline = time.monotonic() + 1.0
            while sample_value(gw.url, "llmserve_queue_depth", pool="demo") != 2:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            in_flight = sample_value(gw.url, "llmserve_admitted_in_flight", pool="demo")
            assert in_flight == 2
            assert pool_gauge(gw.url, "llmserve_pool_demand", "demo") == 4
            statuses = sorted(r.status_code for r in await asyncio.gather(*tasks))
        # The two admitted at once are served; what the door refused, at once or at its queue
        # deadline, left the signal when it was told to come back later.
        assert statuses[:2] == [200, 200] and set(statuses) <= {200, 503}
        assert pool_gauge(gw.url, "llmserve_pool_demand", "demo") == 0
