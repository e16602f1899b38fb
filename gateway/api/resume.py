"""A stream that survives its replica: a chat or completion stream broken after its first byte is
re-issued to another ready replica, from token ids, and the same SSE stream goes on.

How: every resumable stream asks its engine for `return_token_ids` (api/resume_splice.py keeps the
ids and hides them from a client that did not ask). When the stream breaks (the connection drops or
ends without [DONE], or the engine sends an error event), the gateway sends the other replica a
`/v1/completions` request whose prompt is the prompt's token ids (as the first engine rendered it,
chat template included) followed by the tokens already relayed, with `max_tokens` reduced by those.
At temperature 0 the continuation is the uninterrupted answer's. Its events are re-framed as the
client's stream: the first stream's id and created, chat chunks for a chat request, and one final
usage with the true totals (the prompt counted once). The client sees no error and no seam.

Bounds: at most `GATEWAY_STREAM_RESUMES` resumes per request, only to a replica available now
(never in panic mode), within the request's total timeout; each break counts once in
`llmserve_stream_resumes_total{outcome}` and logs a line. Where it cannot resume (what `why_not`
lists, no other replica, the limit, the deadline) the client gets today's in-band error,
unchanged. docs/routing.md says what is resumed and what is not.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
from starlette.types import Send

from gateway.api.deps import ProxyDeps
from gateway.api.inflight import Exchange
from gateway.api.replicas import check_answer
from gateway.api.resume_splice import ERROR_EVENT, ResumeSplice
from gateway.api.schemas import ParsedRequest, lax_true
from gateway.api.splice import whole_events
from gateway.api.sse import DONE_EVENT, EVENT_END, stamp_fingerprint
from gateway.errors import GatewayError, UpstreamFailed, UpstreamTimeout
from gateway.metrics import ResumeOutcome
from gateway.routing.backend import Backend
from gateway.routing.policy import RouteRequest

log = logging.getLogger("gateway.resume")

# What a chat request carries into its resumed /v1/completions request: the sampling fields both
# endpoints share. Everything else in a chat body is about rendering the prompt, which the prompt's
# token ids already are.
CHAT_CARRIED = ("temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty",
                "stop_token_ids", "ignore_eos", "skip_special_tokens", "logit_bias",
                "spaces_between_special_tokens", "allowed_token_ids", "bad_words", "priority",
                "user", "include_stop_str_in_output", "cache_salt", "length_penalty",
                "vllm_xargs")
# A completion body's fields that the resumed request sets itself, or must not repeat.
COMPLETION_DROPPED = ("prompt", "echo", "stream_options", "return_token_ids", "max_tokens",
                      "min_tokens", "truncate_prompt_tokens")
STRUCTURED = ("structured_outputs", "guided_json", "guided_regex", "guided_choice",
              "guided_grammar", "guided_decoding_backend")


def _count(v: object) -> bool:
    """None or an integer (JSON's 5.0 too): a count the resumed request can reduce."""
    return v is None or (isinstance(v, int | float) and not isinstance(v, bool)
                         and float(v).is_integer())


def why_not(req: ParsedRequest) -> str | None:
    """Why a streamed request cannot be resumed token-exact, or None if it can. The gateway reads
    requests leniently (api/schemas.py); a field it cannot read here makes the request one it
    does not resume, and the engine judges it as ever."""
    b = req.body
    for name in ("n", "best_of"):
        if b.get(name) not in (None, 1):
            return f"{name} > 1"
    for name in ("max_tokens", "max_completion_tokens", "min_tokens"):
        if not _count(b.get(name)):
            return f"unreadable {name}"
    if b.get("logprobs") or b.get("prompt_logprobs"):
        # Resumed, the logprobs' text offsets would start again at 0.
        return "logprobs"
    if lax_true(b.get("echo")):
        # vLLM echoes an empty prompt text when asked for token ids.
        return "echo"
    if b.get("stop"):
        # The engine holds back text that may start a stop string: tokens relayed, text not.
        return "stop strings"
    if b.get("presence_penalty") or b.get("frequency_penalty"):
        # These count the generated tokens only; resumed, those are part of the prompt.
        return "presence or frequency penalty"
    rf = b.get("response_format")
    if (isinstance(rf, dict) and rf.get("type") not in (None, "text")) or any(
            b.get(k) is not None for k in STRUCTURED):
        # A grammar's state would start again from its beginning.
        return "structured output"
    if req.kind == "chat":
        if b.get("tools") and b.get("tool_choice") != "none":
            return "tools"
        messages = b.get("messages")
        if not isinstance(messages, list):
            return "unreadable messages"
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list) and any(
                    not isinstance(p, dict) or p.get("type") != "text" for p in content):
                return "non-text content"
    else:
        if b.get("prompt_embeds") is not None:
            return "prompt embeddings"
        prompt = b.get("prompt")
        if not isinstance(prompt, str | list):
            return "unreadable prompt"
        if isinstance(prompt, list) and len(prompt) > 1 and not all(
                isinstance(t, int) for t in prompt):
            return "several prompts"
    return None


class ResumePlan:
    """What a streamed request needs to be resumed: the client's own body and wishes."""

    __slots__ = ("body", "client_continuous", "client_ids", "client_usage", "kind", "model",
                 "route", "why_not")

    def __init__(self, req: ParsedRequest, route: RouteRequest | None = None) -> None:
        b = req.body
        self.kind = req.kind
        self.model = req.model
        self.route = route
        self.why_not = why_not(req)
        self.client_ids = lax_true(b.get("return_token_ids"))
        self.client_usage = req.client_wants_usage
        so = b.get("stream_options")
        self.client_continuous = req.client_wants_usage and isinstance(so, dict) and lax_true(
            so.get("continuous_usage_stats"))
        self.body = dict(b)  # before the proxy adds its own fields

    def resumed_body(self, prompt: list[int], gen: list[int], model: object) -> bytes:
        """The /v1/completions request that continues after `gen`; `model`: as the first
        engine named it (the client may have left it to the one model served)."""
        b = self.body
        if self.kind == "chat":
            out: dict[str, Any] = {k: b[k] for k in CHAT_CARRIED if k in b}
            max_tokens = b.get("max_completion_tokens", b.get("max_tokens"))
        else:
            out = {k: v for k, v in b.items() if k not in COMPLETION_DROPPED}
            max_tokens = b.get("max_tokens", 16)  # vLLM's default for completions
        max_tokens = None if max_tokens is None else int(max_tokens)
        out["model"] = model if isinstance(model, str) and model else b.get("model")
        out["prompt"] = prompt + gen
        out["stream"] = True
        so: dict[str, bool] = {"include_usage": True}
        if self.client_continuous:
            so["continuous_usage_stats"] = True
        out["stream_options"] = so
        out["return_token_ids"] = True
        # None: up to the context length, as the first request had (chat's default).
        out["max_tokens"] = None if max_tokens is None else max(1, max_tokens - len(gen))
        if b.get("min_tokens"):
            out["min_tokens"] = max(0, int(b["min_tokens"]) - len(gen))
        return orjson.dumps(out)


class _Stream:
    """The client's stream as the resumed events continue it."""

    __slots__ = ("created", "deferred", "done", "gen", "id", "model", "plan", "prompt", "splice")

    def __init__(self, plan: ResumePlan, splice: ResumeSplice, prompt: list[int],
                 gen: list[int]) -> None:
        self.plan = plan
        self.splice = splice
        self.prompt = prompt
        self.gen = gen
        self.done = False
        # A terminal event held until the usage event brings the fingerprint (api/splice.py).
        self.deferred = b""
        first = orjson.loads(_data(splice.first.split(EVENT_END, 1)[0]))
        self.id = first.get("id")
        self.created = first.get("created")
        self.model = first.get("model")

    def usage(self, usage: dict[str, Any], before: int) -> dict[str, Any]:
        p = len(self.prompt)
        c = before + int(usage.get("completion_tokens") or 0)
        return {"prompt_tokens": p, "total_tokens": p + c, "completion_tokens": c}

    def reframe(self, event: bytes, before: int) -> bytes | None:
        """One event of the resumed completion stream as the client's stream goes on (None: not
        for the client); `before`: tokens generated before this resumed request."""
        if event == DONE_EVENT[:-2]:
            self.done = True
            done, self.deferred = self.deferred + DONE_EVENT, b""
            return done
        if event.startswith(ERROR_EVENT):
            raise EngineErrorEvent(event + EVENT_END)
        obj = orjson.loads(_data(event))
        plan = self.plan
        out: dict[str, Any]
        usage = obj.get("usage")
        if usage is not None:
            usage = self.usage(usage, before)
        choices = obj.get("choices") or []
        if not choices:
            if usage is None:
                return None
            self.splice.usage.counts = (usage["prompt_tokens"], usage["completion_tokens"])
            if not plan.client_usage:
                # Where vLLM puts the fingerprint when usage is not asked for: the terminal event.
                held, self.deferred = self.deferred, b""
                fingerprint = obj.get("system_fingerprint")
                if held and isinstance(fingerprint, str):
                    held = stamp_fingerprint(held, orjson.dumps(fingerprint))
                return held or None
            out = {"id": self.id, "object": _object(plan.kind), "created": self.created,
                   "model": self.model, "choices": [], "usage": usage}
            if "system_fingerprint" in obj:
                out["system_fingerprint"] = obj["system_fingerprint"]
            return _event(out)
        c = choices[0]
        ids = c.get("token_ids") or []
        self.gen += ids
        shown = ids if plan.client_ids else None
        choice: dict[str, Any]
        if plan.kind == "chat":
            choice = {"index": 0, "delta": {"content": c.get("text", "")}, "logprobs": None,
                      "finish_reason": c.get("finish_reason")}
            if c.get("finish_reason") is not None:
                choice["stop_reason"] = c.get("stop_reason")
            choice["token_ids"] = shown
        else:
            choice = {**c, "prompt_token_ids": None, "token_ids": shown}
        out = {"id": self.id, "object": _object(plan.kind), "created": self.created,
               "model": self.model, "choices": [choice]}
        if usage is not None:
            out["usage"] = usage
        if c.get("finish_reason") is not None and not plan.client_usage:
            self.deferred += _event(out)
            return None
        return _event(out)


class EngineErrorEvent(UpstreamFailed):
    """An engine sent an error event mid-stream: `tail` is what it sent from there on, ending
    with [DONE], as the client gets it when the stream is not resumed."""

    def __init__(self, tail: bytes) -> None:
        super().__init__("replica sent an error event mid-stream")
        self.tail = tail if tail.endswith(DONE_EVENT) else tail + DONE_EVENT


def _data(event: bytes) -> bytes:
    return event[6:] if event.startswith(b"data: ") else event.partition(b"data:")[2]


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + EVENT_END


def _object(kind: str) -> str:
    return "chat.completion.chunk" if kind == "chat" else "text_completion"


async def resume(
    d: ProxyDeps, plan: ResumePlan, splice: ResumeSplice | None, failed: Backend,
    exc: GatewayError, send: Send, ex: Exchange,
) -> GatewayError | None:
    """Go on with a stream that broke on `failed` (module docstring): None once the client has
    its whole answer; else the error to end the stream with, as without resuming."""
    if plan.why_not is not None or splice is None:
        _counted(d, "unsupported")
        return exc
    prompt, gen = splice.token_ids()
    if not prompt:  # an engine that sends no token ids
        _counted(d, "unsupported")
        return exc
    stream = _Stream(plan, splice, prompt, gen)
    if splice.usage.counts is not None or _finished(splice.last_chunk):
        # Only the end was lost (usage, [DONE]): say it ourselves.
        await _finish(stream, send)
        _counted(d, "resumed")
        return None
    loop = asyncio.get_running_loop()
    deadline = ex.started + d.settings.timeouts.total_s
    excluded = [failed]
    resumes = 0
    # The failed replica's share of the request ends here (try_replicas takes it back after).
    failed.outstanding -= 1
    try:
        while True:
            if resumes >= d.settings.stream_resumes:
                return _give_up(d, "limit", exc, ex)
            if loop.time() >= deadline:
                return _give_up(d, "deadline", exc, ex)
            target = d.router.pick(plan.model, excluded, plan.route)
            # Available now, not only picked in panic mode (every replica out).
            if target is None or d.router.available_at(target.url) is not target:
                return _give_up(d, "no_replica", exc, ex)
            resumes += 1
            excluded.append(target)
            log.info("request %s: stream broken on %s after %d tokens (%s); resuming on %s",
                     ex.rid, excluded[-2].url, len(stream.gen), exc.message, target.url)
            target.outstanding += 1
            try:
                async with asyncio.timeout_at(deadline):
                    await _relay(d, stream, target, send)
            except TimeoutError:
                exc = UpstreamTimeout("the request's total timeout expired while resuming")
            except GatewayError as e:
                d.router.report_failure(target)
                exc = e
            else:
                d.router.report_success(target)
                _counted(d, "resumed")
                return None
            finally:
                target.outstanding -= 1
            _counted(d, "failed")
    finally:
        failed.outstanding += 1


def _counted(d: ProxyDeps, outcome: ResumeOutcome) -> None:
    d.metrics.stream_resumes.labels(outcome).inc()


def _give_up(d: ProxyDeps, outcome: ResumeOutcome, exc: GatewayError,
             ex: Exchange) -> GatewayError:
    _counted(d, outcome)
    log.warning("request %s: stream not resumed (%s): %s", ex.rid, outcome, exc.message)
    return exc


def _finished(chunk: bytes) -> bool:
    """The last event relayed carried a finish_reason: the answer is whole."""
    last = chunk.rstrip(b"\n").rpartition(EVENT_END)[2]
    return b'"finish_reason":"' in last


async def _finish(stream: _Stream, send: Send) -> None:
    """The end of an answer whose last token arrived: its deferred terminal events, its usage
    (if the client asked), [DONE]."""
    out = None
    if stream.splice.usage.counts is None:
        usage = {"completion_tokens": 0}
        out = stream.reframe(b"data: " + orjson.dumps({"choices": [], "usage": usage}),
                             len(stream.gen))
    await send({"type": "http.response.body", "more_body": True,
                "body": stream.splice.take_deferred() + (out or b"") + DONE_EVENT})
    stream.splice.saw_done = True


async def _relay(d: ProxyDeps, stream: _Stream, target: Backend, send: Send) -> None:
    """Relay one resumed request's events to the client until its [DONE]; raises GatewayError when
    it breaks (what was relayed is in `stream.gen` for the next try)."""
    body = stream.plan.resumed_body(stream.prompt, stream.gen, stream.model)
    before = len(stream.gen)
    resp = await d.transport.post(target.url + "/v1/completions", body,
                                  {"content-type": "application/json"}, streaming=True)
    splice = stream.splice
    loop = asyncio.get_running_loop()
    try:
        if resp.status != 200:
            raw = await resp.read()
            check_answer(d, target, resp.status, raw)
            raise UpstreamFailed(f"resumed request answered HTTP {resp.status}: "
                                 f"{raw[:200].decode('utf-8', 'replace')}")
        rest = b""
        while not stream.done:
            data = await resp.readany()
            if not data:
                raise UpstreamFailed("replica ended the resumed stream without [DONE]")
            now = loop.time()
            whole, rest = whole_events(rest, data)
            if not whole:
                continue
            out: list[bytes] = []
            for event in whole[:-2].split(EVENT_END):
                framed = stream.reframe(event, before)
                if framed is not None:
                    out.append(framed)
                    splice.gaps.append(now - splice.last)
                    splice.last = now
            if out:
                await send({"type": "http.response.body", "body": b"".join(out),
                            "more_body": True})
        splice.saw_done = True
    except BaseException:
        resp.close()
        raise
    try:
        while await resp.readany():
            pass
    except GatewayError:
        resp.close()
        return
    resp.release()
