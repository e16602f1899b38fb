from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest

from gateway.flow.batcher import Batcher, batch_key, split
from gateway.metrics import GatewayMetrics
from gateway.settings import BatchSettings
from tests.test_import_cycles import REPO, import_graph


class FakeEngine:
    """A vLLM-shaped /v1/completions: a list of prompts gives one choice per prompt, in order."""

    def __init__(self, latency_s: float = 0.0, bad_word: str | None = None,
                 token_ids: bool = True) -> None:
        self.calls: list[dict[str, Any]] = []
        self.latency_s = latency_s
        self.bad_word = bad_word
        self.token_ids = token_ids

    async def __call__(self, model: str, body: bytes) -> tuple[int, bytes, str]:
        req = orjson.loads(body)
        self.calls.append(req)
        await asyncio.sleep(self.latency_s)
        prompts = req["prompt"] if isinstance(req["prompt"], list) else [req["prompt"]]
        if self.bad_word and any(self.bad_word in p for p in prompts):
            return (400, b'{"error":{"message":"bad prompt","type":"BadRequestError","code":400}}',
                    "http://replica")
        choices = []
        for i, p in enumerate(prompts):
            c: dict[str, Any] = {"index": i, "text": p.upper() * 2, "finish_reason": "length"}
            if req.get("return_token_ids") and self.token_ids:
                c["prompt_token_ids"] = list(range(len(p)))
                c["token_ids"] = list(range(2 * len(p)))
            choices.append(c)
        pt = sum(len(p) for p in prompts)
        return 200, orjson.dumps({"id": "cmpl-x", "object": "text_completion", "created": 1,
                                  "model": model, "choices": choices,
                                  "usage": {"prompt_tokens": pt, "completion_tokens": 2 * pt,
                                            "total_tokens": 3 * pt}}), "http://replica"


def make(engine: FakeEngine, queued: int = 0, **kw: Any) -> Batcher:
    return Batcher(BatchSettings(**kw), GatewayMetrics(), engine, queued=lambda _: queued)


def req(prompt: str, **extra: Any) -> dict[str, Any]:
    return {"model": "demo", "prompt": prompt, "max_tokens": 8, **extra}


def test_key_groups_only_compatible_requests() -> None:
    assert batch_key(req("a")) == batch_key(req("b"))
    assert batch_key(req("a")) != batch_key(req("a", temperature=0.5))
    assert batch_key(req("a", stream=True)) is None
    assert batch_key(req("a", n=2)) is None
    assert batch_key({"model": "demo", "prompt": ["a", "b"]}) is None


async def test_same_instant_requests_share_one_call_and_split_exactly() -> None:
    engine = FakeEngine()
    b = make(engine)
    prompts = ["a", "bb", "ccc"]
    results = await asyncio.gather(*(b.submit("demo", req(p), batch_key(req(p)) or b"")
                                     for p in prompts))
    assert len(engine.calls) == 1 and engine.calls[0]["prompt"] == prompts
    for p, r in zip(prompts, results, strict=True):
        obj = orjson.loads(r.body)
        assert r.status == 200 and len(obj["choices"]) == 1
        c = obj["choices"][0]
        assert c["index"] == 0 and c["text"] == p.upper() * 2
        assert "token_ids" not in c and "prompt_token_ids" not in c  # we asked, we strip
        assert obj["usage"] == {"prompt_tokens": len(p), "completion_tokens": 2 * len(p),
                                "total_tokens": 3 * len(p)}
        assert r.usage == (len(p), 2 * len(p))
    assert len({orjson.loads(r.body)["id"] for r in results}) == 3


def test_split_without_token_ids_is_proportional() -> None:
    raw = orjson.dumps({"id": "x", "choices": [{"index": 1, "text": "bbbb"},
                                               {"index": 0, "text": "aa"}],
                        "usage": {"prompt_tokens": 30, "completion_tokens": 6}})
    a, b = split(raw, ["p" * 10, "p" * 20], keep_token_ids=False)
    assert a.usage == (10, 2)
    assert b.usage == (20, 4)
    assert orjson.loads(b.body)["choices"][0]["text"] == "bbbb"


async def test_idle_adds_no_window_and_single_request_is_sent_as_is() -> None:
    engine = FakeEngine()
    b = make(engine, max_delay_s=1.0)
    t0 = time.perf_counter()
    r = await b.submit("demo", req("solo"), batch_key(req("solo")) or b"")
    # Well under the 1 s window it would have waited (`bench.gateway_overhead --flow` times it).
    assert time.perf_counter() - t0 < 0.5
    assert engine.calls == [req("solo")]  # untouched: no list, no return_token_ids
    assert r.status == 200 and r.usage == (4, 8)


async def test_window_grows_with_load_and_max_size_flushes_at_once() -> None:
    engine = FakeEngine()
    b = make(engine, queued=8, max_size=4, max_delay_s=1.0)
    assert b.window("demo") == pytest.approx(1.0)  # 8 queued >= max_size: the full window
    assert make(engine, queued=2, max_size=4, max_delay_s=1.0).window("demo") == pytest.approx(0.5)
    t0 = time.perf_counter()
    results = await asyncio.gather(*(b.submit("demo", req(str(i)), batch_key(req("x")) or b"")
                                     for i in range(4)))
    assert time.perf_counter() - t0 < 0.5  # full batch left without waiting the 1 s window
    assert len(engine.calls) == 1 and all(r.status == 200 for r in results)


async def test_one_bad_prompt_does_not_fail_its_companions() -> None:
    engine = FakeEngine(bad_word="BOOM")
    b = make(engine)
    prompts = ["fine", "BOOM", "also fine"]
    results = await asyncio.gather(*(b.submit("demo", req(p), batch_key(req(p)) or b"")
                                     for p in prompts))
    assert [r.status for r in results] == [200, 400, 200]
    assert len(engine.calls) == 4  # the batch, then each member alone


async def test_a_member_that_leaves_does_not_cancel_the_batch() -> None:
    engine = FakeEngine(latency_s=0.05)
    b = make(engine)
    key = batch_key(req("x")) or b""
    leaver = asyncio.create_task(b.submit("demo", req("gone"), key))
    stayer = asyncio.create_task(b.submit("demo", req("stay"), key))
    await asyncio.sleep(0.01)
    leaver.cancel()
    r = await stayer
    assert r.status == 200 and orjson.loads(r.body)["choices"][0]["text"] == "STAYSTAY"
    with pytest.raises(asyncio.CancelledError):
        await leaver


def test_the_batcher_lives_in_its_module_and_the_proxys_glue() -> None:
    """The batcher (flow/batcher.py) is reached from one module of the proxy, api/batched.py
    (which requests, the upstream call, each member's answer); ProxyDeps only holds it."""
    graph = import_graph(REPO, ("gateway",))
    users = {m for m, imported in graph.items() if "gateway.flow.batcher" in imported}
    assert users == {"gateway.api.batched", "gateway.api.deps"}
