"""The streamed relay's per-event step (gateway/api/splice.py) on its own: what it writes, holds
and times, over the recording client writer of tests/gateway/conftest.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.api.splice import Splice
from gateway.api.sse import SseRelay
from tests.gateway.conftest import ClientWriter

USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
DONE = b"data: [DONE]\n\n"


def splice(clock: list[float], writer: ClientWriter | None = None,
           strip_usage: bool = True) -> Splice:
    s = Splice(SseRelay(strip_usage=strip_usage), 0.0, lambda: clock[0])
    if writer is not None:
        s.write_directly(writer)  # type: ignore[arg-type]
    return s


def test_whole_events_are_written_and_timed_partial_ones_held() -> None:
    w, clock = ClientWriter(), [0.1]
    s = splice(clock, w)
    assert s(b"data: a\n\n") is True
    clock[0] = 0.15
    assert s(b"data: b") is True  # half an event: nothing written, no gap yet
    assert w.written == [b"data: a\n\n"]
    clock[0] = 0.16
    assert s(b"\n\ndata: c\n\n") is True  # the end of b and all of c, in one read
    assert w.written == [b"data: a\n\n", b"data: b\n\ndata: c\n\n"]
    # The first entry is the time to the first event; then one gap per chunk, 0 for the rest.
    assert s.gaps == pytest.approx([0.1, 0.06, 0.0])


def test_before_write_directly_each_chunk_of_events_is_held_for_asgi() -> None:
    clock = [0.2]
    s = splice(clock)
    assert s(b"data: a") is True and s.held == b""  # nothing whole yet: keep feeding
    assert s(b"\n\ndata: b\n\n") is False
    assert s.held == b"data: a\n\ndata: b\n\n" and s.gaps == pytest.approx([0.2, 0.0])
    w = ClientWriter()
    s.held = b""
    s.write_directly(w)  # type: ignore[arg-type]
    clock[0] = 0.25
    assert s(b"data: c\n\n") is True
    assert w.written == [b"data: c\n\n"] and s.held == b""


def test_done_is_kept_for_asgi_and_usage_stripped() -> None:
    w, clock = ClientWriter(), [0.0]
    s = splice(clock, w)
    assert s(b"data: a\n\n") is True
    assert s(USAGE + DONE) is False  # stop: the proxy sends the end itself
    assert s.final == DONE and not s.blocked
    assert w.written == [b"data: a\n\n"]
    assert s._relay.completion_tokens == 2


def test_a_full_client_buffer_stops_the_feed_after_writing() -> None:
    w, clock = ClientWriter(room=2), [0.0]
    s = splice(clock, w)
    assert s(b"data: a\n\n") is True
    assert s(b"data: b\n\n") is False  # written, but the buffer is full now
    assert s.blocked and w.written == [b"data: a\n\n", b"data: b\n\n"]


def test_a_closing_client_gets_nothing_more_and_the_feed_goes_on() -> None:
    # As uvicorn's send: dropped; the disconnect cancels the relay.
    w, clock = ClientWriter(), [0.0]
    s = splice(clock, w)
    w.closing = True
    assert s(b"data: a\n\n") is True
    assert w.frames == [] and len(s.gaps) == 1


@settings(max_examples=60, deadline=None)
@given(
    bodies=st.lists(st.binary(max_size=30).map(lambda b: b.translate(None, b'\n"[')),
                    min_size=1, max_size=12),
    cuts=st.lists(st.integers(min_value=1, max_value=40), max_size=30),
    usage=st.booleans(),
)
def test_any_reads_give_the_client_every_event_once_and_a_gap_each(
    bodies: list[bytes], cuts: list[int], usage: bool
) -> None:
    events = [b"data: " + b + b"\n\n" for b in bodies]
    stream = b"".join(events) + USAGE + DONE
    reads, pos = [], 0
    for n in cuts:
        reads.append(stream[pos:pos + n])
        pos += n
    reads.append(stream[pos:])
    w, clock = ClientWriter(), [0.0]
    s = splice(clock, w, strip_usage=not usage)
    for read in (r for r in reads if r):
        clock[0] += 1.0
        if not s(read):
            break
    assert b"".join(w.written) + s.final == b"".join(events) + (USAGE if usage else b"") + DONE
    # [DONE]'s gap, and the usage event's when it is relayed: stream.py leaves those out of ITL.
    assert len(s.gaps) == len(events) + (2 if usage else 1)
    assert s._relay.usage_known and s._relay.completion_tokens == 2
