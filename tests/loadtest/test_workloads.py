"""Workloads are seeded (same seed, same bodies) and shaped as their names say."""

from __future__ import annotations

import pytest

from loadtest.workloads import WORKLOADS, Workload


@pytest.mark.parametrize("name", WORKLOADS)
def test_same_seed_same_requests_other_seed_others(name: str) -> None:
    a = [Workload(name, seed=1).body("m", i) for i in range(20)]
    assert a == [Workload(name, seed=1).body("m", i) for i in range(20)]
    assert a != [Workload(name, seed=2).body("m", i) for i in range(20)]
    assert all(b["stream"] and b["stream_options"] == {"include_usage": True} for b in a)


def test_shapes() -> None:
    chat = Workload("chat").body("m", 0)
    long_prompt = Workload("long-prompt").body("m", 0)
    long_output = Workload("long-output").body("m", 0)
    assert len(long_prompt["messages"][-1]["content"]) > 20 * len(chat["messages"][-1]["content"])
    assert long_prompt["max_tokens"] < chat["max_tokens"] < long_output["max_tokens"]
    assert long_output["ignore_eos"] is True and "ignore_eos" not in chat
    shared = [Workload("shared-prefix", seed=3).body("m", i)["messages"] for i in range(5)]
    assert len({m[0]["content"] for m in shared}) == 1  # one common system prompt
    assert len({m[1]["content"] for m in shared}) > 1
    assert Workload("chat", max_tokens=7).body("m", 0)["max_tokens"] == 7


def test_unknown_workload_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="--workload 'chatty'"):
        Workload("chatty")
