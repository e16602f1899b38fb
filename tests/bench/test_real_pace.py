"""The real-pace benchmark's parts: a paced fake upstream and an open-loop client whose TTFT
counts from each request's scheduled send time."""

from __future__ import annotations

import asyncio

from bench.fake_upstream import Behaviour, start_in_thread
from bench.real_pace import Round, open_loop, pct


def test_paced_upstream_and_open_loop_client() -> None:
    pace = Behaviour(tokens=4, first_token_delay_s=0.15, token_delay_s=0.05)
    with start_in_thread(pace) as up:
        result = asyncio.run(open_loop(up.port, rate=20.0, duration=0.5, tokens=4))
    assert result.statuses == {200: 10} and result.errors == 0
    assert len(result.ttft) == 10
    # The first token waits the upstream's TTFT (lower bounds only: a busy machine is slower).
    assert min(result.ttft) >= 0.15


def test_percentiles_of_a_round() -> None:
    r = Round(ttft=[float(i) for i in range(1, 101)])
    assert pct(r.ttft, 0.5) == 51 and pct(r.ttft, 0.99) == 100
    assert r.served == 0
    r.statuses[200] = 7
    assert r.served == 7
