"""The batcher through a real gateway and a fake upstream that answers multi-prompt requests."""

from __future__ import annotations

import asyncio

import httpx

from tests import loopback
from tests.gateway.conftest import UpstreamFactory, run_gateway, url_of


async def test_concurrent_completions_share_upstream_calls_and_get_their_own_answers(
    upstreams: UpstreamFactory,
) -> None:
    # Each upstream answer takes 8 x 20 ms: requests arriving meanwhile pile up behind the
    # in-flight batch, so the window opens and they leave together.
    up = upstreams(token_delay_s=0.02)
    batch = {"enabled": True, "max_size": 16, "max_delay_s": 0.05}
    with run_gateway(backends=[url_of(up)], batch=batch, flow={"enabled": False}) as gw:
        async with loopback.async_client(base_url=gw.url, timeout=30) as c:

            async def one(i: int) -> httpx.Response:
                return await c.post("/v1/completions", json={
                    "model": "demo", "prompt": f"prompt {i}", "max_tokens": 8})

            responses = await asyncio.gather(*(one(i) for i in range(24)))
        assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
        for r in responses:
            body = r.json()
            assert [ch["index"] for ch in body["choices"]] == [0]
            assert body["usage"]["completion_tokens"] == 8
            assert "token_ids" not in body["choices"][0]
        assert up.completions < 24  # coalesced
        assert gw.metric("llmserve_batch_size_sum") == 24
        assert gw.metric("llmserve_batch_size_count") == up.completions
        # Counted per client request, at the replica that answered, not once per upstream call.
        assert gw.metric(f'llmserve_requests_total{{backend="{url_of(up)}",'
                         'endpoint="/v1/completions",model="demo",status="200"}') == 24


def test_streaming_and_disabled_batching_go_straight_through(upstreams: UpstreamFactory) -> None:
    up = upstreams()
    with run_gateway(backends=[url_of(up)], flow={"enabled": False}) as gw:  # default: off
        r = loopback.post(gw.url + "/v1/completions",
                       json={"model": "demo", "prompt": "x", "max_tokens": 4})
        assert r.status_code == 200
        assert up.last_request is not None and up.last_request["prompt"] == "x"
        assert gw.metric("llmserve_batch_size_count") == 0


def test_made_up_models_through_the_batcher_mint_no_series(upstreams: UpstreamFactory) -> None:
    up = upstreams()
    batch = {"enabled": True, "max_size": 4, "max_delay_s": 0.01}
    with run_gateway(backends=[url_of(up)], batch=batch) as gw:
        for name in ("nope-1", "nope-2"):
            r = loopback.post(gw.url + "/v1/completions",
                           json={"model": name, "prompt": "x", "max_tokens": 4})
            assert r.status_code in (404, 503), r.text
        text = loopback.get(gw.url + "/metrics").text
        assert "nope" not in text
