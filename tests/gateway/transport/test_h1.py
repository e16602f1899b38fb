"""gateway/transport/h1.py's push mode with a sink that takes whole chunk frames (FrameSink): a read
taken whole must leave the parser where it was, so whatever the framing and however the bytes are
split into reads, the client gets exactly the upstream's events and the connection stays reusable.

The upstream socket is the seam here (a recording transport, reads fed to `data_received`); the
sink is the real Splice over the recording client writer of tests/gateway/conftest.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.api.splice import Splice
from gateway.api.sse import SseRelay
from gateway.errors import UpstreamFailed
from gateway.transport.h1 import _Conn, _Pool
from tests.gateway.conftest import ClientWriter

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}\n\n'
DONE = b"data: [DONE]\n\n"


@dataclass
class Socket:
    """The upstream connection's transport: what the request wrote, and whether it was dropped."""

    sent: list[bytes] = field(default_factory=list)
    aborted: bool = False

    def write(self, data: bytes) -> None:
        self.sent.append(data)

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class CountingSplice(Splice):
    """Counts the reads it took whole."""

    taken = 0

    def frame(self, data: bytes, now: float) -> bool | None:
        more = super().frame(data, now)
        self.taken += more is not None
        return more


def frame(payload: bytes, style: str) -> bytes:
    size = {"lower": b"%x", "upper": b"%X", "zeros": b"%04x", "ext": b"%x;n=v"}[style]
    return size % len(payload) + b"\r\n" + payload + b"\r\n"


async def relay(reads: list[bytes]) -> tuple[bytes, CountingSplice, ClientWriter, _Conn]:
    """Head, then `reads` fed one by one to a pushing connection; the last read ends the body."""
    loop = asyncio.get_running_loop()
    conn = _Conn(_Pool("127.0.0.1", 1, loop))
    conn.connection_made(Socket())  # type: ignore[arg-type]
    head = conn.start(b"POST / HTTP/1.1\r\n\r\n")
    conn.data_received(HEAD)
    await head
    writer = ClientWriter()
    sink = CountingSplice(SseRelay(strip_usage=False), writer, [], 0.0,  # type: ignore[arg-type]
                          loop.time)
    pushing = asyncio.ensure_future(conn.push(sink))
    await asyncio.sleep(0)
    for read in reads:
        conn.data_received(read)
        if pushing.done():
            break
    await pushing
    rest = b""
    while chunk := await conn.readany():  # what was left after the sink stopped
        rest += chunk
    return b"".join(writer.written) + sink.final + rest, sink, writer, conn


def event(content: bytes) -> bytes:
    # No newline (one event each), no quote or bracket (no usage key, no [DONE] by chance).
    return b"data: " + content.translate(None, b'\n"[') + b"\n\n"


@settings(max_examples=60, deadline=None)
@given(
    events=st.lists(st.binary(max_size=30).map(event), min_size=1, max_size=12),
    styles=st.lists(st.sampled_from(["lower", "upper", "zeros", "ext"]), min_size=16, max_size=16),
    cuts=st.lists(st.integers(min_value=1, max_value=40), max_size=30),
    whole=st.booleans(),
)
def test_any_framing_and_any_reads_give_the_client_every_event(
    events: list[bytes], styles: list[str], cuts: list[int], whole: bool
) -> None:
    stream = [*events, USAGE, DONE]
    frames = [frame(e, styles[i]) for i, e in enumerate(stream)]
    body = b"".join(frames) + b"0\r\n\r\n"
    if whole:  # the real pace: one read per frame
        reads = [*frames[:-1], frames[-1] + b"0\r\n\r\n"]
    else:  # anywhere: mid size line, mid payload, mid CRLF
        reads, pos = [], 0
        for n in cuts:
            reads.append(body[pos:pos + n])
            pos += n
        reads.append(body[pos:])
    got, sink, _, conn = asyncio.run(relay([r for r in reads if r]))
    assert got == b"".join(stream)
    assert len(sink.gaps) == len(stream)  # one per event, however they were read
    assert conn.reusable()
    if whole:
        # After the first frame (parsed: only then does the parser stand between two chunks),
        # every event frame without an extension is taken whole; usage and [DONE] are parsed.
        assert sink.taken == sum(1 for i in range(1, len(events)) if styles[i] != "ext")


def test_frames_at_a_real_pace_skip_the_parser_and_the_terminator_still_completes() -> None:
    events = [b"data: %d\n\n" % i for i in range(5)]
    reads = [frame(e, "lower") for e in [*events, DONE]] + [b"0\r\n\r\n"]
    got, sink, writer, conn = asyncio.run(relay(reads))
    assert got == b"".join(events) + DONE
    # The first frame is parsed (the parser is between chunks only once it ended one); the next
    # four are taken whole and written to the client exactly as they came.
    assert sink.taken == 4
    assert writer.frames[1:] == reads[1:5]
    assert conn.reusable()


@pytest.mark.parametrize("bad", [b"+9\r\ndata: a\n\n\r\n", b"0x9\r\ndata: a\n\n\r\n"])
def test_a_size_line_the_parser_refuses_fails_the_stream(bad: bytes) -> None:
    first = frame(b"data: 0\n\n", "lower")
    with pytest.raises(UpstreamFailed, match="malformed response"):
        asyncio.run(relay([first, bad]))


def test_a_read_inside_a_chunk_is_parsed_even_when_it_looks_like_a_whole_frame() -> None:
    # A chunk whose data happens to read as a frame: after its size line the parser is inside
    # the chunk, and the read must go to it, or the stream's framing is lost from there on.
    first = frame(b"data: 0\n\n", "lower")
    inner = b"9\r\ndata: a\n\n\r\n"
    reads = [first, b"%x\r\n" % len(inner), inner, b"\r\n", frame(DONE, "lower") + b"0\r\n\r\n"]
    got, sink, _, conn = asyncio.run(relay(reads))
    assert got == b"data: 0\n\n" + inner + DONE
    assert sink.taken == 0
    assert conn.reusable()


def test_bytes_after_the_body_are_never_taken_as_a_frame() -> None:
    # The terminator and a stray frame-shaped read arrive before the pushing task runs again: the
    # sink is still installed, but the response is over, so the stray bytes are not relayed.
    reads = [frame(b"data: 0\n\n", "lower"), frame(b"data: 1\n\n", "lower"), b"0\r\n\r\n",
             frame(b"data: stray\n\n", "lower")]
    got, _, writer, _ = asyncio.run(relay(reads))
    assert got == b"data: 0\n\ndata: 1\n\n"
    assert not any(b"stray" in f for f in writer.frames)
