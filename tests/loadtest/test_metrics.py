"""The metric maths on hand-made event timelines (times in seconds from the send)."""

from __future__ import annotations

import json

import pytest

from loadtest.metrics import (
    RequestRecord,
    StreamTimer,
    meets,
    parse_slos,
    percentile,
    summarize,
)


def _chat(content: str | None = None, role: bool = False, finish: bool = False) -> str:
    delta: dict[str, str] = {}
    if role:
        delta["role"] = "assistant"
    if content is not None:
        delta["content"] = content
    return json.dumps({"choices": [{"index": 0, "delta": delta,
                                    "finish_reason": "stop" if finish else None}]})


def _usage(n: int) -> str:
    return json.dumps({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": n,
                                                "total_tokens": 7 + n}})


def _run(events: list[tuple[float, str]], end: float, start: float = 100.0) -> RequestRecord:
    timer = StreamTimer(start_wall=start, t0=0.0)
    for t, payload in events:
        timer.feed(payload, t)
    return timer.finish(end)


def test_one_token_per_event_with_usage() -> None:
    # vLLM's shape: the role chunk with the first token, then one token per event, a finish
    # chunk, the usage chunk, [DONE].
    r = _run([(0.100, _chat("", role=True)), (0.110, _chat("a")), (0.130, _chat("b")),
              (0.160, _chat("c")), (0.161, _chat(finish=True)), (0.170, _usage(3)),
              (0.171, "[DONE]")], end=0.175)
    assert r.ok and r.token_source == "usage" and r.output_tokens == 3 and r.prompt_tokens == 7
    assert r.ttft == pytest.approx(0.100)
    # E2EL stops at the last event with choices: the usage event and [DONE] carry no token.
    assert r.latency == pytest.approx(0.161)
    assert r.itl == pytest.approx([0.010, 0.020, 0.030, 0.001])
    assert r.tpot == pytest.approx((0.161 - 0.100) / 2)


def test_multi_token_events_are_one_gap_each_and_usage_counts_the_tokens() -> None:
    # Three events of 4 tokens each (speculative decoding, or a proxy that coalesces).
    r = _run([(0.2, _chat("one two three four", role=True)), (0.3, _chat("five six seven eight")),
              (0.4, _chat("nine ten eleven twelve")), (0.41, _usage(12)), (0.42, "[DONE]")],
             end=0.43)
    assert r.output_tokens == 12 and r.token_source == "usage"
    assert r.itl == pytest.approx([0.1, 0.1])
    # TPOT divides by tokens, not events: (0.4 - 0.2) / 11.
    assert r.tpot == pytest.approx(0.2 / 11)


def test_missing_usage_falls_back_to_counting_content_events() -> None:
    r = _run([(0.05, _chat("", role=True)), (0.06, _chat("x")), (0.07, _chat("y")),
              (0.08, _chat(finish=True)), (0.09, "[DONE]")], end=0.1)
    assert r.ok and r.token_source == "chunks" and r.output_tokens == 2
    s = summarize([r])
    assert s["token_sources"] == {"chunks": 1}


def test_in_band_error_mid_stream_fails_the_request() -> None:
    err = json.dumps({"error": {"message": "upstream went away", "type": "server_error",
                                "param": None, "code": None}})
    r = _run([(0.1, _chat("a", role=True)), (0.2, _chat("b")), (0.25, err)], end=0.3)
    assert not r.ok and "upstream went away" in (r.error or "")
    assert r.latency == pytest.approx(0.25)  # until the failure
    assert r.ttft == pytest.approx(0.1)


def test_stream_cut_without_done_fails() -> None:
    r = _run([(0.1, _chat("a", role=True)), (0.2, _chat("b"))], end=0.5)
    assert not r.ok and "without [DONE]" in (r.error or "")
    r = _run([], end=0.5)
    assert not r.ok and r.ttft is None and r.token_source == "none"


def test_summary_counts_only_successes_and_uses_first_send_to_last_end() -> None:
    ok1 = RequestRecord(start=10.0, ttft=0.1, latency=1.0, itl=[0.1] * 9, output_tokens=10,
                        token_source="usage")
    ok2 = RequestRecord(start=10.5, ttft=0.3, latency=1.5, itl=[0.2] * 5, output_tokens=6,
                        token_source="usage")
    bad = RequestRecord(start=11.0, latency=0.2, error="HTTP 503: busy")
    s = summarize([ok1, ok2, bad])
    assert s["requests"] == 3 and s["completed"] == 2 and s["errors"] == 1
    assert s["duration_s"] == pytest.approx(2.0)  # 10.0 -> 12.0 (ok2 ends last)
    assert s["output_tok_s"] == pytest.approx(16 / 2.0)
    assert s["req_s"] == pytest.approx(1.0)
    assert s["ttft_ms"]["p50"] == pytest.approx(200.0)
    assert s["tpot_ms"]["p50"] == pytest.approx((100.0 + 240.0) / 2)  # 0.9/9, 1.2/5
    assert s["itl_ms"]["p99"] == pytest.approx(200.0)


def test_goodput_under_ttft_and_tpot_slos() -> None:
    fast = RequestRecord(start=0, ttft=0.2, latency=0.2 + 0.04 * 9, output_tokens=10)
    slow_first = RequestRecord(start=0, ttft=0.6, latency=0.6 + 0.04 * 9, output_tokens=10)
    slow_decode = RequestRecord(start=0, ttft=0.2, latency=0.2 + 0.06 * 9, output_tokens=10)
    one_token = RequestRecord(start=0, ttft=0.4, latency=0.4, output_tokens=1)  # TPOT 0 (vLLM)
    failed = RequestRecord(start=0, ttft=0.1, latency=0.1, error="in-band error: x")
    slos = parse_slos(["ttft_ms=500", "tpot_ms=50"])
    assert [meets(r, slos) for r in (fast, slow_first, slow_decode, one_token, failed)] == [
        True, False, False, True, False]
    s = summarize([fast, slow_first, slow_decode, one_token, failed], slos, duration_s=2.0)
    assert s["good_requests"] == 2 and s["goodput_req_s"] == pytest.approx(1.0)
    # The bound is inclusive, as in vLLM (slo >= value).
    edge = RequestRecord(start=0, ttft=0.5, latency=0.5, output_tokens=1)
    assert meets(edge, {"ttft_ms": 500.0})


@pytest.mark.parametrize("bad", ["ttft=500", "ttft_ms", "ttft_ms=fast", "tpot_ms=-1"])
def test_slo_parse_errors_name_the_flag(bad: str) -> None:
    with pytest.raises(ValueError, match="--slo"):
        parse_slos([bad])


def test_percentile_matches_numpy_linear() -> None:
    np = pytest.importorskip("numpy")
    values = [0.3, 0.1, 0.9, 0.5, 0.7, 0.2]
    for p in (0, 50, 90, 99, 100):
        assert percentile(values, p) == pytest.approx(float(np.percentile(values, p)))
    assert percentile([], 50) == 0.0


def test_records_round_trip_through_json() -> None:
    r = RequestRecord(start=1.5, ttft=0.1, latency=0.3, itl=[0.1, 0.1], output_tokens=3,
                      prompt_tokens=4, token_source="usage")
    assert RequestRecord.from_json(r.to_json()) == r
