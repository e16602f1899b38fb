"""The fake upstream the gateway tests and benchmarks stand on: it must stop cleanly."""

from __future__ import annotations

import asyncio
import gc
import socket
import time

import pytest

from bench.fake_upstream import Behaviour, start_fake_upstream, start_in_thread
from tests import loopback


@pytest.mark.slow
def test_a_connection_accepted_as_it_stops_is_closed_not_leaked() -> None:
    # A client connecting the instant before the upstream stops (a health probe, say) used to
    # leave the server side's socket open on CPython 3.11 (its transport was set up after the
    # server closed). Any such socket is an unraisable ResourceWarning at the gc.collect() below,
    # which pytest turns into a failure under filterwarnings=error.
    for _ in range(20):
        with start_in_thread() as up:
            client = socket.create_connection((up.host, up.port))
        client.close()
        gc.collect()
    assert up.connections == set()


async def test_sequence_slots_queue_completions_in_arrival_order() -> None:
    # Two slots, answers of 0.2 s: the third and fourth wait a whole answer for a slot, and their
    # first token with them, as in an engine whose batch is full.
    behaviour = Behaviour(max_num_seqs=2, tokens=4, token_delay_s=0.05)
    async with start_fake_upstream(behaviour=behaviour) as up, loopback.async_client() as client:
        t0 = time.perf_counter()
        firsts: list[float] = []

        async def stream() -> None:
            body = {"model": "demo", "stream": True, "messages": [{"role": "user",
                                                                   "content": "hi"}]}
            async with client.stream("POST", up.url + "/v1/chat/completions", json=body) as r:
                seen = False
                async for line in r.aiter_lines():
                    if not seen and '"content"' in line:
                        firsts.append(time.perf_counter() - t0)
                        seen = True

        tasks = [asyncio.create_task(stream()) for _ in range(4)]
        waiting = 0
        for _ in range(200):  # until all four have arrived
            await asyncio.sleep(0.005)
            waiting = max(waiting, up.waiting)
            if up.completions == 4:
                break
        await asyncio.gather(*tasks)
    assert waiting == 2 and up.waiting == 0
    firsts.sort()
    # The third and fourth got their first token only once a whole answer (0.2 s) had freed a
    # slot; without slots all four start together.
    assert firsts[2] - firsts[0] >= 0.19 and firsts[3] - firsts[1] >= 0.19
