"""gateway/transport/h1.py's push mode: however the upstream's chunked body is framed and split into
reads, the sink gets exactly its bytes in order, once per read, and the connection stays reusable.

The upstream socket is the seam here: a recording transport, reads fed to `data_received`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import UpstreamFailed
from gateway.transport.h1 import _Conn, _Pool

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


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


def frame(payload: bytes, style: str) -> bytes:
    size = {"lower": b"%x", "upper": b"%X", "zeros": b"%04x", "ext": b"%x;n=v"}[style]
    return size % len(payload) + b"\r\n" + payload + b"\r\n"


async def push(reads: list[bytes], stop_after: int = -1) -> tuple[list[bytes], bytes, _Conn]:
    """Head, then `reads` fed one by one to a pushing connection (the last read ends the body).
    The sink stops after `stop_after` calls (never when -1); what it did not take is read after.
    Returns what the sink got, call by call, the rest, and the connection."""
    loop = asyncio.get_running_loop()
    conn = _Conn(_Pool("127.0.0.1", 1, loop))
    conn.connection_made(Socket())  # type: ignore[arg-type]
    head = conn.start(b"POST / HTTP/1.1\r\n\r\n")
    conn.data_received(HEAD)
    await head
    got: list[bytes] = []

    def sink(chunk: bytes, now: float) -> bool:
        got.append(chunk)
        return len(got) != stop_after

    pushing = asyncio.ensure_future(conn.push(sink))
    await asyncio.sleep(0)
    for read in reads:
        conn.data_received(read)
    await pushing
    rest = b""
    while chunk := await conn.readany():
        rest += chunk
    return got, rest, conn


@settings(max_examples=60, deadline=None)
@given(
    payloads=st.lists(st.binary(min_size=1, max_size=30), min_size=1, max_size=12),
    styles=st.lists(st.sampled_from(["lower", "upper", "zeros", "ext"]), min_size=12, max_size=12),
    cuts=st.lists(st.integers(min_value=1, max_value=40), max_size=30),
    stop_after=st.sampled_from([-1, 1, 3]),
)
def test_any_framing_and_any_reads_give_the_sink_every_byte(
    payloads: list[bytes], styles: list[str], cuts: list[int], stop_after: int
) -> None:
    body = b"".join(frame(p, styles[i]) for i, p in enumerate(payloads)) + b"0\r\n\r\n"
    reads, pos = [], 0
    for n in cuts:  # anywhere: mid size line, mid payload, mid CRLF
        reads.append(body[pos:pos + n])
        pos += n
    reads.append(body[pos:])
    got, rest, conn = asyncio.run(push([r for r in reads if r], stop_after))
    assert b"".join(got) + rest == b"".join(payloads)
    assert all(got)  # never called with nothing
    assert conn.reusable()


def test_one_read_of_several_frames_reaches_the_sink_as_one_chunk() -> None:
    # One downstream write per upstream read, however many events a burst packed into it.
    reads = [frame(b"data: a\n\n", "lower") * 3 + b"0\r\n\r\n"]
    got, _, conn = asyncio.run(push(reads))
    assert got == [b"data: a\n\n" * 3]
    assert conn.reusable()


@pytest.mark.parametrize("bad", [b"+9\r\ndata: a\n\n\r\n", b"0x9\r\ndata: a\n\n\r\n"])
def test_a_size_line_the_parser_refuses_fails_the_stream(bad: bytes) -> None:
    first = frame(b"data: 0\n\n", "lower")
    with pytest.raises(UpstreamFailed, match="malformed response"):
        asyncio.run(push([first, bad]))


def test_bytes_after_the_body_are_not_the_sinks() -> None:
    # The terminator and a stray frame-shaped read arrive before the pushing task runs again:
    # the response is over, so the stray bytes are not relayed, and the connection not reused.
    reads = [frame(b"data: 0\n\n", "lower"), b"0\r\n\r\n", frame(b"data: stray\n\n", "lower")]
    got, rest, conn = asyncio.run(push(reads))
    assert b"".join(got) + rest == b"data: 0\n\n"
    assert not conn.reusable()
