"""Adaptive batching: compatible non-streaming /v1/completions become one multi-prompt request.

Compatible: same model, every field but `prompt` equal, a single-string prompt and n == 1, so
choice `i` of the upstream answer is member `i`'s. An idle model's batch leaves on the next loop
turn; under load the window grows with the prompts in flight plus the admission queue, up to
`max_delay_s`, and a batch of `max_size` leaves at once.

Each member's answer has its choice re-indexed to 0 and its own usage: exact from
`return_token_ids` (asked for, and stripped unless the members asked), else split in proportion
to text length. A 4xx for the batch is retried member by member, so companions never fail for
one bad prompt; a 5xx already went through the caller's retries and is everyone's answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from time import monotonic
from typing import Any

import orjson

from gateway.errors import GatewayError
from gateway.metrics import GatewayMetrics
from gateway.settings import BatchSettings
from gateway.usage import body_usage, usage_counts

log = logging.getLogger("gateway.batcher")

# (model, request body) -> (status, response body, URL of the replica that answered); raises
# GatewayError when no replica answers.
UpstreamCall = Callable[[str, bytes], Awaitable[tuple[int, bytes, str]]]
_TOKEN_FIELDS = ("token_ids", "prompt_token_ids")


@dataclass(slots=True)
class BatchResult:
    status: int
    body: bytes
    usage: tuple[int, int] | None = None  # prompt and completion tokens; None: unknown
    backend: str = ""  # the replica that answered: the proxy counts each client request there


@dataclass(slots=True, eq=False)
class _Member:
    prompt: str
    future: asyncio.Future[BatchResult]
    submitted: float


@dataclass(slots=True, eq=False)
class _Batch:
    model: str
    template: dict[str, Any]
    handle: asyncio.Handle  # the window's timer
    members: list[_Member] = field(default_factory=list)


def batch_key(body: dict[str, Any]) -> bytes | None:
    """The compatibility key of a request, or None if it cannot be batched."""
    if (body.get("stream") or not isinstance(body.get("prompt"), str)
            or body.get("n", 1) != 1 or body.get("best_of", 1) != 1):
        return None
    rest = {k: v for k, v in body.items() if k != "prompt"}
    try:
        return orjson.dumps(rest, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return None


class Batcher:
    def __init__(
        self, settings: BatchSettings, metrics: GatewayMetrics, call: UpstreamCall,
        queued: Callable[[str], int] = lambda _: 0,
    ) -> None:
        self._s = settings
        self._m = metrics
        self._call = call
        self._queued = queued
        self._open: dict[bytes, _Batch] = {}
        self._in_flight: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def window(self, model: str) -> float:
        s = self._s
        pressure = self._in_flight.get(model, 0) + self._queued(model)
        return s.max_delay_s * min(1.0, pressure / s.max_size)

    async def submit(self, model: str, body: dict[str, Any], key: bytes) -> BatchResult:
        loop = asyncio.get_running_loop()
        batch = self._open.get(key)
        if batch is None:
            delay = self.window(model)
            handle = (loop.call_soon(self._flush, key) if delay <= 0
                      else loop.call_later(delay, self._flush, key))
            template = {k: v for k, v in body.items() if k != "prompt"}
            batch = self._open[key] = _Batch(model, template, handle)
        member = _Member(body["prompt"], loop.create_future(), monotonic())
        batch.members.append(member)
        if len(batch.members) >= self._s.max_size:
            self._flush(key)
        # A member whose client leaves cancels only its own future; the batch goes on.
        return await member.future

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- internals -------------------------------------------------------------------------------

    def _flush(self, key: bytes) -> None:
        # Once per batch: by its timer, or when full, which cancels the timer.
        batch = self._open.pop(key)
        batch.handle.cancel()
        live = [m for m in batch.members if not m.future.done()]
        if not live:
            return
        task = asyncio.get_running_loop().create_task(self._run(batch, live))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: _Batch, live: list[_Member]) -> None:
        model = batch.model
        now = monotonic()
        m = self._m
        m.batch_size.labels(model).observe(len(live))
        delay = m.batch_delay.labels(model)
        for mem in live:
            delay.observe(now - mem.submitted)
        self._in_flight[model] = self._in_flight.get(model, 0) + len(live)
        error: GatewayError | None = None
        try:
            if len(live) == 1:
                await self._single(batch, live[0])
            else:
                await self._many(batch, live)
        except GatewayError as exc:
            error = exc
        except asyncio.CancelledError:
            error = GatewayError("the gateway is shutting down")
            raise
        except Exception:
            # A bug, not an upstream failure: nobody awaits this task, so log it here.
            log.exception("batcher error")
            error = GatewayError("internal error")
        finally:
            self._in_flight[model] -= len(live)
            if error is not None:
                for mem in live:
                    _answer(mem, error)

    async def _single(self, batch: _Batch, mem: _Member) -> None:
        body = orjson.dumps({**batch.template, "prompt": mem.prompt})
        status, raw, backend = await self._call(batch.model, body)
        _answer(mem, BatchResult(status, raw, body_usage(raw) if status == 200 else None, backend))

    async def _many(self, batch: _Batch, live: list[_Member]) -> None:
        template = batch.template
        asked_ids = bool(template.get("return_token_ids"))
        body = orjson.dumps({**template, "prompt": [mem.prompt for mem in live],
                             "return_token_ids": True})
        status, raw, backend = await self._call(batch.model, body)
        if 400 <= status < 500:
            # One member's fault fails the whole batch upstream: let each answer for itself.
            await asyncio.gather(*(self._single(batch, mem) for mem in live))
            return
        if status != 200:
            for mem in live:
                _answer(mem, BatchResult(status, raw, backend=backend))
            return
        for mem, result in zip(live, split(raw, [mem.prompt for mem in live], asked_ids),
                               strict=True):
            result.backend = backend
            _answer(mem, result)


def _answer(mem: _Member, result: BatchResult | GatewayError) -> None:
    """Settle a member's future, unless its client left (which cancelled it)."""
    if mem.future.done():
        return
    if isinstance(result, GatewayError):
        mem.future.set_exception(result)
    else:
        mem.future.set_result(result)


def split(raw: bytes, prompts: list[str], keep_token_ids: bool) -> list[BatchResult]:
    """One upstream multi-prompt answer -> one OpenAI answer per prompt (index 0, own usage)."""
    obj = orjson.loads(raw)
    choices: list[dict[str, Any]] = obj.get("choices") or []
    by_index = {int(c.get("index", i)): c for i, c in enumerate(choices)}
    if sorted(by_index) != list(range(len(prompts))):
        raise GatewayError(
            f"batched upstream answer has {len(choices)} choices for {len(prompts)} prompts")
    totals = usage_counts(obj.get("usage"))
    total_prompt, total_completion = totals or (0, 0)
    exact = all(isinstance(c.get("token_ids"), list) and isinstance(c.get("prompt_token_ids"),
                                                                     list) for c in choices)
    prompt_chars = sum(len(p) for p in prompts) or 1
    text_chars = sum(len(str(c.get("text") or "")) for c in choices) or 1
    base = {k: v for k, v in obj.items() if k not in ("choices", "usage")}
    rid = str(obj.get("id") or "cmpl-batch")
    out = []
    for i, prompt in enumerate(prompts):
        c = dict(by_index[i])
        if exact:
            p_tok, c_tok = len(c["prompt_token_ids"]), len(c["token_ids"])
        else:
            p_tok = round(total_prompt * len(prompt) / prompt_chars)
            c_tok = round(total_completion * len(str(c.get("text") or "")) / text_chars)
        if not keep_token_ids:
            for f in _TOKEN_FIELDS:
                c.pop(f, None)
        c["index"] = 0
        answer = {**base, "id": f"{rid}-{i}", "choices": [c],
                  "usage": {"prompt_tokens": p_tok, "completion_tokens": c_tok,
                            "total_tokens": p_tok + c_tok}}
        usage = (p_tok, c_tok) if exact or totals is not None else None
        out.append(BatchResult(200, orjson.dumps(answer), usage))
    return out
