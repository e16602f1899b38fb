"""A burst far above what the real engines take at once: admitted requests are served, the rest
are refused at once with Retry-After and OpenAI's error shape (the figures: bench/flow_engine.py)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from devstack.stack import LocalStack
from tests.e2e.test_errors_and_disconnect import assert_openai_error

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
        async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=120,
                                     limits=limits) as c:
            return await asyncio.gather(*(one(c) for _ in range(160)))

    results = asyncio.run(burst())
    statuses = [s for s, _, _ in results]
    assert set(statuses) <= {200, 503}, statuses
    # The pool's limit starts at 32 with a short queue: most of 160 at once must be refused ...
    assert 16 <= statuses.count(200) < 160 and statuses.count(503) > 0, statuses
    refusals = []
    for status, elapsed, r in results:
        if status == 200:
            assert b"data: [DONE]" in r.content
        else:
            assert_openai_error(r, 503, "overloaded")
            assert float(r.headers["retry-after"]) >= 1
            refusals.append(elapsed)
    # Refused at the door, not after a wait in the queue (the local stack's queue timeout is 5 s).
    # Timed by this client, which opens 160 connections at once on 2 cores the engines keep busy,
    # so the bounds are loose; bench/flow_overhead.py times the gateway's own path (~0.2 ms).
    refusals.sort()
    assert refusals[len(refusals) // 2] < 1.0 and refusals[-1] < 5.0, refusals
