"""Request drain inside vLLM's API server: a pure ASGI middleware loaded with ``--middleware``.

Why: vLLM's own SIGTERM handling cannot drain behind a load balancer. With ``--shutdown-timeout
0`` (its default) it aborts every request in flight; with a timeout it finishes them, but its
engine answers each request that arrives meanwhile with an empty, aborted completion while
``/health`` still says 200, so a router keeps sending it traffic that fails silently.

So the launcher drains first and signals after (``Launcher.drain_requests``). It creates the
file named by ``LLMSERVE_DRAIN_FILE``; from then on this middleware

- answers ``GET /health`` with 503 and ``{"status": "draining", "in_flight": N}``: routers and
  readiness probes take the replica out, and the launcher reads N to know when it is empty;
- answers every new inference request (``POST /v1/...``) with an OpenAI-shaped 503 whose code is
  ``draining``, before vLLM sees it: nothing reached the client, so a gateway retries it on
  another replica (llmserve's also takes the replica out at once on that code);
- lets the requests already in flight run to their end.

N counts the requests of this API server process only; one process is vLLM's default (with
``--api-server-count`` > 1 each process would report its own share).
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

DRAIN_FILE_ENV = "LLMSERVE_DRAIN_FILE"
DRAINING_CODE = "draining"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_REFUSED = json.dumps({"error": {
    "message": "this replica is draining for a restart; retry on another replica",
    "type": "service_unavailable", "param": None, "code": DRAINING_CODE,
}}).encode()


class DrainMiddleware:
    def __init__(self, app: ASGIApp, drain_file: str | None = None) -> None:
        self.app = app
        self.drain_file = drain_file or os.environ.get(DRAIN_FILE_ENV) or None
        self.in_flight = 0

    def draining(self) -> bool:
        # One stat per request: microseconds against an engine's milliseconds, and the launcher
        # needs no channel into this process beyond a file it can create.
        return self.drain_file is not None and os.path.exists(self.drain_file)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.drain_file is None:
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path == "/health":
            if self.draining():
                body = json.dumps({"status": "draining", "in_flight": self.in_flight}).encode()
                await _answer(send, 503, body)
                return
            await self.app(scope, receive, send)
            return
        if scope["method"] != "POST" or not path.startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        if self.draining():
            await _answer(send, 503, _REFUSED)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


async def _answer(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
    ]})
    await send({"type": "http.response.body", "body": body})
