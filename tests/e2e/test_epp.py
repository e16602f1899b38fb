"""EPP mode on the session's real engines: a real Envoy (ext_proc, bodies FULL_DUPLEX_STREAMED,
an ORIGINAL_DST cluster keyed on x-gateway-destination-endpoint) with llmserve as its endpoint picker, in front of the stack's two vLLM-CPU replicas,
against the same replicas behind llmserve's own gateway. No engine of its own: the stack's."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from openai import OpenAI

from bench.envoy import Envoy
from devstack.stack import LocalStack
from tests.gateway.epp.conftest import RunningEpp, host_port, run_epp

pytestmark = pytest.mark.engine

QUESTIONS = ["What is the capital of France?", "Name a primary colour.", "What is 2 + 2?"]


@pytest.fixture(scope="module")
def epp(stack: LocalStack) -> Iterator[RunningEpp]:
    with run_epp(backends=stack.worker_urls, routing_policy="prefix_affinity") as e:
        yield e


@pytest.fixture(scope="module", params=["original_dst"])
def envoy(request: pytest.FixtureRequest, epp: RunningEpp, stack: LocalStack) -> Iterator[Envoy]:
    with Envoy(variant=request.param, epp_port=epp.port,
               endpoints=tuple(host_port(u) for u in stack.worker_urls)) as e:
        yield e


def client(base: str) -> OpenAI:
    return OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_the_sdk_gets_the_gateways_answers(envoy: Envoy, stack: LocalStack,
                                           model_name: str) -> None:
    """Greedy answers, whole and streamed, chat and completions: the same text and token counts
    through Envoy + EPP as through llmserve's gateway."""
    via_envoy, via_gateway = client(envoy.url), client(stack.gateway_url)
    for q in QUESTIONS:
        messages = [{"role": "user", "content": q}]
        answers = []
        for c in (via_gateway, via_envoy):
            whole = c.chat.completions.create(model=model_name, messages=messages,  # type: ignore[arg-type]
                                              temperature=0, max_tokens=24)
            chunks = list(c.chat.completions.create(
                model=model_name, messages=messages, temperature=0, max_tokens=24,  # type: ignore[arg-type]
                stream=True, stream_options={"include_usage": True}))
            streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
            usage = chunks[-1].usage
            assert usage is not None
            done = c.completions.create(model=model_name, prompt=q, temperature=0, max_tokens=12)
            answers.append((whole.choices[0].message.content, whole.usage, streamed,
                            usage.completion_tokens, done.choices[0].text))
        assert answers[1] == answers[0], q
    assert "Paris" in (client(envoy.url).chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": QUESTIONS[0]}],
        temperature=0, max_tokens=24).choices[0].message.content or "")


def test_streams_arrive_as_generated(envoy: Envoy, model_name: str) -> None:
    t0 = time.monotonic()
    arrivals = []
    for chunk in client(envoy.url).completions.create(
            model=model_name, prompt="Count to twenty:", temperature=0, max_tokens=48,
            stream=True, extra_body={"ignore_eos": True}):
        if chunk.choices and chunk.choices[0].text:
            arrivals.append(time.monotonic() - t0)
    # Token by token: the first long before the last (48 tokens take a second or more here).
    assert len(arrivals) >= 40
    assert arrivals[-1] - arrivals[0] > 0.5, arrivals
