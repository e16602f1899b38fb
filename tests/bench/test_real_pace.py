"""The real-pace benchmark's parts: a paced fake upstream and an open-loop client whose TTFT
counts from each request's scheduled send time."""

from __future__ import annotations

import asyncio

from bench.fake_upstream import Behaviour, start_in_thread
from bench.load import pct
from bench.real_pace import Round, _spans, open_loop, sustained


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


def test_a_step_is_sustained_only_if_all_served_within_the_added_p99() -> None:
    ttft = [0.1 + i / 1000 for i in range(100)]  # p99 = 199 ms: 99 ms over a 100 ms upstream
    ok, added = sustained(Round(statuses={200: 100}, ttft=ttft), 100, 100)
    assert ok and 98 < added < 100
    ok, added = sustained(Round(statuses={200: 100}, ttft=ttft), 100, 50)
    assert not ok and 98 < added < 100
    # One refusal, or one error, fails the step whatever the latency.
    assert not sustained(Round(statuses={200: 99, 503: 1}, ttft=ttft), 100, 100)[0]
    assert not sustained(Round(statuses={200: 100}, errors=1, ttft=ttft), 100, 100)[0]
    assert not sustained(Round(), 100, 100)[0]  # nothing sent, nothing proven


def test_refusals_are_timed_from_the_rounds_start() -> None:
    with start_in_thread(Behaviour(tokens=2, fail_status=503, fail_ratio=0.5)) as up:
        result = asyncio.run(open_loop(up.port, rate=20.0, duration=0.5, tokens=2))
    assert result.statuses == {200: 5, 503: 5}
    # Every other request was refused: due 0.05 s, 0.15 s, ... after the start (as sent).
    assert [round(t, 2) for t in result.refused_at] == [0.05, 0.15, 0.25, 0.35, 0.45]
    assert _spans([0.093, 0.095, 0.1, 0.195, 0.2, 0.5]) == "0.093-0.100 (3), 0.195-0.200 (2), 0.500"


def _arrivals(pace: Behaviour) -> list[tuple[float, bytes]]:
    """Each read of one streamed chat answer from `pace`, with its time from the request."""
    import time

    async def read() -> list[tuple[float, bytes]]:
        with start_in_thread(pace) as up:
            reader, writer = await asyncio.open_connection("127.0.0.1", up.port)
            body = (b'{"model":"demo","stream":true,"max_tokens":3,'
                    b'"stream_options":{"include_usage":true},'
                    b'"messages":[{"role":"user","content":"hi"}]}')
            t0 = time.perf_counter()
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                         b"application/json\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body))
            out = []
            while not (out and out[-1][1].endswith(b"0\r\n\r\n")):
                data = await asyncio.wait_for(reader.read(65536), 10)
                assert data, "the upstream closed before the stream's end"
                out.append((time.perf_counter() - t0, data))
            writer.close()
            return out

    return asyncio.run(read())


def test_the_tail_comes_at_once_at_vllms_pace() -> None:
    # vLLM writes the finish, usage and [DONE] in the step of the last token; as a token each,
    # they would come 3 gaps later.
    gap = 0.1
    paced = _arrivals(Behaviour(token_delay_s=gap, tail_delay_s=0.0))
    spaced = _arrivals(Behaviour(token_delay_s=gap))
    last_token = [t for t, data in paced if b'" tok"' in data][-1]
    assert paced[-1][0] - last_token < gap / 2
    last_token = [t for t, data in spaced if b'" tok"' in data][-1]
    assert spaced[-1][0] - last_token >= 3 * gap * 0.9
