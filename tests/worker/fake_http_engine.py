"""A stand-in for vLLM's API server with worker.drain's middleware in front (launcher drain tests).

Serves GET /health (200) and POST /v1/completions: a stream of EVENTS events, one every
GAP_S seconds, then [DONE]. The middleware reads LLMSERVE_DRAIN_FILE like it does in vLLM.

usage: fake_http_engine.py PORT
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import uvicorn

from worker.drain import DrainMiddleware

EVENTS = 10
GAP_S = 0.2


async def engine(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["path"] == "/health":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})
    for i in range(EVENTS):
        await send({"type": "http.response.body", "body": b'data: {"i": %d}\n\n' % i,
                    "more_body": True})
        await asyncio.sleep(GAP_S)
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


if __name__ == "__main__":
    uvicorn.run(DrainMiddleware(engine), host="127.0.0.1", port=int(sys.argv[1]),
                log_level="warning")
