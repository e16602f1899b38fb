"""The streamed relay's per-event step (gateway/api/splice.py) on its own: what it writes, holds
and times, over the recording client writer of tests/gateway/conftest.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.api.splice import Splice, whole_events
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


def _choice_event(index: int, text: str, finish: bool = False) -> bytes:
    reason = b'"stop"' if finish else b"null"
    return (b'data: {"choices":[{"index":%d,"delta":{"content":"%s"},"finish_reason":%s}]}\n\n'
            % (index, text.encode(), reason))


FP_USAGE = (b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4},'
            b'"system_fingerprint":"fp-1"}\n\n')


def _per_choice(stream: bytes) -> dict[int, list[bytes]]:
    out: dict[int, list[bytes]] = {}
    for event in stream.split(b"\n\n"):
        if event.startswith(b'data: {"choices":[{"index":'):
            out.setdefault(int(event[27:28]), []).append(event)
    return out


def test_a_finished_choice_holds_only_its_terminal_event_for_the_fingerprint() -> None:
    # n=2: choice 0 finishes in the read that also brings a token of choice 1. Only the
    # terminal event waits for the usage event's fingerprint; choice 1's token goes on at once,
    # so its next token, in a later read, cannot overtake it.
    w = ClientWriter()
    s = splice(w)
    assert s.feed(_choice_event(0, "a") + _choice_event(1, "b"), 0.1)
    assert s.feed(_choice_event(0, "", finish=True) + _choice_event(1, "c"), 0.2)
    assert w.written[-1] == _choice_event(1, "c")
    assert s.feed(_choice_event(1, "d"), 0.3)
    assert s.feed(_choice_event(1, "", finish=True), 0.4)
    assert s.feed(FP_USAGE, 0.5) is True
    assert s.feed(DONE, 0.6) is False
    client = b"".join(w.written) + s.final
    stamped = [e + b',"system_fingerprint":"fp-1"}' for e in
               (_choice_event(0, "", True)[:-3], _choice_event(1, "", True)[:-3])]
    assert _per_choice(client) == {0: [_choice_event(0, "a")[:-2], stamped[0]],
                                   1: [_choice_event(1, t)[:-2] for t in "bcd"] + [stamped[1]]}
    assert client.endswith(DONE) and b'"usage"' not in client
    assert len(s.gaps) == 7  # one per event as it arrived, [DONE] included (usage stripped)


@settings(max_examples=60, deadline=None)
@given(
    choices=st.lists(st.integers(min_value=0, max_value=2), min_size=1, max_size=20),
    n=st.integers(min_value=1, max_value=3),
    cuts=st.lists(st.integers(min_value=1, max_value=3), max_size=30),
)
def test_any_reads_of_n_choices_keep_each_choices_events_in_order(
    choices: list[int], n: int, cuts: list[int]
) -> None:
    # Token events of n choices interleaved at random, each choice's terminal event right after
    # its last token (the others go on), then the gateway's usage event with the fingerprint and
    # [DONE], in reads of one to three whole events (splitting events across reads is the test
    # above's; the relay defers only whole events).
    order = [c % n for c in choices]
    order += [c for c in range(n) if c not in order]
    last = {c: i for i, c in enumerate(order)}
    events = []
    for i, c in enumerate(order):
        events.append(_choice_event(c, f"t{i}"))
        if last[c] == i:
            events.append(_choice_event(c, "", finish=True))
    stream = [*events, FP_USAGE, DONE]
    reads, pos = [], 0
    for k in cuts:
        reads.append(b"".join(stream[pos:pos + k]))
        pos += k
    reads.append(b"".join(stream[pos:]))
    w = ClientWriter()
    s = splice(w)
    for i, read in enumerate(r for r in reads if r):
        if not s.feed(read, float(i)):
            break
    client = b"".join(w.written) + s.final
    want = _per_choice(b"".join(events))
    for c in range(n):
        want[c][-1] = want[c][-1][:-1] + b',"system_fingerprint":"fp-1"}'
    assert _per_choice(client) == want
    assert client.endswith(DONE) and client.count(b"\n\n") == len(events) + 1


def test_a_terminal_event_and_done_in_one_read_without_usage_end_the_stream() -> None:
    # An upstream that sent no usage event (it ignored stream_options): [DONE] still ends the
    # stream, the terminal event before it, unstamped.
    w = ClientWriter()
    s = splice(w)
    assert s.feed(_choice_event(0, "a"), 0.1)
    assert s.feed(_choice_event(0, "", finish=True) + DONE, 0.2) is False
    assert s.saw_done and s.final == _choice_event(0, "", finish=True) + DONE
    assert w.written == [_choice_event(0, "a")] and s.flush() == b""


@pytest.mark.parametrize(("partial", "chunk", "whole", "left"), [
    (b"", b"data: a\n\n", b"data: a\n\n", b""),
    (b"", b"data: a", b"", b"data: a"),
    (b"data: a", b"\n\ndata: b\n\ndata: c", b"data: a\n\ndata: b\n\n", b"data: c"),
    (b"data: a\n", b"\n", b"data: a\n\n", b""),  # the event's end split between two reads
    (b"data: a", b"bc", b"", b"data: abc"),
])
def test_whole_events_cut_at_the_last_event_end(
        partial: bytes, chunk: bytes, whole: bytes, left: bytes) -> None:
    # The one cut that Splice, ResumeSplice and a resumed stream's relay all make.
    assert whole_events(partial, chunk) == (whole, left)
