"""The acceptance path: the official OpenAI SDK against the gateway and 2 real vLLM-CPU replicas."""

from __future__ import annotations

import pytest
from openai import OpenAI

from devstack.stack import LocalStack
from tests.waiting import metric_sum, scrape

pytestmark = pytest.mark.engine

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(stack: LocalStack) -> OpenAI:
    return OpenAI(base_url=stack.gateway_url + "/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_model(client: OpenAI, model_name: str) -> None:
    assert [m.id for m in client.models.list().data] == [model_name]


def test_chat_answers_paris(client: OpenAI, model_name: str) -> None:
    r = client.chat.completions.create(model=model_name, messages=QUESTION, temperature=0,
                                       max_tokens=32)
    assert "Paris" in (r.choices[0].message.content or "")
    assert r.usage is not None and r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0


def test_chat_stream_answers_paris_without_usage_chunk(client: OpenAI, model_name: str) -> None:
    # The gateway asks upstream for usage on its own account; the client did not ask, so it must
    # not see the usage-only chunk.
    chunks = list(client.chat.completions.create(
        model=model_name, messages=QUESTION, temperature=0, max_tokens=32, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)


def test_chat_stream_with_include_usage(client: OpenAI, model_name: str) -> None:
    chunks = list(client.chat.completions.create(
        model=model_name, messages=QUESTION, temperature=0, max_tokens=32, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    content_chunks = sum(1 for c in chunks if c.choices and c.choices[0].delta.content)
    # A token can yield an empty delta (a partial UTF-8 sequence), never the reverse.
    assert last.usage.completion_tokens >= content_chunks > 0


def test_completions_stream_and_not(client: OpenAI, model_name: str) -> None:
    r = client.completions.create(model=model_name, prompt="The capital of France is",
                                  temperature=0, max_tokens=8)
    assert "Paris" in r.choices[0].text
    chunks = list(client.completions.create(model=model_name, prompt="The capital of France is",
                                            temperature=0, max_tokens=8, stream=True))
    assert "Paris" in "".join(c.choices[0].text for c in chunks if c.choices)


def test_gateway_counts_tokens_and_ttft(client: OpenAI, model_name: str, stack: LocalStack) -> None:
    before = scrape(stack.gateway_url)
    r = client.chat.completions.create(model=model_name, messages=QUESTION, temperature=0,
                                       max_tokens=16, stream=True)
    n = sum(1 for c in r if c.choices and c.choices[0].delta.content)
    after = scrape(stack.gateway_url)
    out = metric_sum(after, "llmserve_output_tokens_total") - metric_sum(
        before, "llmserve_output_tokens_total")
    assert out >= n > 0
    assert metric_sum(after, "llmserve_ttft_seconds_count") == metric_sum(
        before, "llmserve_ttft_seconds_count") + 1


def test_requests_spread_over_both_replicas(client: OpenAI, model_name: str,
                                            stack: LocalStack) -> None:
    before = [metric_sum(scrape(u), "vllm:request_success_total") for u in stack.worker_urls]
    for _ in range(10):
        client.chat.completions.create(model=model_name, messages=QUESTION, temperature=0,
                                       max_tokens=4)
    after = [metric_sum(scrape(u), "vllm:request_success_total") for u in stack.worker_urls]
    served = [a - b for a, b in zip(after, before)]
    assert sum(served) == 10
    # Sequential requests tie on outstanding count; the policy rotates ties: 5 and 5.
    assert min(served) >= 4, served
