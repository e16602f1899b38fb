"""A near-free OpenAI-compatible upstream: the seam where a vLLM server would be.

Serves `GET /health`, `GET /v1/models` (one model), `POST /v1/chat/completions` and
`POST /v1/completions`, non-streaming (JSON with usage) or streaming (SSE over chunked transfer
encoding, chunks shaped like vLLM's: chat sends a role chunk, one content delta per token, a finish
chunk, the usage chunk `{"choices":[],"usage":{...}}` when `stream_options.include_usage`, then
`data: [DONE]`; with `continuous_usage_stats` too, every choice chunk carries the running usage, as
vLLM's). `max_tokens` (or `max_completion_tokens`) sets the answer's length.

Why a raw asyncio Protocol and not aiohttp.web: measured on one pinned core, aiohttp.web's
low-level server spent ~3x the user CPU per streamed request; here every answer is pre-built bytes
and a request costs one JSON parse plus the socket writes.

Each SSE event is its own socket write by default, as an engine emits them. That is also what makes
an upstream expensive: on this machine a loopback write costs ~6 us of kernel time, so 67 writes per
64-token answer cap one core at ~2,000 streamed req/s. `events_per_write` groups events per write
(each event still its own chunk of the chunked encoding) for throughput benchmarks that need the
upstream far cheaper than the proxy under test.

Use it from tests, in a background thread or in the running event loop:

    with start_fake_upstream(tokens=8, token_delay_s=0.01) as up:      # thread
        httpx.post(up.url + "/v1/completions", json={...})
    async with start_fake_upstream(fail_status=503) as up:             # current loop
        ...
    up.requests, up.completions, up.aborted, up.last_request, up.last_headers

or as a process:

    python -m bench.fake_upstream --port 9100 --tokens 64 [--events-per-write 8]
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any

import orjson
from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from devstack.cli import Parser

MODEL = "demo"
FINGERPRINT = "fp-fake"  # vLLM's system_fingerprint, placed where vLLM places it
# The strings pydantic's lax mode (vLLM's request models) reads as booleans.
_LAX_TRUE = frozenset(("1", "on", "t", "true", "y", "yes"))
_LAX_BOOLS = _LAX_TRUE | frozenset(("0", "off", "f", "false", "n", "no"))
_PROMPT_TOKENS = 5  # usage.prompt_tokens per prompt: the fake does not tokenize


class Behaviour(BaseSettings):
    """What the fake upstream does; every field is also a CLI flag (`--token-delay-s`, ...)."""

    model_config = SettingsConfigDict(env_prefix="FAKE_UPSTREAM_", frozen=True)

    tokens: int = Field(64, ge=0, le=10_000_000,
                        description="tokens per answer when the request sets no max_tokens")
    model: str = Field(MODEL, min_length=1, description="the one model served")
    token_delay_s: float = Field(0.0, ge=0, le=60,
                                 description="sleep before each streamed event (and tokens x this "
                                             "before a non-streamed answer)")
    first_token_delay_s: float = Field(0.0, ge=0, le=60,
                                       description="sleep before the first streamed event "
                                                   "(time to first token), instead of "
                                                   "token_delay_s; the first token follows "
                                                   "the role event at once, as vLLM sends them")
    tail_delay_s: float = Field(-1.0, ge=-1, le=60,
                                description="sleep before each streamed event after the last "
                                            "token (finish, usage, [DONE]); -1: token_delay_s, "
                                            "as for a token. vLLM writes them in the step of the "
                                            "last token (whose chunk carries finish_reason), "
                                            "one after another: 0 is its pace")
    fail_status: int = Field(0, description="answer every completion with this HTTP status "
                                            "(400-599) and an OpenAI error body; 0: never")
    max_answer_tokens: int = Field(0, ge=0, description="answers stop at this many tokens, "
                                                       "whatever max_tokens asks (an engine at "
                                                       "its context length); 0: no cap")
    fail_ratio: float = Field(0.0, ge=0, le=1,
                              description="answer this share of completions with fail_status "
                                          "(evenly spread: 0.5 fails every other one); 0: all "
                                          "of them, when fail_status is set")
    fail_body: str = Field("", description="body of the fail_status answers (text/html when it "
                                           "starts with '<'); empty: an OpenAI error object")
    drop_after: int = Field(-1, ge=-1, description="close the connection after this many SSE "
                                                   "events of a stream; -1: never")
    error_after: int = Field(-1, ge=-1,
                             description="after this many SSE events of a stream, send vLLM's "
                                         "in-band error event and [DONE] instead of the rest "
                                         "(an engine failing mid-generation); -1: never")
    end_delay_s: float = Field(0.0, ge=0, le=60,
                               description="sleep between a stream's last event ([DONE]) and the "
                                           "chunked-encoding terminator, sent as its own write")
    usage_json: str = Field("", description="raw JSON sent as every answer's `usage` instead of "
                                            "the real counts (a malformed upstream); empty: the "
                                            "real counts")
    max_num_seqs: int = Field(0, ge=0, le=100_000,
                              description="completions served at once, like an engine's batch "
                                          "(vLLM's --max-num-seqs); later ones wait for a slot "
                                          "in arrival order, and their first token with them; "
                                          "0: no limit")
    echo_other: bool = Field(False, description="answer any other path (an engine endpoint the "
                                                "gateway forwards as it is) with a JSON echo of "
                                                "the request, or, when its JSON body asks to "
                                                "stream, an SSE stream without [DONE] (as the "
                                                "Responses API's)")
    events_per_write: int = Field(1, ge=1, le=1024,
                                  description="SSE events per socket write (1: each its own write, "
                                              "like an engine)")

    @field_validator("fail_status")
    @classmethod
    def _status(cls, v: int) -> int:
        if v != 0 and not 400 <= v <= 599:
            raise ValueError("must be 0 (never fail) or an HTTP error status 400-599")
        return v


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _sse(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _error_body(message: str, kind: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None,
                                   "code": None}})


def _plain(status: int, body: bytes, close: bool = False) -> bytes:
    conn = b"connection: close\r\n" if close else b""
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s"
            % (status, _REASONS.get(status, b"Error"), len(body), conn, body))


_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed",
            500: b"Internal Server Error", 503: b"Service Unavailable"}
_SSE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
             b"transfer-encoding: chunked\r\n\r\n")
_END = b"0\r\n\r\n"
_CACHE_MAX = 64  # distinct answer shapes kept pre-built


class _Answers:
    """Pre-built bytes per answer shape, so serving a request costs no JSON encoding."""

    def __init__(self, b: Behaviour) -> None:
        self.b = b
        self._events: dict[tuple[str, bool, int, int, bool, bool], list[bytes]] = {}
        self._whole: dict[tuple[str, int, int], bytes] = {}

    def _usage(self, n: int, prompts: int) -> Any:
        if self.b.usage_json:
            return orjson.loads(self.b.usage_json)
        p = _PROMPT_TOKENS * prompts
        return {"prompt_tokens": p, "completion_tokens": n * prompts, "total_tokens": p + n * prompts}

    def events(self, kind: str, include_usage: bool, n: int, prompts: int,
               continuous: bool = False, ids: bool = False) -> list[bytes]:
        """The stream's SSE events, each already framed as one chunk of the chunked encoding;
        `continuous`: every choice chunk carries the usage so far; `ids`: the token ids too, as
        vLLM's `return_token_ids` (the prompt's in the first event, each token's in its own)."""
        key = (kind, include_usage, n, prompts, continuous, ids)
        cached = self._events.get(key)
        if cached is not None:
            return cached
        m = self.b.model
        ev: list[bytes] = []
        if kind == "chat":
            base: dict[str, Any] = {"id": "chatcmpl-fake", "object": "chat.completion.chunk",
                                    "created": 1, "model": m}
            ev.append(_sse({**base, "choices": [{"index": 0, "delta": {"role": "assistant",
                                                                       "content": ""},
                                                 "logprobs": None, "finish_reason": None}]}))
            tok = _sse({**base, "choices": [{"index": 0, "delta": {"content": " tok"},
                                             "logprobs": None, "finish_reason": None}]})
            ev += [tok] * n
            # As vLLM: the fingerprint on terminal chunks, or on the usage chunk when asked.
            ev.append(_sse({**base, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                                 "finish_reason": "length"}],
                            **({} if include_usage else {"system_fingerprint": FINGERPRINT})}))
        else:
            base = {"id": "cmpl-fake", "object": "text_completion", "created": 1, "model": m}
            # vLLM interleaves the prompts of a list token by token, each with its own index.
            toks = [_sse({**base, "choices": [{"index": i, "text": " tok", "logprobs": None,
                                               "finish_reason": None}]}) for i in range(prompts)]
            for _ in range(n):
                ev += toks
            ev += [_sse({**base, "choices": [{"index": i, "text": "", "logprobs": None,
                                              "finish_reason": "length"}],
                         **({} if include_usage else {"system_fingerprint": FINGERPRINT})})
                   for i in range(prompts)]
        if continuous:
            ev = self._running_usage(ev, prompts)
        if ids:
            ev = self._token_ids(ev, kind)
        if include_usage:
            ev.append(_sse({**base, "choices": [], "usage": self._usage(n, prompts),
                            "system_fingerprint": FINGERPRINT}))
        ev.append(b"data: [DONE]\n\n")
        framed = [_chunk(e) for e in ev]
        if len(self._events) >= _CACHE_MAX:
            self._events.clear()
        self._events[key] = framed
        return framed

    def _token_ids(self, events: list[bytes], kind: str) -> list[bytes]:
        """`events` with vLLM's token id fields: token i is id 100 + i."""
        out: list[bytes] = []
        done = 0
        for e in events:
            obj = orjson.loads(e.removeprefix(b"data: "))
            choice = obj["choices"][0]
            first = not out
            if kind == "chat" and first:
                obj["prompt_token_ids"] = list(range(1, _PROMPT_TOKENS + 1))
            else:
                if kind == "completion":
                    choice["prompt_token_ids"] = (list(range(1, _PROMPT_TOKENS + 1))
                                                  if first else None)
                token = bool(choice.get("text") or choice.get("delta", {}).get("content"))
                choice["token_ids"] = [100 + done] if token else []
                done += token
            out.append(_sse(obj))
        return out

    def _running_usage(self, events: list[bytes], prompts: int) -> list[bytes]:
        """`events` with the usage so far on each, counting one token per text-bearing event."""
        p, done, out = _PROMPT_TOKENS * prompts, 0, []
        for e in events:
            obj = orjson.loads(e.removeprefix(b"data: "))
            choice = obj["choices"][0]
            if choice.get("text") or choice.get("delta", {}).get("content"):
                done += 1
            obj["usage"] = {"prompt_tokens": p, "completion_tokens": done,
                            "total_tokens": p + done}
            out.append(_sse(obj))
        return out

    def whole(self, kind: str, n: int, prompts: int) -> bytes:
        key = (kind, n, prompts)
        cached = self._whole.get(key)
        if cached is not None:
            return cached
        m, text = self.b.model, " tok" * n
        obj: dict[str, Any]
        if kind == "chat":
            obj = {"id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": m,
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                "logprobs": None, "finish_reason": "length"}]}
        else:
            obj = {"id": "cmpl-fake", "object": "text_completion", "created": 1, "model": m,
                   "choices": [{"index": i, "text": text, "logprobs": None,
                                "finish_reason": "length"} for i in range(prompts)]}
        obj["usage"] = self._usage(n, prompts)
        body = _plain(200, orjson.dumps(obj))
        if len(self._whole) >= _CACHE_MAX:
            self._whole.clear()
        self._whole[key] = body
        return body

    def writes(self, events: list[bytes]) -> list[bytes]:
        """The stream as socket writes: the head, then `events_per_write` events per write; the
        chunked terminator rides with the last one."""
        g = self.b.events_per_write
        out = [_SSE_HEAD] + [b"".join(events[i:i + g]) for i in range(0, len(events), g)]
        out[-1] += _END
        return out


class _Request:
    __slots__ = ("body", "headers", "method", "path", "query")

    def __init__(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        self.method, self.path, self.headers, self.body = method, path, headers, body
        self.query = ""


class _BadRequest(Exception):
    pass


def _parse(buf: bytearray) -> _Request | None:
    """Take one whole request off the front of `buf`; None if it is not all there yet."""
    head_end = buf.find(b"\r\n\r\n")
    if head_end < 0:
        if len(buf) > 65536:
            raise _BadRequest("request head too large")
        return None
    lines = bytes(buf[:head_end]).decode("latin-1").split("\r\n")
    try:
        method, target, _version = lines[0].split(" ", 2)
    except ValueError:
        raise _BadRequest("malformed request line") from None
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    start = head_end + 4
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body, end = _dechunk(buf, start)
        if body is None:
            return None
    else:
        try:
            length = int(headers.get("content-length", "0"))
        except ValueError:
            raise _BadRequest("bad content-length") from None
        end = start + length
        if len(buf) < end:
            return None
        body = bytes(buf[start:end])
    del buf[:end]
    path, _, query = target.partition("?")
    req = _Request(method, path, headers, body)
    req.query = query
    return req


def _dechunk(buf: bytearray, pos: int) -> tuple[bytes | None, int]:
    parts = []
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None, 0
        try:
            size = int(bytes(buf[pos:eol]).split(b";")[0], 16)
        except ValueError:
            raise _BadRequest("bad chunk size") from None
        if size == 0:
            end = buf.find(b"\r\n", eol + 2)  # no trailers expected: just the final CRLF
            return (b"".join(parts), end + 2) if end >= 0 else (None, 0)
        if len(buf) < eol + 2 + size + 2:
            return None, 0
        parts.append(bytes(buf[eol + 2:eol + 2 + size]))
        pos = eol + 2 + size + 2


class _Protocol(asyncio.Protocol):
    """One client connection: HTTP/1.1 keep-alive, requests served one at a time in order."""

    def __init__(self, upstream: FakeUpstream) -> None:
        self.u = upstream
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy = False
        self.paused: asyncio.Future[None] | None = None
        self.task: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        self.u.connections.add(self)
        self.u.opened += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.u.connections.discard(self)
        self._resume()

    def pause_writing(self) -> None:
        # Back-pressure: a proxy that stops reading must see a stalled upstream, not one that
        # buffers the whole answer in memory behind its back.
        if self.paused is None:
            self.paused = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        self._resume()

    def _resume(self) -> None:
        if self.paused is not None and not self.paused.done():
            self.paused.set_result(None)
        self.paused = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self._next()

    def _next(self) -> None:
        try:
            req = _parse(self.buf)
        except _BadRequest as exc:
            self._close_with(400, str(exc))
            return
        if req is None:
            return
        self.busy = True
        self.task = asyncio.ensure_future(self._serve(req))  # held: the loop keeps weak refs
        # Also held by the upstream, which outlives a lost connection: stopping it cancels them.
        self.u.tasks.add(self.task)
        self.task.add_done_callback(self.u.tasks.discard)

    def _close_with(self, status: int, message: str) -> None:
        if self.transport is not None:
            self.transport.write(_plain(status, _error_body(message, "invalid_request_error"),
                                        close=True))
            self.transport.close()

    async def _serve(self, req: _Request) -> None:
        u = self.u
        u.requests += 1
        close = req.headers.get("connection", "").lower() == "close"
        try:
            if req.path in ("/v1/chat/completions", "/v1/completions"):
                if req.method != "POST":
                    self._write(_plain(405, _error_body("use POST", "invalid_request_error")))
                else:
                    await self._completion("chat" if "chat" in req.path else "completion", req)
            elif req.path == "/health":
                self._write(_plain(200, b""))
            elif req.path == "/v1/models":
                self._write(_plain(200, u.models_body))
            elif u.behaviour.echo_other:
                self._write(self._echo(req))
            else:
                self._write(_plain(404, _error_body(f"no route {req.path}", "not_found_error")))
        except ConnectionError:
            close = True
        self.busy = False
        if self.transport is not None:
            if close:
                self.transport.close()
            elif self.buf:
                self._next()

    def _echo(self, req: _Request) -> bytes:
        """The request as this upstream saw it, or a stream of three events that ends with the
        body (no [DONE]), the last carrying its usage as the Responses API nests it."""
        try:
            asked = orjson.loads(req.body) if req.body else None
        except orjson.JSONDecodeError:
            asked = None
        echo = {"served_by": self.u.behaviour.model, "method": req.method, "path": req.path,
                "query": req.query, "content_type": req.headers.get("content-type", ""),
                "body": req.body.decode("utf-8", "replace"),
                "usage": {"prompt_tokens": 3, "total_tokens": 3, "completion_tokens": 0}}
        if req.method == "POST" and req.path == "/v1/responses":
            # A response of its own, as a Responses API engine names each (stored) answer.
            echo.update(id=f"resp_{self.u.port}_{self.u.requests}", object="response")
        if not (isinstance(asked, dict) and asked.get("stream") is True):
            body = orjson.dumps(echo)
            return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-echo: 1\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(body), body))
        events = [b"event: response.created\ndata: " + orjson.dumps(echo) + b"\n\n",
                  b"event: response.output_text.delta\ndata: {\"delta\":\"hi\"}\n\n",
                  b"event: response.completed\ndata: " + orjson.dumps(
                      {"type": "response.completed", "response": {
                          "usage": {"input_tokens": 3, "output_tokens": 2}}}) + b"\n\n"]
        return (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                b"x-echo: 1\r\ntransfer-encoding: chunked\r\n\r\n"
                + b"".join(_chunk(e) for e in events) + _END)

    def _write(self, data: bytes) -> None:
        if self.transport is None:
            raise ConnectionError("client went away")
        self.transport.write(data)

    async def _completion(self, kind: str, req: _Request) -> None:
        u = self.u
        u.completions += 1
        u.last_headers = req.headers
        b = u.behaviour
        try:
            body = orjson.loads(req.body)
            if not isinstance(body, dict):
                raise TypeError("the body must be a JSON object")
            u.last_request = body
            n = body.get("max_tokens") or body.get("max_completion_tokens") or b.tokens
            # 5.0 and "5" are 5 to vLLM too (pydantic, lax)
            if isinstance(n, float) and n.is_integer() or isinstance(n, str) and n.isdigit():
                n = int(n)
            if not isinstance(body.get("model"), str | None):
                raise TypeError("model must be a string")  # as vLLM's request models
            stream = body.get("stream")
            if stream is not None and not isinstance(stream, bool):
                if str(stream).lower() not in _LAX_BOOLS:
                    raise TypeError("stream must be a boolean")
                body = {**body, "stream": str(stream).lower() in _LAX_TRUE}
            if not isinstance(n, int) or n < 0:
                raise TypeError("max_tokens must be a non-negative integer")
            if b.max_answer_tokens:
                n = min(n, b.max_answer_tokens)
            prompt = body.get("prompt")
            prompts = len(prompt) if kind == "completion" and isinstance(prompt, list) and \
                prompt and not isinstance(prompt[0], int) else 1
        except (ValueError, TypeError) as exc:  # orjson.JSONDecodeError is a ValueError
            self._write(_plain(400, _error_body(str(exc), "invalid_request_error")))
            return
        if b.fail_status and self._fails(u.completions):
            body = b.fail_body.encode() or _error_body("scripted failure", "server_error")
            self._write(_plain(b.fail_status, body))
            return
        async with u.slot():
            await self._answer(kind, body, n, prompts)

    async def _answer(self, kind: str, body: dict[str, Any], n: int, prompts: int) -> None:
        u = self.u
        b = u.behaviour
        if not body.get("stream"):
            if b.token_delay_s:
                await asyncio.sleep(b.token_delay_s * n)
            self._write(u.answers.whole(kind, n, prompts))
            return
        so = body.get("stream_options") or {}
        # As vLLM: running usage only with include_usage.
        usage = bool(so.get("include_usage"))
        events = u.answers.events(kind, usage, n, prompts,
                                  usage and bool(so.get("continuous_usage_stats")),
                                  prompts == 1 and body.get("return_token_ids") is True)
        if (b.token_delay_s or b.first_token_delay_s or b.drop_after >= 0 or b.end_delay_s
                or b.error_after >= 0):
            await self._stream_slowly(events)
            return
        for data in u.answers.writes(events):
            self._write(data)
            if self.paused is not None:
                await self.paused
                if self.transport is None:
                    u.aborted += 1
                    raise ConnectionError("client went away mid-stream")

    def _fails(self, n: int) -> bool:
        """Whether the n-th completion (1-based) fails: all, or an even `fail_ratio` of them."""
        r = self.u.behaviour.fail_ratio
        return r == 0 or int(n * r) > int((n - 1) * r)

    async def _stream_slowly(self, events: list[bytes]) -> None:
        b, u = self.u.behaviour, self.u
        self._write(_SSE_HEAD)  # head first, as Starlette's StreamingResponse does
        # The tail: the first event that ends a choice, and all after it (usage, [DONE]).
        tail = next((i for i, ev in enumerate(events) if b'"finish_reason":"' in ev),
                    len(events) - 1)
        for i, ev in enumerate(events):
            if i == b.error_after:
                # vLLM's own shape (json.dumps of its ErrorResponse), then [DONE].
                self._write(_chunk(b'data: {"error": {"message": "Internal server error", '
                                   b'"type": "InternalServerError", "param": null, "code": 500}}'
                                   b"\n\n") + _chunk(b"data: [DONE]\n\n") + _END)
                return
            if i == b.drop_after:
                assert self.transport is not None
                self.transport.close()
                raise ConnectionError("scripted drop")
            delay = b.token_delay_s
            if b.first_token_delay_s:
                delay = b.first_token_delay_s if i == 0 else (0.0 if i == 1 else delay)
            if i >= tail and b.tail_delay_s >= 0:
                delay = b.tail_delay_s
            if delay:
                await asyncio.sleep(delay)
            if u._held is not None and i == u._held[0]:
                await u._held[1].wait()
            if self.transport is None:
                u.aborted += 1
                raise ConnectionError("client went away mid-stream")
            self._write(ev)
            if self.paused is not None:
                await self.paused
                if self.transport is None:
                    u.aborted += 1
                    raise ConnectionError("client went away mid-stream")
        if b.end_delay_s:
            await asyncio.sleep(b.end_delay_s)
        self._write(_END)


class FakeUpstream:
    """The server's state and counters (read them from tests; they are only ever incremented)."""

    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.behaviour = behaviour or Behaviour()
        self.answers = _Answers(self.behaviour)
        self.models_body = orjson.dumps({"object": "list", "data": [
            {"id": self.behaviour.model, "object": "model", "created": 1, "owned_by": "fake",
             "root": self.behaviour.model, "parent": None, "max_model_len": 4096}]})
        self.requests = 0  # every request, probes included
        self.completions = 0  # completion requests only
        self.aborted = 0  # streams whose client went away before the end
        self.opened = 0  # connections accepted (keep-alive working: few per many requests)
        self.last_request: dict[str, Any] | None = None  # last completion body, parsed
        self.last_headers: dict[str, str] = {}  # last completion's headers, names lower-case
        # (a completion's, as last_request: the gateway's probes come between)
        self.host = "127.0.0.1"
        self.port = 0
        self.connections: set[_Protocol] = set()
        self.tasks: set[asyncio.Future[None]] = set()
        self.waiting = 0  # completions waiting for one of `max_num_seqs` slots now
        self._slots: asyncio.Semaphore | None = None  # made in the serving loop
        self._loop: asyncio.AbstractEventLoop | None = None  # the serving loop
        self._held: tuple[int, asyncio.Event] | None = None  # see hold()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """One of `max_num_seqs` sequence slots, first come first served (none: no limit)."""
        n = self.behaviour.max_num_seqs
        if not n:
            yield
            return
        if self._slots is None:
            self._slots = asyncio.Semaphore(n)
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        try:
            yield
        finally:
            self._slots.release()

    def hold(self, after: int) -> None:
        """Streams sent at a pace (a delay set) stop after `after` events until `release()`: a
        test that releases them once its client has those events knows the client got them
        while the upstream still held the rest (no proxy between them buffered the stream)."""
        self._held = (after, asyncio.Event())

    def release(self) -> None:
        """Let the streams held by `hold` go on; from any thread."""
        if self._held is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._held[1].set)

    def drop_connections(self) -> None:
        """Abort every open client connection (keep-alive ones included)."""
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def serve(self, host: str = "127.0.0.1", port: int = 0) -> asyncio.Server:
        """Listen in the running loop; the caller owns (closes) the returned server."""
        loop = self._loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Protocol(self), host, port, backlog=4096)
        self.host, self.port = host, server.sockets[0].getsockname()[1]
        return server


class _Running:
    """Context manager of `start_fake_upstream`: `with` runs it in a thread, `async with` in the
    running loop."""

    def __init__(self, host: str, port: int, behaviour: Behaviour,
                 loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None) -> None:
        self.upstream = FakeUpstream(behaviour)
        self._host, self._port = host, port
        self._loop_factory = loop_factory or asyncio.new_event_loop
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    async def __aenter__(self) -> FakeUpstream:
        self._server = await self.upstream.serve(self._host, self._port)
        return self.upstream

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        # Stop accepting, let connections accepted already get their transports, and only then
        # close the server. CPython 3.11 fails to set up (and leaks the socket of) a connection
        # whose accept ran before close() and whose transport comes after it: a ResourceWarning,
        # an error under filterwarnings=error (a rare tests/gateway failure in CI).
        loop = asyncio.get_running_loop()
        for sock in self._server.sockets:
            loop.remove_reader(sock.fileno())  # a no-op on uvloop, which has no such race
        await asyncio.sleep(0.01)
        self._server.close()
        # Idle keep-alive connections would otherwise outlive the server (and its loop).
        self.upstream.drop_connections()
        # Requests still being answered (a slow stream, say) end here, not with the loop.
        for task in list(self.upstream.tasks):
            task.cancel()
        await asyncio.gather(*self.upstream.tasks, return_exceptions=True)
        # abort() closes each socket in a callback of this loop: let those run before it stops.
        await asyncio.sleep(0)
        await self._server.wait_closed()

    def __enter__(self) -> FakeUpstream:
        loop = self._loop = self._loop_factory()
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.__aenter__())
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread below
                failure.append(exc)
                return
            finally:
                started.set()
            loop.run_forever()

        self._thread = threading.Thread(target=run, name="fake-upstream", daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise TimeoutError("fake upstream did not start within 10 s")
        if failure:
            self._thread.join()
            loop.close()
            raise failure[0]
        return self.upstream

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        loop, thread = self._loop, self._thread
        assert loop is not None and thread is not None
        asyncio.run_coroutine_threadsafe(self.__aexit__(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def start_fake_upstream(host: str = "127.0.0.1", port: int = 0, *,
                        behaviour: Behaviour | None = None, **knobs: Any) -> _Running:
    """A fake upstream on host:port (port 0: a free one, see `.port`/`.url`), configured by
    `behaviour` or by Behaviour's fields as keywords (tokens=, model=, token_delay_s=,
    fail_status=, drop_after=, events_per_write=). Use with `with` (own thread and loop) or
    `async with` (the running loop)."""
    if behaviour is not None and knobs:
        raise TypeError("pass either behaviour= or keyword knobs, not both")
    return _Running(host, port, behaviour or Behaviour(**knobs))


def start_in_thread(behaviour: Behaviour | None = None, *,
                    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
                    ) -> _Running:
    """`start_fake_upstream(behaviour=...)` on 127.0.0.1, a free port, in a thread whose loop
    `loop_factory` makes (asyncio's default: `asyncio.new_event_loop`)."""
    return _Running("127.0.0.1", 0, behaviour or Behaviour(), loop_factory)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m bench.fake_upstream", description=__doc__)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    p.add_argument("--port", type=int, default=9100, help="port to listen on (default %(default)s)")
    for name, field in Behaviour.model_fields.items():
        kind: Callable[[str], Any] = field.annotation if field.annotation in (int, float) else str  # type: ignore[assignment]
        p.add_argument(_flag(name), type=kind, default=None,
                       help=f"{field.description} (env FAKE_UPSTREAM_{name.upper()}; "
                            f"default {field.default!r})")
    p.add_argument("--no-uvloop", action="store_true", help="use the stdlib event loop")
    args = p.parse_args(argv)
    given = {k: v for k in Behaviour.model_fields if (v := getattr(args, k)) is not None}
    try:
        behaviour = Behaviour(**given)
    except ValidationError as exc:
        err = exc.errors()[0]
        p.exit(2, f"fake_upstream: {_flag(str(err['loc'][0]))}: {err['msg']}\n")
    if not args.no_uvloop:
        import uvloop

        uvloop.install()

    async def run() -> None:
        async with start_fake_upstream(args.host, args.port, behaviour=behaviour):
            await asyncio.Event().wait()

    try:
        asyncio.run(run())
    except OSError as exc:
        p.exit(1, f"fake_upstream: cannot listen on {args.host}:{args.port}: {exc.strerror}\n")
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
