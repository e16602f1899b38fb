"""A fake vLLM replica with LoRA adapters, for the gateway's adapter tests: the seam where a real
engine would be, answering what vLLM answers about adapters.

- `GET /v1/models`: the base model, and each loaded adapter with `parent` (the base) and `root`
  (its directory), as vLLM lists them;
- `POST /v1/load_lora_adapter` / `unload_lora_adapter`: vLLM's codes (400 "has already been
  loaded", 404 for an unknown name or a directory that does not exist);
- `POST /v1/chat/completions`: 404 for a model it does not serve, else an answer whose text is
  `<model>@<replica name>` (streamed or whole, with usage), so a test sees who answered what;
- `restart()`: down (503 on every path) for a while, then up with only its declared adapters, as
  a restarted engine comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import httpx
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.ports import free_port
from tests.threadserver import serve_in_thread

# Directories a load may name; anything else "does not exist" (vLLM's 404).
VOLUME = "/models/"


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "NotFoundError" if status == 404
                                   else "BadRequestError", "param": None, "code": status}},
                        status_code=status)


@dataclass
class LoraReplica:
    name: str
    base: str = "base-model"
    declared: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # before the answer: keeps requests in flight
    port: int = 0
    loaded: dict[str, str] = field(default_factory=dict)
    down: bool = False
    answered: Counter[str] = field(default_factory=Counter)  # model -> completions answered
    loads: list[str] = field(default_factory=list)  # adapter names, every successful load
    listed: int = 0  # /v1/models answered while up: the gateway's probe rounds
    in_flight: int = 0

    def __post_init__(self) -> None:
        self.loaded = dict(self.declared)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def restart(self, down_s: float) -> None:
        """Down for `down_s`, then back with its declared adapters only (an engine restart)."""
        self.down = True

        def up() -> None:
            self.loaded = dict(self.declared)
            self.down = False

        threading.Timer(down_s, up).start()

    def app(self) -> Starlette:
        async def health(_: Request) -> Response:
            return PlainTextResponse("", status_code=503 if self.down else 200)

        async def models(_: Request) -> Response:
            if self.down:
                return _error(503, "restarting")
            self.listed += 1
            cards = [{"id": self.base, "object": "model", "root": f"{VOLUME}{self.base}",
                      "parent": None}]
            cards += [{"id": n, "object": "model", "root": p, "parent": self.base}
                      for n, p in sorted(self.loaded.items())]
            return JSONResponse({"object": "list", "data": cards})

        async def load(request: Request) -> Response:
            body = orjson.loads(await request.body())
            name, path = body.get("lora_name"), body.get("lora_path")
            if name in self.loaded:
                return _error(400, f"The lora adapter '{name}' has already been loaded.")
            if not isinstance(path, str) or not path.startswith(VOLUME) or "missing" in path:
                return _error(404, f"Loading lora {name} failed: No adapter found for {path}")
            self.loaded[name] = path
            self.loads.append(name)
            return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

        async def unload(request: Request) -> Response:
            name = orjson.loads(await request.body()).get("lora_name")
            if self.loaded.pop(name, None) is None:
                return _error(404, f"The lora adapter '{name}' cannot be found.")
            return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

        async def chat(request: Request) -> Response:
            if self.down:
                return _error(503, "restarting")
            body = orjson.loads(await request.body())
            model = body.get("model")
            if model != self.base and model not in self.loaded:
                return _error(404, f"The model `{model}` does not exist.")
            self.in_flight += 1
            try:
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
            finally:
                self.in_flight -= 1
            self.answered[model] += 1
            text = f"{model}@{self.name}"
            usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
            if not body.get("stream"):
                return JSONResponse({"id": "x", "object": "chat.completion", "model": model,
                                     "choices": [{"index": 0, "finish_reason": "stop",
                                                  "message": {"role": "assistant",
                                                              "content": text}}],
                                     "usage": usage})

            async def events() -> AsyncIterator[bytes]:
                def chunk(delta: dict[str, str], finish: str | None = None) -> bytes:
                    return b"data: " + orjson.dumps({
                        "id": "x", "object": "chat.completion.chunk", "model": model,
                        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
                    }) + b"\n\n"
                yield chunk({"role": "assistant", "content": ""})
                yield chunk({"content": text})
                yield chunk({}, "stop")
                if (body.get("stream_options") or {}).get("include_usage"):
                    yield b"data: " + orjson.dumps({"id": "x", "choices": [],
                                                    "usage": usage}) + b"\n\n"
                yield b"data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

        return Starlette(routes=[
            Route("/health", health), Route("/v1/models", models),
            Route("/v1/load_lora_adapter", load, methods=["POST"]),
            Route("/v1/unload_lora_adapter", unload, methods=["POST"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
        ])


@contextlib.contextmanager
def serve(*replicas: LoraReplica) -> Iterator[tuple[LoraReplica, ...]]:
    """Each replica on its `port` (a free loopback port if 0), in a thread of its own, until the
    block ends."""
    with contextlib.ExitStack() as stack:
        servers = []
        for r in replicas:
            r.port = r.port or free_port()
            servers.append(stack.enter_context(serve_in_thread(uvicorn.Config(
                r.app(), host="127.0.0.1", port=r.port, log_level="error", lifespan="off"))))
            assert servers[-1].started, f"fake replica {r.name} did not start"
        try:
            yield replicas
        finally:
            for server in servers:  # all at once, then each is joined
                server.stop()


async def answered_by_a_new_replica(waiting: asyncio.Task[httpx.Response], base: str,
                                    port: int) -> None:
    """A replica of `base` with the "chat" adapter declared comes up on `port` (where the gateway
    expects it): the request `waiting` for it is answered there, by the adapter."""
    replica = LoraReplica("r0", base=base, port=port, declared={"chat": "/models/adapters/chat/v1"})
    with serve(replica):
        resp = await waiting
    assert resp.status_code == 200, resp.text
    assert "chat@r0" in resp.text
