"""The usage an SSE stream reports (gateway/api/sse.py): counted, and stripped when the client did
not ask for it. `take` gets chunks of whole events, as the relay hands them over."""

from __future__ import annotations

import orjson

from gateway.api.sse import Usage


def event(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


DELTA = event({"choices": [{"index": 0, "delta": {"content": "Pa"}}]})
FINISH = event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
USAGE = event({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3,
                                        "total_tokens": 10}})
DONE = b"data: [DONE]\n\n"


def test_events_without_usage_pass_untouched() -> None:
    u = Usage(strip=True)
    assert u.take(DELTA + FINISH + DONE) == DELTA + FINISH + DONE
    assert u.counts is None


def test_strips_usage_chunk_the_client_did_not_ask_for_but_counts_it() -> None:
    u = Usage(strip=True)
    assert u.take(FINISH + USAGE + DONE) == FINISH + DONE
    assert u.counts == (7, 3)


def test_keeps_usage_chunk_when_client_asked() -> None:
    u = Usage(strip=False)
    assert u.take(USAGE) == USAGE
    assert u.take(DELTA + USAGE + DONE) == DELTA + USAGE + DONE
    assert u.counts is not None and u.counts[1] == 3


def test_continuous_usage_keeps_regular_chunks_and_latest_totals() -> None:
    u = Usage(strip=True)
    chunk = event({"choices": [{"index": 0, "delta": {"content": "x"}}],
                   "usage": {"prompt_tokens": 7, "completion_tokens": 1}})
    assert u.take(chunk) == chunk  # has choices: not the usage-only chunk, never stripped
    later = event({"choices": [{"index": 0, "delta": {"content": "y"}}],
                   "usage": {"prompt_tokens": 7, "completion_tokens": 2}})
    assert u.take(chunk + later) == chunk + later
    assert u.counts is not None and u.counts[1] == 2


def test_null_usage_field_is_not_parsed_as_usage() -> None:
    u = Usage(strip=True)
    chunk = event({"choices": [{"index": 0, "delta": {"content": "x"}}], "usage": None})
    assert u.take(chunk) == chunk
    assert u.counts is None


def test_spaced_usage_form_is_found_and_stripped() -> None:
    # Other OpenAI-compatible upstreams serialise with spaces: one scan must find both forms.
    u = Usage(strip=True)
    spaced = (b'data: {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2, '
              b'"total_tokens": 6}}\n\n')
    assert u.take(FINISH + spaced + DONE) == FINISH + DONE
    assert u.counts == (4, 2)


def test_malformed_usage_is_unknown_and_still_stripped() -> None:
    u = Usage(strip=True)
    bad = event({"choices": [], "usage": {"prompt_tokens": "abc", "completion_tokens": -1}})
    assert u.take(FINISH + bad + DONE) == FINISH + DONE
    assert u.counts is None
    u = Usage(strip=True)
    u.take(USAGE)
    assert u.counts is not None
    u.take(bad)  # a later malformed total makes the earlier one untrustworthy too
    assert u.counts is None
