"""bench.gateway_overhead's timed clients: each timed answer is whole and has the status asked
for, or the run stops (a benchmark must not time errors as fast answers)."""

from __future__ import annotations

import asyncio

import pytest

from bench.fake_upstream import Behaviour, start_in_thread
from bench.gateway_overhead import completion_latency


def test_completion_latency_times_whole_answers_after_a_warm_up() -> None:
    with start_in_thread(Behaviour(tokens=4)) as up:
        times = asyncio.run(completion_latency(up.url, 5, {"x-test": "1"}))
        assert up.completions == 25 and up.last_headers["x-test"] == "1"
        assert up.opened == 1  # one keep-alive connection for all of them
    assert len(times) == 5 and all(t > 0 for t in times)


def test_an_answer_of_another_status_stops_the_run() -> None:
    with start_in_thread(Behaviour(fail_status=503)) as up, \
            pytest.raises(RuntimeError, match="503"):
        asyncio.run(completion_latency(up.url, 5, {}))
