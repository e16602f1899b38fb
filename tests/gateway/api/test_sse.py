from __future__ import annotations

import orjson

from gateway.api.sse import SseRelay


def event(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


DELTA = event({"choices": [{"index": 0, "delta": {"content": "Pa"}}]})
FINISH = event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
USAGE = event({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3,
                                        "total_tokens": 10}})
DONE = b"data: [DONE]\n\n"


def test_passes_whole_events_through_unchanged() -> None:
    r = SseRelay(strip_usage=False)
    assert r.feed(DELTA) == DELTA
    assert r.feed(DELTA + FINISH) == DELTA + FINISH
    assert not r.saw_done


def test_holds_a_partial_event_until_it_completes() -> None:
    r = SseRelay(strip_usage=False)
    joined = DELTA + FINISH
    cut = len(DELTA) + 5
    assert r.feed(joined[:3]) == b""
    assert r.feed(joined[3:cut]) == DELTA
    assert r.feed(joined[cut:]) == FINISH
    assert r.flush() == b""


def test_strips_usage_chunk_the_client_did_not_ask_for_but_counts_it() -> None:
    r = SseRelay(strip_usage=True)
    out = r.feed(FINISH + USAGE + DONE)
    assert out == FINISH + DONE
    assert (r.prompt_tokens, r.completion_tokens) == (7, 3)
    assert r.saw_done


def test_keeps_usage_chunk_when_client_asked() -> None:
    r = SseRelay(strip_usage=False)
    assert r.feed(USAGE) == USAGE
    assert r.feed(DONE) == DONE
    assert r.completion_tokens == 3 and r.saw_done


def test_usage_split_across_reads_is_still_found() -> None:
    r = SseRelay(strip_usage=True)
    data = FINISH + USAGE + DONE
    out = b"".join(r.feed(data[i : i + 7]) for i in range(0, len(data), 7))
    assert out == FINISH + DONE
    assert r.completion_tokens == 3


def test_continuous_usage_keeps_regular_chunks_and_latest_totals() -> None:
    r = SseRelay(strip_usage=True)
    chunk = event({"choices": [{"index": 0, "delta": {"content": "x"}}],
                   "usage": {"prompt_tokens": 7, "completion_tokens": 1}})
    assert r.feed(chunk) == chunk  # has choices: not the usage-only chunk, never stripped
    assert r.completion_tokens == 1


def test_null_usage_field_is_not_parsed_as_usage() -> None:
    r = SseRelay(strip_usage=True)
    chunk = event({"choices": [{"index": 0, "delta": {"content": "x"}}], "usage": None})
    assert r.feed(chunk) == chunk
    assert r.completion_tokens == 0


def test_spaced_usage_form_is_found_and_stripped() -> None:
    # Other OpenAI-compatible upstreams serialise with spaces: one scan must find both forms.
    r = SseRelay(strip_usage=True)
    spaced = (b'data: {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2, '
              b'"total_tokens": 6}}\n\n')
    assert r.feed(FINISH + spaced + DONE) == FINISH + DONE
    assert r.usage_known and (r.prompt_tokens, r.completion_tokens) == (4, 2)


def test_malformed_usage_is_unknown_and_still_stripped() -> None:
    r = SseRelay(strip_usage=True)
    bad = event({"choices": [], "usage": {"prompt_tokens": "abc", "completion_tokens": -1}})
    assert r.feed(FINISH + bad + DONE) == FINISH + DONE
    assert not r.usage_known and (r.prompt_tokens, r.completion_tokens) == (0, 0)
    r = SseRelay(strip_usage=True)
    r.feed(USAGE)
    assert r.usage_known
    r.feed(bad)  # a later malformed total makes the earlier one untrustworthy too
    assert not r.usage_known
