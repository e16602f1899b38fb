"""A burst far above what the real engines take at once: admitted requests are served, the rest
are refused at once with Retry-After and OpenAI's error shape (the figures: bench/flow_engine.py)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from devstack.stack import LocalStack
from tests import loopback
from tests.openai_error import assert_openai_error
from tests.waiting import scrape

pytestmark = pytest.mark.engine


def test_a_burst_gets_200s_and_fast_503s_only(stack: LocalStack, model_name: str) -> None:
    async def one(c: httpx.AsyncClient) -> tuple[int, float, httpx.Response]:
        t0 = time.perf_counter()
        r = await c.post("/v1/chat/completions", json={
            "model": model_name, "max_tokens": 8, "stream": True,
            "messages": [{"role": "user", "content": "Say hi."}]})
        return r.status_code, time.perf_counter() - t0, r

    async def burst() -> list[tuple[int, float, httpx.Response]]:
        limits = httpx.Limits(max_connections=None)
        async with loopback.async_client(base_url=stack.gateway_url, timeout=120,
                                     limits=limits) as c:
            return await asyncio.gather(*(one(c) for _ in range(160)))

    def refusals_by_reason() -> dict[str, float]:
        m = scrape(stack.gateway_url)
        return {reason: sum(v for k, v in m.items() if k.startswith("llmserve_rejections_total{")
                            and f'reason="{reason}"' in k)
                for reason in ("queue_full", "queue_wait", "queue_timeout")}

    before = refusals_by_reason()
    results = asyncio.run(burst())
    after = refusals_by_reason()
    counted = {r: after[r] - before[r] for r in after}
    statuses = [s for s, _, _ in results]
    assert set(statuses) <= {200, 503}, statuses
    # The pool's limit starts low and queues most of a doubling: most of 160 at once are refused
    assert 16 <= statuses.count(200) < 160 and statuses.count(503) > 0, statuses
    refusals, served = [], []
    for status, elapsed, r in results:
        if status == 200:
            assert b"data: [DONE]" in r.content
            served.append(elapsed)
        else:
            assert_openai_error(r, 503, "overloaded")
            assert float(r.headers["retry-after"]) >= 1
            refusals.append(elapsed)
    # Every 503 is counted by its reason. Most were decided at the door (queue full, or a wait
    # longer than the queue timeout); the others waited on slow start's promise (most of a round
    # trip's growth: PROMISE per request in flight) and were refused once the first tokens showed
    # the engines full.
    assert sum(counted.values()) == len(refusals), (counted, len(refusals))
    assert counted["queue_timeout"] < counted["queue_wait"] + counted["queue_full"], counted
    # Wall-clock bounds do not belong here: this client opens 160 connections at once on 2 cores
    # that the engines keep busy, and one CI run saw every answer, 503 or not, take >= 0.88 s.
    # Side by side in the same run, though, the typical refusal must come back before the typical
    # admitted stream has finished. The gateway's own refusal time: bench.gateway_overhead --flow.
    refusals.sort()
    served.sort()
    assert refusals[len(refusals) // 2] < served[len(served) // 2], (refusals, served)
