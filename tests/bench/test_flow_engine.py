"""bench.flow_engine's throughput phase counts output tokens from each stream's usage chunk,
with the client's streams spread over the direct targets."""

from __future__ import annotations

import asyncio

from bench.fake_upstream import Behaviour, start_in_thread
from bench.flow_engine import throughput_round


def test_throughput_round_counts_the_usage_tokens_of_every_stream() -> None:
    with start_in_thread(Behaviour()) as a, start_in_thread(Behaviour()) as b:
        secs, tokens, ttfts = asyncio.run(
            throughput_round([a.url, b.url], "demo", concurrency=4, requests=10, tokens=7))
        assert a.completions + b.completions == 10 and a.completions and b.completions
    assert tokens == 70 and len(ttfts) == 10 and secs > 0
