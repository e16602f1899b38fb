"""The floor of an ASGI relay: uvicorn (httptools, uvloop) and the gateway's own upstream transport,
with nothing of the gateway between them.

One raw ASGI app: read the body, POST it upstream with `H1Transport`, send the response head, then
each upstream read as one ASGI body message. No middleware, flow control, routing, SSE relay,
metrics or edge protocol. Beside `bench/floor_proxy.py` (bytes through a bare asyncio protocol) and
the gateway in `bench.paired_cpu` (`LABEL=@asgi-floor`), it splits the gateway's CPU per request
into what uvicorn's ASGI cycle costs and what the gateway's own layers add.

    python -m bench.asgi_floor --port 9300 --upstream 127.0.0.1:9100
"""

from __future__ import annotations

import sys

import uvicorn
from starlette.types import Receive, Scope, Send

from bench.floor_proxy import floor_args
from gateway.settings import Timeouts
from gateway.transport.h1 import H1Transport

_SSE = [(b"content-type", b"text/event-stream; charset=utf-8")]


class Relay:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.transport = H1Transport(Timeouts(connect_s=5, first_byte_s=60, idle_s=60,
                                              total_s=600))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                kind = (await receive())["type"]
                if kind == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif kind == "lifespan.shutdown":
                    await self.transport.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["method"] == "GET":
            status, data = await self.transport.get(self.upstream + scope["path"], 5)
            await send({"type": "http.response.start", "status": status, "headers": []})
            await send({"type": "http.response.body", "body": data})
            return
        resp = await self.transport.post(self.upstream + scope["path"], body,
                                         {"content-type": "application/json"}, streaming=True)
        try:
            await send({"type": "http.response.start", "status": resp.status, "headers": _SSE})
            while chunk := await resp.readany():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except BaseException:
            resp.close()
            raise
        resp.release()
        await send({"type": "http.response.body", "body": b""})


def main() -> int:
    args = floor_args("bench.asgi_floor", __doc__)
    uvicorn.run(Relay(f"http://{args.upstream}"), host="127.0.0.1", port=args.port, loop="uvloop",
                http="httptools", log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
