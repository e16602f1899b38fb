"""The streamed relay's per-event step (gateway/api/splice.py) on its own: what it writes, holds
and times, over the recording client writer of tests/gateway/conftest.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.api.splice import Splice
from tests.gateway.conftest import ClientWriter

USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
DONE = b"data: [DONE]\n\n"


def splice(writer: ClientWriter | None = None, strip_usage: bool = True) -> Splice:
    s = Splice(0.0, strip_usage=strip_usage)
    if writer is not None:
        s.write_directly(writer)  # type: ignore[arg-type]
    return s


def test_whole_events_are_written_and_timed_partial_ones_held() -> None:
    w = ClientWriter()
    s = splice(w)
    assert s.feed(b"data: a\n\n", 0.1) is True
    assert s.feed(b"data: b", 0.15) is True  # half an event: nothing written, no gap yet
    assert w.written == [b"data: a\n\n"]
    assert s.feed(b"\n\ndata: c\n\n", 0.16) is True  # the end of b and all of c, in one read
    assert w.written == [b"data: a\n\n", b"data: b\n\ndata: c\n\n"]
    # The first entry is the time to the first event; then one gap per chunk, 0 for the rest.
    assert s.gaps == pytest.approx([0.1, 0.06, 0.0])


def test_an_event_of_several_lines_counts_once() -> None:
    w = ClientWriter()
    s = splice(w)
    assert s.feed(b"event: x\ndata: a\n\n", 0.1) is True
    assert s.feed(b"data: b\ndata: c\n\ndata: d\n\n", 0.2) is True
    assert s.gaps == pytest.approx([0.1, 0.1, 0.0])


def test_before_write_directly_each_chunk_of_events_is_held_for_asgi() -> None:
    s = splice()
    assert s.feed(b"data: a", 0.1) is True and s.held == b""  # nothing whole yet: keep feeding
    assert s.feed(b"\n\ndata: b\n\n", 0.2) is False
    assert s.held == b"data: a\n\ndata: b\n\n" and s.gaps == pytest.approx([0.2, 0.0])
    w = ClientWriter()
    s.held = b""
    s.write_directly(w)  # type: ignore[arg-type]
    assert s.feed(b"data: c\n\n", 0.25) is True
    assert w.written == [b"data: c\n\n"] and s.held == b""


def test_done_is_kept_for_asgi_and_usage_stripped() -> None:
    w = ClientWriter()
    s = splice(w)
    assert s.feed(b"data: a\n\n", 0.0) is True
    assert s.feed(USAGE + DONE, 0.0) is False  # stop: the proxy sends the end itself
    assert s.final == DONE and s.saw_done and not s.blocked
    assert w.written == [b"data: a\n\n"]
    assert s.usage.counts == (3, 2)


def test_a_usage_event_alone_stripped_is_not_an_event() -> None:
    w = ClientWriter()
    s = splice(w)
    assert s.feed(b"data: a\n\n", 0.1) is True
    assert s.feed(USAGE, 0.2) is True
    assert w.written == [b"data: a\n\n"] and s.gaps == pytest.approx([0.1])
    assert s.usage.counts == (3, 2)


def test_a_full_client_buffer_stops_the_feed_after_writing() -> None:
    w = ClientWriter(room=2)
    s = splice(w)
    assert s.feed(b"data: a\n\n", 0.0) is True
    assert s.feed(b"data: b\n\n", 0.0) is False  # written, but the buffer is full now
    assert s.blocked and w.written == [b"data: a\n\n", b"data: b\n\n"]


def test_a_lost_client_gets_nothing_more_and_the_feed_goes_on() -> None:
    # As uvicorn's send: dropped; the disconnect cancels the relay.
    w = ClientWriter()
    s = splice(w)
    w.closed = True
    assert s.feed(b"data: a\n\n", 0.0) is True
    assert w.frames == [] and len(s.gaps) == 1


def test_a_partial_event_left_at_the_end_is_flushed() -> None:
    s = splice(ClientWriter())
    assert s.feed(b"data: a\n\ndata: b", 0.0) is True
    assert s.flush() == b"data: b" and s.flush() == b""


@settings(max_examples=60, deadline=None)
@given(
    bodies=st.lists(st.lists(st.binary(max_size=30).map(lambda b: b.translate(None, b'\n"[')),
                             min_size=1, max_size=3),
                    min_size=1, max_size=12),
    cuts=st.lists(st.integers(min_value=1, max_value=40), max_size=30),
    usage=st.booleans(),
)
def test_any_reads_give_the_client_every_event_once_and_a_gap_each(
    bodies: list[list[bytes]], cuts: list[int], usage: bool
) -> None:
    # Events of one to three `data:` lines, the stream cut into reads anywhere.
    events = [b"\n".join(b"data: " + line for line in lines) + b"\n\n" for lines in bodies]
    stream = b"".join(events) + USAGE + DONE
    reads, pos = [], 0
    for n in cuts:
        reads.append(stream[pos:pos + n])
        pos += n
    reads.append(stream[pos:])
    w = ClientWriter()
    s = splice(w, strip_usage=not usage)
    now = 0.0
    for read in (r for r in reads if r):
        now += 1.0
        if not s.feed(read, now):
            break
    assert b"".join(w.written) + s.final == b"".join(events) + (USAGE if usage else b"") + DONE
    # [DONE]'s gap, and the usage event's when it is relayed: stream.py leaves those out of ITL.
    assert len(s.gaps) == len(events) + (2 if usage else 1)
    # Each chunk's gap runs from the previous chunk's time: together, up to [DONE]'s arrival.
    assert min(s.gaps) >= 0 and sum(s.gaps) == pytest.approx(now)
    assert s.usage.counts == (3, 2)
