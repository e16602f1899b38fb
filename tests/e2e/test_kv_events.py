"""The real engines' KV cache events against the gateway's subscriber, hasher and tokenizer:
what the gateway computes for a prompt is what the engine that served it says it cached.

It needs both workers up: it runs before test_zz_replica_failure.py, which kills worker 1 for the
rest of the session (after that, worker 1's publisher is gone and its index stays stale). It
also starts the session's KvWatch, which test_zy_kv_restart.py reads after test_rolling_restart.py.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import orjson
import pytest

from devstack.stack import LocalStack
from gateway.routing.kv_events import KvEvents
from gateway.routing.kv_hash import BlockHasher
from gateway.routing.kv_index import ReplicaIndex
from gateway.routing.kv_prompt import PromptTokens
from gateway.settings import KvSettings
from tests import loopback

pytestmark = pytest.mark.engine


async def until(predicate: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < end, f"not reached in {timeout_s:.0f} s: {what}"
        await asyncio.sleep(0.05)


async def nudged(predicate: Callable[[], bool], url: str, model_name: str, what: str,
                 timeout_s: float = 60.0, first_s: float = 2.0) -> None:
    """Wait for `predicate`; after `first_s`, then every 2 s, that it does not hold, send `url`
    a small completion of a fresh prompt. ZMQ drops what the engine publishes before a new
    subscription reached it, which no fixed wait rules out on a loaded machine; the batch of a
    later step makes the subscriber replay what it missed from the engine's buffer
    (gateway/routing/kv_events.py)."""
    end = time.monotonic() + timeout_s
    wait_s = first_s
    while True:
        nudge = time.monotonic() + wait_s
        wait_s = 2.0
        while time.monotonic() < nudge:
            if predicate():
                return
            assert time.monotonic() < end, f"not reached in {timeout_s:.0f} s: {what}"
            await asyncio.sleep(0.05)
        async with loopback.async_client(timeout=120) as c:
            r = await c.post(url + "/v1/completions", json={
                "model": model_name, "prompt": f"[{uuid.uuid4()}] " + "Hello there. " * 60,
                "max_tokens": 1})
            assert r.status_code == 200, r.text


@pytest.mark.usefixtures("kv_watch")
async def test_the_engines_events_build_the_index_the_gateway_scores_on(
        stack: LocalStack, model_name: str) -> None:
    settings = KvSettings(endpoints=stack.kv_endpoints())
    events = KvEvents(settings)
    events.follow(stack.worker_urls)
    late: KvEvents | None = None
    try:
        idx = [events.indexes[u] for u in stack.worker_urls]
        await until(lambda: not any(i.stale for i in idx),
                    "every worker's publisher connected (are both workers up?)")
        # A fresh prompt of several blocks (128 tokens on the CPU), to worker 0 alone.
        messages = [{"role": "system", "content": f"[{uuid.uuid4()}] You are a careful "
                     "assistant. " + "The river runs past the mountain garden. " * 60},
                    {"role": "user", "content": "What is the capital of France?"}]
        async with loopback.async_client(timeout=120) as c:
            r = await c.post(stack.worker_urls[0] + "/v1/chat/completions", json={
                "model": model_name, "messages": messages, "max_tokens": 4, "temperature": 0})
            assert r.status_code == 200, r.text
            prompt_tokens = r.json()["usage"]["prompt_tokens"]
            tk = await c.post(stack.worker_urls[0] + "/tokenize", json={
                "model": model_name, "messages": messages, "add_generation_prompt": True})
        tokens = PromptTokens(stack.model_dir).tokens(orjson.dumps(messages))
        assert tokens is not None
        # The gateway's tokens are the engine's, so its block hashes can be.
        assert tokens == tk.json()["tokens"] and len(tokens) == prompt_tokens
        await nudged(lambda: idx[0].block_size is not None and len(idx[0].blocks) > 0,
                     stack.worker_urls[0], model_name, "worker 0's first BlockStored")
        size = idx[0].block_size
        assert size is not None
        hashes = BlockHasher(settings.hash_algo, settings.hash_seed).hashes(tokens, size, 512)
        assert len(hashes) == prompt_tokens // size >= 3
        await until(lambda: idx[0].matched(hashes) == len(hashes),
                    "worker 0's events name every block of the prompt as the gateway hashes it")
        assert idx[1].matched(hashes) == 0
        # A gateway replica that starts later learns the same from the engine's replay socket.
        late = KvEvents(settings)
        late.follow(stack.worker_urls[:1])
        late_idx: ReplicaIndex = late.indexes[stack.worker_urls[0]]
        await until(lambda: not late_idx.stale, "the late subscriber connected")
        # It learns of them at its first batch (a gap from 0): nudged() sends those batches.
        await nudged(lambda: late_idx.matched(hashes) == len(hashes), stack.worker_urls[0],
                     model_name, "the late subscriber replayed the blocks stored before it joined",
                     first_s=0)
        # Worker 1 holds blocks too, for test_zy_kv_restart.py: its restart must drop them.
        async with loopback.async_client(timeout=120) as c:
            r = await c.post(stack.worker_urls[1] + "/v1/completions", json={
                "model": model_name, "prompt": f"[{uuid.uuid4()}] " + "Good morning. " * 90,
                "max_tokens": 2})
            assert r.status_code == 200, r.text
        await nudged(lambda: len(idx[1].blocks) > 0, stack.worker_urls[1], model_name,
                     "worker 1's first BlockStored")
    finally:
        await events.close()
        if late is not None:
            await late.close()
