"""A near-free OpenAI-compatible upstream, for measuring the gateway's own overhead.

Raw asyncio protocol, HTTP/1.1 keep-alive, every response pre-built as bytes: the upstream must
never be the bottleneck of the benchmark. Streaming answers send EACH SSE event as its own write
(own chunk of the chunked encoding), like an engine emitting one token at a time. It also serves
the fast test tier as the seam where a real engine would be (`start_in_thread`).

    python -m bench.fake_upstream --port 9100 --tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

MODEL = "demo"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


@dataclass
class Behaviour:
    tokens: int = 64
    model: str = MODEL
    token_delay_s: float = 0.0  # per token: makes streams long enough to disconnect from
    fail_status: int = 0  # answer every completion with this status instead
    drop_after: int = -1  # close the connection after this many events (-1: never)


class _Responses:
    """Pre-built bytes for each (kind, stream, usage, tokens) shape."""

    def __init__(self, b: Behaviour) -> None:
        self.b = b
        self._cache: dict[tuple[str, bool, bool, int], list[bytes]] = {}

    def events(self, kind: str, include_usage: bool, n: int) -> list[bytes]:
        key = (kind, True, include_usage, n)
        if key not in self._cache:
            m = self.b.model
            usage = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}
            if kind == "chat":
                base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk",
                        "created": 1, "model": m}
                ev = [_sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant",
                                                                       "content": ""}}]})]
                ev += [_sse({**base, "choices": [{"index": 0, "delta": {"content": " tok"},
                                                  "finish_reason": None}]}) for _ in range(n)]
                ev.append(_sse({**base, "choices": [{"index": 0, "delta": {},
                                                     "finish_reason": "length"}]}))
            else:
                base = {"id": "cmpl-fake", "object": "text_completion", "created": 1, "model": m}
                ev = [_sse({**base, "choices": [{"index": 0, "text": " tok",
                                                 "finish_reason": None}]}) for _ in range(n)]
                ev.append(_sse({**base, "choices": [{"index": 0, "text": "",
                                                     "finish_reason": "length"}]}))
            if include_usage:
                ev.append(_sse({**base, "choices": [], "usage": usage}))
            ev.append(b"data: [DONE]\n\n")
            self._cache[key] = [_chunk(e) for e in ev]
        return self._cache[key]

    def whole(self, kind: str, n: int) -> bytes:
        m = self.b.model
        usage = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": 5 + n}
        if kind == "chat":
            obj = {"id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": m,
                   "choices": [{"index": 0, "message": {"role": "assistant",
                                                        "content": " tok" * n},
                                "finish_reason": "length"}], "usage": usage}
        else:
            obj = {"id": "cmpl-fake", "object": "text_completion", "created": 1, "model": m,
                   "choices": [{"index": 0, "text": " tok" * n, "finish_reason": "length"}],
                   "usage": usage}
        return json.dumps(obj).encode()


_SSE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
             b"transfer-encoding: chunked\r\n\r\n")


def _plain(status: int, body: bytes) -> bytes:
    return (b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (status, len(body), body))


class _Protocol(asyncio.Protocol):
    def __init__(self, upstream: FakeUpstream) -> None:
        self.u = upstream
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self._next()

    def _next(self) -> None:
        head_end = self.buf.find(b"\r\n\r\n")
        if head_end < 0:
            return
        head = self.buf[:head_end].decode("latin-1")
        lines = head.split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        length = 0
        for line in lines[1:]:
            k, _, v = line.partition(":")
            if k.strip().lower() == "content-length":
                length = int(v)
        if len(self.buf) < head_end + 4 + length:
            return
        body = self.buf[head_end + 4 : head_end + 4 + length]
        self.buf = self.buf[head_end + 4 + length :]
        self.busy = True
        asyncio.ensure_future(self._serve(method, path, body))

    async def _serve(self, method: str, path: str, body: bytes) -> None:
        t = self.transport
        if t is None:
            return
        u = self.u
        u.requests += 1
        if path == "/health":
            t.write(_plain(200, b"{}"))
        elif path == "/v1/models":
            t.write(_plain(200, u.models_body))
        elif method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            await self._completion("chat" if "chat" in path else "completion", body)
        else:
            t.write(_plain(404, b'{"error":{"message":"not found","type":"x","param":null,'
                                b'"code":null}}'))
        self.busy = False
        if self.transport is not None and self.buf:
            self._next()

    async def _completion(self, kind: str, raw: bytes) -> None:
        u = self.u
        u.completions += 1
        b = u.behaviour
        t = self.transport
        assert t is not None
        if b.fail_status:
            t.write(_plain(b.fail_status, b'{"error":{"message":"scripted failure",'
                                          b'"type":"server_error","param":null,"code":null}}'))
            return
        req = json.loads(raw)
        n = int(req.get("max_tokens") or b.tokens)
        if not req.get("stream"):
            t.write(_plain(200, u.responses.whole(kind, n)))
            return
        so = req.get("stream_options") or {}
        events = u.responses.events(kind, bool(so.get("include_usage")), n)
        t.write(_SSE_HEAD)
        for i, ev in enumerate(events):
            if i == b.drop_after:
                t.close()
                return
            if b.token_delay_s:
                await asyncio.sleep(b.token_delay_s)
                if self.transport is None:
                    u.aborted += 1
                    return
            t.write(ev)
        t.write(b"0\r\n\r\n")


class FakeUpstream:
    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.behaviour = behaviour or Behaviour()
        self.responses = _Responses(self.behaviour)
        self.models_body = json.dumps({"object": "list", "data": [
            {"id": self.behaviour.model, "object": "model", "created": 1, "owned_by": "fake"}]}
        ).encode()
        self.requests = 0
        self.completions = 0  # completion requests only (probes excluded)
        self.aborted = 0  # streams whose client went away before the end
        self.port = 0

    async def serve(self, host: str, port: int) -> asyncio.base_events.Server:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Protocol(self), host, port, backlog=4096)
        self.port = server.sockets[0].getsockname()[1]
        return server


@contextmanager
def start_in_thread(behaviour: Behaviour | None = None) -> Iterator[FakeUpstream]:
    """Run a FakeUpstream on 127.0.0.1 (random port) in a background thread with its own loop."""
    up = FakeUpstream(behaviour)
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: list[asyncio.base_events.Server] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        holder.append(loop.run_until_complete(up.serve("127.0.0.1", 0)))
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield up
    finally:
        async def close() -> None:
            holder[0].close()
            await holder[0].wait_closed()
        asyncio.run_coroutine_threadsafe(close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.fake_upstream", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9100)
    p.add_argument("--tokens", type=int, default=64, help="tokens per answer without max_tokens")
    p.add_argument("--model", default=MODEL)
    args = p.parse_args()
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass

    async def run() -> None:
        up = FakeUpstream(Behaviour(tokens=args.tokens, model=args.model))
        server = await up.serve(args.host, args.port)
        async with server:
            await server.serve_forever()

    asyncio.run(run())


if __name__ == "__main__":
    main()
