"""prefix_affinity on the session's real engines: a session's second turn lands on the replica
that served its first, and that engine really reuses the cached prefix."""

from __future__ import annotations

import pytest

from devstack.stack import LocalStack
from tests import loopback
from tests.e2e.conftest import served_by
from tests.gateway.conftest import run_gateway
from tests.waiting import metric_sum, scrape

pytestmark = pytest.mark.engine


def test_second_turn_lands_on_the_first_turns_replica(stack: LocalStack, model_name: str) -> None:
    # A gateway of its own in front of the session's engines: the stack's gateway keeps the
    # default policy for the other tests.
    with run_gateway(backends=stack.worker_urls, routing_policy="prefix_affinity") as gw:
        for session in range(4):
            messages = [{"role": "system", "content": f"Session {session}. "
                         + " ".join(f"rule {session}-{i}: answer briefly." for i in range(60))}]
            turns: list[str] = []
            for turn in range(2):
                messages.append({"role": "user", "content": f"Question {turn}?"})
                before = served_by(gw.url)
                hits = {u: metric_sum(scrape(u), "vllm:prefix_cache_hits_total")
                        for u in stack.worker_urls}
                r = loopback.post(gw.url + "/v1/chat/completions", timeout=120, json={
                    "model": model_name, "messages": messages, "max_tokens": 4,
                    "temperature": 0.0})
                assert r.status_code == 200, r.text
                after = served_by(gw.url)
                (backend,) = [u for u in after if after[u] > before.get(u, 0.0)]
                turns.append(backend)
                messages.append({"role": "assistant",
                                 "content": r.json()["choices"][0]["message"]["content"]})
            assert turns[0] == turns[1], f"session {session}: turns on {turns}"
            # The engine that took turn 2 served most of its prompt from its prefix cache.
            gained = metric_sum(scrape(turns[1]), "vllm:prefix_cache_hits_total") - hits[turns[1]]
            assert gained >= 300, f"session {session}: only {gained} cached prompt tokens"
        assert gw.metric("llmserve_affinity_hits_total") >= 4
