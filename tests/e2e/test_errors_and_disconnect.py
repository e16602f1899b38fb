"""Error shapes and client disconnects against the real engines."""

from __future__ import annotations

import asyncio
import time

import pytest

from devstack.stack import LocalStack
from tests import loopback
from tests.openai_error import assert_openai_error
from tests.waiting import metric_sum, scrape

pytestmark = pytest.mark.engine


def test_unknown_model_is_404(stack: LocalStack) -> None:
    r = loopback.post(stack.gateway_url + "/v1/chat/completions",
                   json={"model": "nope", "messages": [{"role": "user", "content": "hi"}]})
    assert_openai_error(r, 404, "model_not_found")


def test_malformed_json_and_wrong_types_are_400(stack: LocalStack, model_name: str) -> None:
    # The engine judges them (the gateway forwards what it cannot read); its 400 is relayed
    # (tests/e2e/test_differential.py compares it with the engine's own, byte for byte).
    url = stack.gateway_url + "/v1/chat/completions"
    r = loopback.post(url, content=b'{"model": ', headers={"content-type": "application/json"})
    assert_openai_error(r, 400)
    r = loopback.post(url, json={"model": model_name, "messages": "hi"})
    assert_openai_error(r, 400)
    r = loopback.post(url, json={"model": model_name, "messages": [{"role": "user", "content": "x"}],
                              "max_tokens": "ten"})
    assert assert_openai_error(r, 400)["code"] == 400


def test_engine_side_validation_error_keeps_openai_shape(stack: LocalStack,
                                                         model_name: str) -> None:
    # The engine, not the gateway, rejects this (longer than the model's context).
    r = loopback.post(stack.gateway_url + "/v1/completions",
                   json={"model": model_name, "prompt": "hi", "max_tokens": 10_000_000})
    assert_openai_error(r, 400)


def test_oversized_body_is_413(stack: LocalStack, model_name: str) -> None:
    big = "x" * (9 * 1024 * 1024)
    r = loopback.post(stack.gateway_url + "/v1/completions",
                   json={"model": model_name, "prompt": big}, timeout=30)
    assert_openai_error(r, 413, "payload_too_large")
    # Still alive and serving afterwards.
    assert loopback.get(stack.gateway_url + "/health").status_code == 200


def running(stack: LocalStack) -> float:
    return sum(metric_sum(scrape(u), "vllm:num_requests_running") for u in stack.worker_urls)


def wait_running(stack: LocalStack, pred, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while True:
        n = running(stack)
        if pred(n) or time.monotonic() > deadline:
            return n
        time.sleep(0.05)


def test_disconnect_mid_stream_aborts_generation(stack: LocalStack, model_name: str) -> None:
    async def run() -> None:
        async with loopback.async_client(timeout=60) as client, client.stream(
            "POST", stack.gateway_url + "/v1/completions",
            json={"model": model_name, "prompt": "Tell me a very long story.",
                  "max_tokens": 1500, "stream": True, "ignore_eos": True},
        ) as resp:
            assert resp.status_code == 200
            # Hold the iterator: an abandoned async generator is closed by the event loop, and
            # httpx then closes the response, i.e. disconnects before we mean to.
            chunks = resp.aiter_bytes()
            seen: list[bytes] = []
            async for chunk in chunks:
                seen.append(chunk)
                if len(seen) >= 3:
                    break
            # The stream must still be flowing (not ended early with an error event) ...
            assert len(seen) >= 3 and b"[DONE]" not in b"".join(seen), seen
            # ... and the engine must report it: its gauge follows the engine's steps, which can
            # trail the tokens we already hold, so poll briefly (off the event loop).
            n = await asyncio.to_thread(wait_running, stack, lambda n: n >= 1, 5.0)
            assert n >= 1, "the engines report no running request while the stream flows"
        # Leaving the block closes the connection mid-stream.

    asyncio.run(run())
    t0 = time.monotonic()
    left = wait_running(stack, lambda n: n == 0, timeout=2.0)
    assert left == 0, f"engines still running {left} requests {time.monotonic() - t0:.2f}s after disconnect"
