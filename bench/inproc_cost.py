"""The gateway's own Python per request, without sockets: the whole ASGI app (middleware, flow
control, routing, relay, metrics) driven in one process against an in-memory upstream.

Why: CPU per request measured on a server (bench.paired_cpu) moves by +-5% between contenders that
run the same code, so a change worth 2% cannot be seen there. This measures only the instructions
the gateway runs per request, hot in the caches, to within about 2% between runs: the place to
judge a Python trim before confirming it on the server. It is not a server's cost: at a real pace
the same code runs with cold caches, beside uvicorn's request cycle and the kernel's I/O, and costs
several times more (docs/benchmarks.md).

    python -m bench.inproc_cost [--requests 20000] [--whole] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import time
from collections.abc import Mapping

from starlette.types import Message

from gateway.app import GatewayApp, build_app
from gateway.settings import GatewaySettings
from gateway.transport.base import BodySink

MODEL = "demo"
_EVENT = (b'data: {"id":"c","object":"chat.completion.chunk","model":"demo","choices":[{"index":0,'
          b'"delta":{"content":"hi"},"finish_reason":null}]}\n\n')
_USAGE = (b'data: {"id":"c","object":"chat.completion.chunk","model":"demo","choices":[],'
          b'"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}\n\n')
_DONE = b"data: [DONE]\n\n"
_WHOLE = (b'{"id":"c","object":"chat.completion","model":"demo","choices":[{"index":0,"message":'
          b'{"role":"assistant","content":"hi"},"finish_reason":"stop"}],'
          b'"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}')


class _Response:
    """A one-token answer as one upstream read (what a 1-token stream is at a real pace)."""

    status = 200

    def __init__(self, streaming: bool) -> None:
        self._parts = [_EVENT + _USAGE + _DONE if streaming else _WHOLE]

    async def readany(self) -> bytes:
        if self._parts:
            # The answer arrives on a later turn of the loop, as from a socket: the proxy's task
            # suspends and resumes through its whole chain of coroutines, as in a server.
            await asyncio.sleep(0)
            return self._parts.pop()
        return b""

    async def read(self) -> bytes:
        return b"".join(self._parts)

    async def push(self, sink: BodySink) -> None:
        raise AssertionError("no direct writer without the edge protocol: the relay pulls")

    def close(self) -> None:
        pass

    def release(self) -> None:
        pass


class MemoryUpstream:
    """A `Transport` answering every POST at once and every probe as a healthy engine of MODEL."""

    async def post(self, url: str, body: bytes, headers: Mapping[str, str], *,
                   streaming: bool) -> _Response:
        await asyncio.sleep(0)  # the response head, on a later turn of the loop
        return _Response(streaming)

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        if url.endswith("/v1/models"):
            return 200, b'{"object":"list","data":[{"id":"%s"}]}' % MODEL.encode()
        return 200, b"{}"

    async def close(self) -> None:
        pass


def request_body(stream: bool) -> bytes:
    return (b'{"model":"%s","stream":%s,"max_tokens":1,"messages":[{"role":"user","content":"hi"}]}'
            % (MODEL.encode(), b"true" if stream else b"false"))


class Driver:
    """Calls the app as uvicorn would, one request at a time, and keeps what it answered."""

    def __init__(self, app: GatewayApp, stream: bool) -> None:
        self._app = app
        body = request_body(stream)
        self._body = body
        self._headers = [(b"host", b"gateway"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]
        self.status = 0
        self.last = b""

    async def one(self) -> None:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "POST", "scheme": "http", "path": "/v1/chat/completions",
                 "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
                 "headers": self._headers, "client": ("127.0.0.1", 1),
                 "server": ("127.0.0.1", 2)}
        pending = [{"type": "http.request", "body": self._body, "more_body": False}]
        out: list[bytes] = []

        async def receive() -> Message:
            if pending:
                return pending.pop()
            # The client stays: after its body there is nothing more to receive (the proxy's
            # disconnect watcher waits here until it is cancelled).
            await asyncio.get_running_loop().create_future()
            raise AssertionError("unreachable")

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.status = message["status"]
            else:
                out.append(message.get("body", b""))

        await self._app(scope, receive, send)
        self.last = b"".join(out)
        # Let the loop run between requests, as a server's does: without a server's direct writer
        # the proxy watches for a disconnect in a task of its own, cancelled at the end, and that
        # cancellation completes only when the loop gets to it (else the tasks pile up, and the
        # collector's runs over them were 40% of the time measured).
        await asyncio.sleep(0)


async def measure(requests: int, stream: bool, profile: bool) -> tuple[float, Driver,
                                                                      pstats.Stats | None]:
    """CPU seconds per request (process time), after as many warm-up requests as measured."""
    settings = GatewaySettings(backends=["http://127.0.0.1:9"], health_interval_s=60)
    app = build_app(settings, transport=MemoryUpstream())
    router = app.state.router
    await router.start()
    try:
        deadline = time.monotonic() + 10
        while not router.knows_model(MODEL):  # the first probe has not answered yet
            if time.monotonic() > deadline:
                raise RuntimeError("the in-memory upstream was never probed up")
            await asyncio.sleep(0.01)
        driver = Driver(app, stream)
        for _ in range(min(requests, 2000)):
            await driver.one()
        prof = cProfile.Profile() if profile else None
        t0 = time.process_time()
        if prof is not None:
            prof.enable()
        for _ in range(requests):
            await driver.one()
        if prof is not None:
            prof.disable()
        per = (time.process_time() - t0) / requests
    finally:
        await router.stop()
    return per, driver, pstats.Stats(prof) if prof is not None else None


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.inproc_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=20000, help="measured requests (default 20000)")
    p.add_argument("--whole", action="store_true", help="non-streamed answers (default: streamed)")
    p.add_argument("--profile", action="store_true",
                   help="cProfile the measured requests and print the top functions (slows all)")
    args = p.parse_args()
    if args.requests < 1:
        p.error("--requests must be at least 1")
    import uvloop

    per, driver, stats = uvloop.run(measure(args.requests, not args.whole, args.profile))
    if driver.status != 200:
        print(f"error: the gateway answered {driver.status}: {driver.last[:200]!r}",
              file=sys.stderr)
        return 1
    kind = "non-streamed" if args.whole else "streamed"
    print(f"{per * 1e6:.1f} us of CPU per {kind} request ({args.requests} requests, in process)")
    if stats is not None:
        stats.sort_stats("tottime").print_stats(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
