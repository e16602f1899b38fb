"""The gateway against the engine, differentially: every request sent once to a vLLM-CPU worker
directly and once through the gateway, with real clients (raw httpx; the OpenAI SDK, sync and
async; langchain-openai, sync and async; the Anthropic SDK on vLLM's Messages API, sync and
async), comparing status, the headers clients read, bodies and SSE event sequences, endpoint by
endpoint. Ids and timestamps aside (each request gets its own), the answers must be equal.

Every accepted difference is listed in ACCEPTED below, with its reason, and applied nowhere else.
Streams are compared with consecutive token events of a choice joined (`fused`), on both sides:
vLLM packs several tokens into one event when its reader lags, whoever reads.
The session's `stack` (2 workers, the gateway) is reused: no engine of its own.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import pytest
from langchain_core.messages import BaseMessageChunk
from langchain_openai import ChatOpenAI

from devstack.stack import LocalStack
from gateway.api.endpoints import ENDPOINTS, NOT_FORWARDED
from tests import loopback

pytestmark = pytest.mark.engine

# Accepted differences: case -> why. Each case named here is compared with the difference taken
# out as stated; no other case may differ in any way.
ACCEPTED: dict[str, str] = {
    "unknown-model": "the gateway answers a model no replica serves itself (404, OpenAI's shape, "
                     "code model_not_found): it cannot know which replica's engine to ask",
    "wrong-method": "the gateway answers a method an endpoint does not take itself (405 in "
                    "OpenAI's shape, with Allow); the engine's is FastAPI's {\"detail\": ...}",
    "no-route": "a path no engine serves is the gateway's own 404 in OpenAI's shape",
    "models": "/v1/models: the engine's card plus the gateway's `llmserve` field (replicas), "
              "and the cards of the gateway's other pools' models (a pooling pool)",
    "chat-no-model": "only while the gateway serves several models (a pooling pool beside): no "
                     "model is then its 400 naming `model`; with one, the engine's answer",
    "chat-empty-model": "as chat-no-model",
    "tokenize-no-model": "as chat-no-model",
    "trailing-slash": "the 307's Location names the host the client asked (the gateway's)",
    "chat-stream-n2-logprobs": "with n > 1 the events are compared choice by choice: how the "
                               "choices' events interleave depends on timing in vLLM itself, and "
                               "the gateway holds a finished choice's terminal event until the "
                               "usage chunk (to put system_fingerprint back on it) while other "
                               "choices go on; each choice's own events are equal, in order. "
                               "Logprobs are equal to within LOGPROB_NOISE: the engine batches "
                               "the two choices' decode steps together or apart by timing, and "
                               "its CPU float32 numerics depend on the batch",
}
# Two reads of the same n=2 stream from the engine itself (no gateway: worker 0 against worker 1,
# sampled tokens equal) differed in a logprob by up to 3.3e-5 in 25 runs (12 of 25 differed at
# all), always on a step whose batch held one choice or two. A gateway that changed a logprob
# (rounding it to 4 decimals, say) would differ by more; tokens, text and every other field are
# still compared exactly.
LOGPROB_NOISE = 1e-4
# Response headers clients read; others (date, server, x-request-id the gateway adds) are not
# part of the answer.
READ_HEADERS = ("content-type", "allow", "location")
# Fields that differ per request on any engine: ids and timestamps.
_VOLATILE = {"id", "created", "created_at", "item_id", "response_id", "request_id"}
_ID = re.compile(r"^(chatcmpl|cmpl|resp|msg|rs|fc|call)[-_][0-9a-zA-Z-]+$")


def scrub(obj: Any) -> Any:
    """`obj` with its ids and timestamps replaced by "*"."""
    if isinstance(obj, dict):
        return {k: "*" if k in _VOLATILE else scrub(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [scrub(v) for v in obj]
    if isinstance(obj, str) and _ID.match(obj):
        return "*"
    return obj


def sse(text: str) -> list[tuple[str | None, Any]]:
    """An SSE body as (event name, data) pairs, data parsed when it is JSON."""
    out: list[tuple[str | None, Any]] = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
        raw = "\n".join(data)
        try:
            out.append((name, scrub(json.loads(raw))))
        except json.JSONDecodeError:
            out.append((name, raw))
    return out


class _Unfusable(Exception):
    pass


def _cat(a: Any, b: Any, key: str = "") -> Any:
    """Two consecutive deltas of one choice as one: text and lists joined, the rest equal (or
    set in one of them only); the finish reason is the later one's."""
    if key in ("finish_reason", "stop_reason"):
        return b if b is not None else a
    if a is None or b is None:
        return b if a is None else a
    if isinstance(a, str) and isinstance(b, str):
        return a + b if key not in ("role", "type", "object", "model") else _same(a, b)
    if isinstance(a, list) and isinstance(b, list):
        return a + b
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _cat(a.get(k), b.get(k), k) for k in {**a, **b}}
    return _same(a, b)


def _same(a: Any, b: Any) -> Any:
    if a != b:
        raise _Unfusable
    return a


def fused(events: list[tuple[str | None, Any]]) -> list[tuple[str | None, Any]]:
    """A completion stream with consecutive token events of one choice joined into one (a
    Responses stream: consecutive text deltas of one content part, its events then numbered
    again in order). vLLM sends several tokens in one event when its reader lags (timing, on
    any client), so how tokens are packed into events is not part of the answer; their order,
    text and fields are."""
    out: list[tuple[str | None, Any]] = []
    for name, data in events:
        if out and out[-1][0] == name:
            prev = out[-1][1]
            try:
                out[-1] = (name, _fuse(prev, data))
                continue
            except _Unfusable:
                pass
        out.append((name, data))
    numbered = [d for _, d in out if isinstance(d, dict) and "sequence_number" in d]
    if numbered:
        first = numbered[0]["sequence_number"]
        for i, d in enumerate(numbered):
            d["sequence_number"] = first + i
    return out


def chunks(dumps: list[Any]) -> list[Any]:
    """An SDK stream's chunks (dumped), token events joined as `fused` joins them."""
    return [data for _, data in fused([(None, d) for d in dumps])]


_DELTA_PART = ("item_id", "output_index", "content_index")


def _fuse(a: Any, b: Any) -> Any:
    if not (isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys()):
        raise _Unfusable
    if a.get("type") == "content_block_delta":  # the Messages API's
        if b.get("type") != a["type"] or a.get("index") != b.get("index") \
                or a["delta"].get("type") != "text_delta" or b["delta"].get("type") != "text_delta":
            raise _Unfusable
        return {**a, "delta": {**a["delta"], "text": a["delta"]["text"] + b["delta"]["text"]}}
    if a.get("type") == "response.output_text.delta":
        if b.get("type") != a["type"] or any(a.get(k) != b.get(k) for k in _DELTA_PART):
            raise _Unfusable
        return {**a, "delta": a["delta"] + b["delta"],
                "logprobs": (a.get("logprobs") or []) + (b.get("logprobs") or [])}
    ca, cb = a.get("choices"), b.get("choices")
    if not (isinstance(ca, list) and isinstance(cb, list) and len(ca) == len(cb) == 1
            and ca[0].get("index") == cb[0].get("index") and ca[0].get("finish_reason") is None
            and a.get("usage") is None and b.get("usage") is None):
        raise _Unfusable
    for k in a:
        if k != "choices":
            _same(a[k], b[k])
    return {**a, "choices": [_cat(ca[0], cb[0])]}


def per_choice(events: list[tuple[str | None, Any]]) -> dict[Any, list[Any]]:
    """A completion stream's events grouped by choice index, in order within each (events
    without a choice, [DONE] and usage, under None)."""
    out: dict[Any, list[Any]] = {}
    for event in events:
        data = event[1]
        choices = data.get("choices") if isinstance(data, dict) else None
        key = choices[0]["index"] if choices else None
        out.setdefault(key, []).append(event)
    return out


def answer(r: httpx.Response) -> dict[str, Any]:
    """What a client reads of a response, ids and timestamps aside."""
    ctype = r.headers.get("content-type", "")
    if ctype.startswith("text/event-stream"):
        body: Any = fused(sse(r.text))
    else:
        try:
            body = scrub(r.json())
        except json.JSONDecodeError:
            body = r.text
    return {"status": r.status_code, "body": body,
            **{h: r.headers.get(h) for h in READ_HEADERS}}


MSGS = [{"role": "user", "content": "What is the capital of France?"}]


def cases(model: str) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(name, method, path, httpx kwargs): one request each, sent to the engine and through the
    gateway."""
    chat = {"model": model, "messages": MSGS, "max_tokens": 8, "temperature": 0}
    comp = {"model": model, "prompt": "The capital of France is", "max_tokens": 8,
            "temperature": 0}
    schema = {"type": "object", "properties": {"city": {"type": "string"}},
              "required": ["city"]}
    post = "POST"
    return [
        ("chat", post, "/v1/chat/completions", {"json": chat}),
        ("chat-logprobs", post, "/v1/chat/completions",
         {"json": {**chat, "logprobs": True, "top_logprobs": 3}}),
        ("chat-seed-n2", post, "/v1/chat/completions",
         {"json": {**chat, "temperature": 1.0, "seed": 7, "n": 2}}),
        ("chat-json-schema", post, "/v1/chat/completions", {"json": {
            **chat, "max_tokens": 20, "response_format": {
                "type": "json_schema", "json_schema": {"name": "c", "schema": schema}}}}),
        ("chat-stream", post, "/v1/chat/completions", {"json": {**chat, "stream": True}}),
        ("chat-stream-usage", post, "/v1/chat/completions", {"json": {
            **chat, "stream": True, "stream_options": {"include_usage": True}}}),
        ("chat-stream-n2-logprobs", post, "/v1/chat/completions", {"json": {
            **chat, "stream": True, "n": 2, "seed": 3, "temperature": 1.0, "logprobs": True}}),
        ("chat-no-model", post, "/v1/chat/completions",
         {"json": {k: v for k, v in chat.items() if k != "model"}}),
        ("chat-empty-model", post, "/v1/chat/completions", {"json": {**chat, "model": ""}}),
        ("chat-string-numbers", post, "/v1/chat/completions",
         {"json": {**chat, "max_tokens": "5", "stream": "false", "logprobs": "true"}}),
        ("chat-bad-temperature", post, "/v1/chat/completions",
         {"json": {**chat, "temperature": 5}}),
        ("chat-bad-messages", post, "/v1/chat/completions", {"json": {**chat, "messages": "x"}}),
        ("chat-bad-json", post, "/v1/chat/completions",
         {"content": b'{"model": ', "headers": {"content-type": "application/json"}}),
        ("chat-too-long", post, "/v1/chat/completions",
         {"json": {**chat, "max_tokens": 10_000_000}}),
        ("unknown-model", post, "/v1/chat/completions", {"json": {**chat, "model": "nope"}}),
        ("completion", post, "/v1/completions", {"json": comp}),
        ("completion-logprobs-echo", post, "/v1/completions",
         {"json": {**comp, "logprobs": 2, "echo": True}}),
        ("completion-token-ids", post, "/v1/completions",
         {"json": {**comp, "prompt": [504, 3575, 282, 4649, 314]}}),
        ("completion-stream", post, "/v1/completions", {"json": {**comp, "stream": True}}),
        ("responses", post, "/v1/responses",
         {"json": {"model": model, "input": "Say hi.", "max_output_tokens": 8,
                   "temperature": 0}}),
        ("responses-stream", post, "/v1/responses",
         {"json": {"model": model, "input": "Say hi.", "max_output_tokens": 8,
                   "temperature": 0, "stream": True}}),
        ("responses-get-unknown", "GET", "/v1/responses/resp_0123456789abcdef", {}),
        ("responses-cancel-unknown", post, "/v1/responses/resp_0123456789abcdef/cancel", {}),
        ("messages", post, "/v1/messages",
         {"json": {"model": model, "max_tokens": 8, "messages": MSGS, "temperature": 0}}),
        ("messages-stream", post, "/v1/messages",
         {"json": {"model": model, "max_tokens": 8, "messages": MSGS, "temperature": 0,
                   "stream": True}}),
        ("messages-count-tokens", post, "/v1/messages/count_tokens",
         {"json": {"model": model, "messages": MSGS}}),
        ("tokenize", post, "/tokenize", {"json": {"model": model, "prompt": "hello world"}}),
        ("tokenize-chat", post, "/tokenize", {"json": {"model": model, "messages": MSGS}}),
        ("tokenize-no-model", post, "/tokenize", {"json": {"prompt": "hello"}}),
        ("detokenize", post, "/detokenize", {"json": {"model": model, "tokens": [504, 3575]}}),
        ("invocations", post, "/invocations", {"json": chat}),
        ("invocations-empty", post, "/invocations", {"json": {}}),
        ("generative-scoring", post, "/generative_scoring", {"json": {
            "model": model, "query": "Is Paris in France?", "items": ["yes", "no"],
            "label_token_ids": [504, 3575]}}),
        ("version", "GET", "/version", {}),
        ("ping-get", "GET", "/ping", {}),
        ("ping-post", post, "/ping", {}),
        # A generative engine does not serve these (a pooling or speech engine does): its 404,
        # relayed as it wrote it.
        *[(f"not-here{e.path.replace('/', '-')}", post, e.path, {"json": {"model": model}})
          for e in ENDPOINTS if e.runner != "generate" and e.route == "body"],
        *[(f"not-here{e.path.replace('/', '-')}", post, e.path,
           {"data": {"model": model}, "files": {"file": ("a.wav", b"RIFF", "audio/wav")}})
          for e in ENDPOINTS if e.route == "form"],
        ("wrong-method", "GET", "/v1/chat/completions", {}),
        ("no-route", "GET", "/v1/nothing-here", {}),
        ("models", "GET", "/v1/models", {}),
        ("trailing-slash", post, "/v1/chat/completions/", {"json": chat}),
    ]


def accepted(name: str, direct: dict[str, Any], through: dict[str, Any],
             gateway_url: str, engine_url: str) -> None:
    """Take out the difference ACCEPTED names for `name` (checking it is what it says)."""
    if name.endswith(("no-model", "empty-model")):
        served = loopback.get(gateway_url + "/v1/models").json()["data"]
        if len([m for m in served if not m.get("parent")]) > 1:
            assert through["status"] == 400 and through["body"]["error"]["param"] == "model"
            through.update(direct)
    elif name in ("unknown-model", "wrong-method", "no-route"):
        assert through["status"] == direct["status"]
        assert set(through["body"]["error"]) == {"message", "type", "param", "code"}
        through["body"] = direct["body"]
        if name == "wrong-method":
            assert direct["allow"] == through["allow"] == "POST"
    elif name == "models":
        ours = {card["id"] for card in direct["body"]["data"]}
        through["body"]["data"] = [c for c in through["body"]["data"] if c["id"] in ours]
        for card in through["body"]["data"]:
            assert card.pop("llmserve")["replicas"] >= 1
    elif name == "chat-stream-n2-logprobs":
        for side in (direct, through):
            side["body"] = {k: fused(v) for k, v in per_choice(side["body"]).items()}
        through["body"] = within_noise(through["body"], direct["body"])
    elif name == "trailing-slash":
        assert direct["location"] == engine_url + "/v1/chat/completions"
        assert through["location"] == gateway_url + "/v1/chat/completions"
        through["location"] = direct["location"]


def within_noise(got: Any, want: Any) -> Any:
    """`got` with each `logprob` that is within LOGPROB_NOISE of `want`'s, at the same place,
    replaced by `want`'s; everything else as it was (for the exact comparison after)."""
    if isinstance(got, dict) and isinstance(want, dict):
        out = {}
        for k, v in got.items():
            w = want.get(k)
            if (k == "logprob" and isinstance(v, float) and isinstance(w, float)
                    and abs(v - w) <= LOGPROB_NOISE):
                out[k] = w
            else:
                out[k] = within_noise(v, w)
        return out
    if isinstance(got, (list, tuple)) and isinstance(want, (list, tuple)) \
            and len(got) == len(want):
        return type(got)(within_noise(g, w) for g, w in zip(got, want, strict=True))
    return got


@pytest.fixture(scope="module")
def engine(stack: LocalStack) -> str:
    return stack.worker_urls[0]


@pytest.mark.parametrize("case", range(len(cases("m"))), ids=[c[0] for c in cases("m")])
def test_httpx_raw(stack: LocalStack, engine: str, model_name: str, case: int) -> None:
    name, method, path, kwargs = cases(model_name)[case]
    direct = answer(loopback.request(method, engine + path, timeout=120, **kwargs))
    through = answer(loopback.request(method, stack.gateway_url + path, timeout=120, **kwargs))
    if name in ACCEPTED:
        accepted(name, direct, through, stack.gateway_url, engine)
    assert through == direct


def test_every_forwarded_endpoint_has_a_case_and_the_engine_lists_no_other(
    engine: str, model_name: str,
) -> None:
    # The live engine's /openapi.json against the table (the fast tier holds the table to a
    # stored copy; this re-reads it, so an upgraded engine's new endpoint shows up here).
    paths = loopback.get(engine + "/openapi.json").json()["paths"]
    served = {e.path for e in ENDPOINTS}
    assert set(paths) <= served | set(NOT_FORWARDED), set(paths) - served - set(NOT_FORWARDED)
    tested = {path for _, _, path, _ in cases(model_name)}
    untested = {e.path for e in ENDPOINTS if "{" not in e.path} - tested
    assert untested <= {"/v1/chat/completions/batch", "/v1/systemone"}, untested


# -- the OpenAI SDK ------------------------------------------------------------------------------

def sdk_calls(model: str) -> dict[str, Callable[[openai.OpenAI], Any]]:
    chat = {"model": model, "messages": MSGS, "max_tokens": 8, "temperature": 0}
    return {
        "chat": lambda c: c.chat.completions.create(**chat),
        "chat-logprobs": lambda c: c.chat.completions.create(**chat, logprobs=True,
                                                             top_logprobs=2),
        "chat-seed-n2": lambda c: c.chat.completions.create(**{**chat, "temperature": 1.0},
                                                            seed=5, n=2),
        "chat-stream": lambda c: list(c.chat.completions.create(**chat, stream=True)),
        "chat-stream-usage": lambda c: list(c.chat.completions.create(
            **chat, stream=True, stream_options={"include_usage": True})),
        "chat-structured": lambda c: c.chat.completions.create(**{**chat, "max_tokens": 20},
                                                               response_format={
            "type": "json_schema", "json_schema": {"name": "c", "schema": {
                "type": "object", "properties": {"city": {"type": "string"}},
                "required": ["city"]}}}),
        "chat-error": lambda c: c.chat.completions.create(**{**chat, "temperature": 5}),
        "completion": lambda c: c.completions.create(model=model, prompt="Paris is",
                                                     max_tokens=8, temperature=0, logprobs=1),
        "completion-stream": lambda c: list(c.completions.create(
            model=model, prompt="Paris is", max_tokens=8, temperature=0, stream=True)),
        "responses": lambda c: c.responses.create(model=model, input="Say hi.",
                                                  max_output_tokens=8, temperature=0),
        "responses-stream": lambda c: list(c.responses.create(
            model=model, input="Say hi.", max_output_tokens=8, temperature=0, stream=True)),
        "embeddings-not-here": lambda c: c.embeddings.create(model=model, input="x"),
        "models": lambda c: [m.id for m in c.models.list()],
    }


def outcome(call: Callable[[], Any]) -> Any:
    """A call's result as comparable data, or its error as the SDK raised it."""
    try:
        result = call()
    except openai.APIStatusError as exc:
        return {"error": type(exc).__name__, "status": exc.status_code, "body": exc.body}
    if isinstance(result, list):
        return chunks([scrub(r.model_dump()) if hasattr(r, "model_dump") else r for r in result])
    return scrub(result.model_dump())


SDK_CASES = list(sdk_calls("m"))


@pytest.mark.parametrize("name", SDK_CASES)
def test_openai_sdk_sync(stack: LocalStack, engine: str, model_name: str, name: str) -> None:
    call = sdk_calls(model_name)[name]
    direct = openai.OpenAI(base_url=engine + "/v1", api_key="x", max_retries=0)
    through = openai.OpenAI(base_url=stack.gateway_url + "/v1", api_key="x", max_retries=0)
    with direct, through:
        assert outcome(lambda: call(through)) == outcome(lambda: call(direct))


def test_openai_sdk_async_concurrent(stack: LocalStack, engine: str, model_name: str) -> None:
    # The same mix, concurrently, with AsyncOpenAI: streams and whole answers at once.
    async def run(base: str) -> list[Any]:
        async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="x", max_retries=0) as c:
            async def chat_stream(seed: int) -> Any:
                s = await c.chat.completions.create(
                    model=model_name, messages=MSGS, max_tokens=8, temperature=1.0, seed=seed,
                    stream=True)
                return chunks([scrub(x.model_dump()) async for x in s])

            async def responses() -> Any:
                r = await c.responses.create(model=model_name, input="Say hi.",
                                             max_output_tokens=8, temperature=0)
                return scrub(r.model_dump())

            async def error() -> Any:
                try:
                    await c.chat.completions.create(model=model_name, messages=MSGS,
                                                    max_tokens="ten")
                except openai.BadRequestError as exc:
                    return exc.body
                return None

            return list(await asyncio.gather(*[chat_stream(s) for s in range(4)], responses(),
                                             error()))

    assert asyncio.run(run(stack.gateway_url)) == asyncio.run(run(engine))


# -- langchain-openai ----------------------------------------------------------------------------

def lc_outcome(call: Callable[[], Any]) -> Any:
    """A LangChain call's message (a stream's chunks added up: how LangChain joins them), ids
    aside, or the OpenAI SDK error it raised."""
    try:
        result = call()
    except openai.APIStatusError as exc:
        return {"error": type(exc).__name__, "status": exc.status_code, "body": exc.body}
    if isinstance(result, list):
        total: BaseMessageChunk = result[0]
        for chunk in result[1:]:
            total = total + chunk
        result = total
    return scrub(result.model_dump())


def lc_calls(model: str) -> dict[str, Callable[[ChatOpenAI], Any]]:
    msgs = [("user", MSGS[0]["content"])]
    return {
        "invoke": lambda c: c.invoke(msgs),
        "invoke-system": lambda c: c.invoke([("system", "Answer in one word."), *msgs]),
        "logprobs": lambda c: c.bind(logprobs=True, top_logprobs=2).invoke(msgs),
        "stream": lambda c: list(c.stream(msgs)),
        "structured": lambda c: c.bind(response_format={
            "type": "json_schema", "json_schema": {"name": "c", "schema": {
                "type": "object", "properties": {"city": {"type": "string"}},
                "required": ["city"]}}}, max_tokens=20).invoke(msgs),
        "error": lambda c: c.bind(temperature=5).invoke(msgs),
    }


def chat_model(base: str, model: str) -> ChatOpenAI:
    return ChatOpenAI(model=model, base_url=base + "/v1", api_key="x",  # type: ignore[arg-type]
                      temperature=0, max_tokens=8, max_retries=0, stream_usage=True)


@pytest.mark.parametrize("name", list(lc_calls("m")))
def test_langchain_openai(stack: LocalStack, engine: str, model_name: str, name: str) -> None:
    call = lc_calls(model_name)[name]
    through = lc_outcome(lambda: call(chat_model(stack.gateway_url, model_name)))
    assert through == lc_outcome(lambda: call(chat_model(engine, model_name)))


def test_langchain_openai_async_concurrent(stack: LocalStack, engine: str,
                                           model_name: str) -> None:
    # ainvoke and astream, at once, as an async LangChain app sends them.
    async def run(base: str) -> list[Any]:
        c = chat_model(base, model_name)
        msgs = [("user", MSGS[0]["content"])]

        async def astream() -> Any:
            got = [chunk async for chunk in c.astream(msgs)]
            return lc_outcome(lambda: got)

        async def ainvoke(seed: int) -> Any:
            msg = await c.bind(seed=seed, temperature=1.0).ainvoke(msgs)
            return lc_outcome(lambda: msg)

        return list(await asyncio.gather(astream(), astream(), *[ainvoke(s) for s in range(3)]))

    assert asyncio.run(run(stack.gateway_url)) == asyncio.run(run(engine))


# -- the Anthropic SDK (vLLM's Messages API) -----------------------------------------------------

def anthropic_calls(model: str) -> dict[str, Callable[[anthropic.Anthropic], Any]]:
    # The SDK takes no temperature any more (Anthropic's newer models fix it); vLLM does.
    ask = {"model": model, "max_tokens": 8, "messages": MSGS, "extra_body": {"temperature": 0}}
    return {
        "create": lambda c: c.messages.create(**ask),
        "system": lambda c: c.messages.create(**ask, system="Answer in one word."),
        "stream": lambda c: list(c.messages.create(**ask, stream=True)),
        "stop-sequence": lambda c: c.messages.create(**{**ask, "max_tokens": 16},
                                                     stop_sequences=["."]),
        "count-tokens": lambda c: c.messages.count_tokens(model=model, messages=MSGS),
        "error": lambda c: c.messages.create(**{**ask, "max_tokens": -1}),
    }


def anthropic_outcome(call: Callable[[], Any]) -> Any:
    try:
        result = call()
    except anthropic.APIStatusError as exc:
        return {"error": type(exc).__name__, "status": exc.status_code, "body": exc.body}
    if isinstance(result, list):
        return chunks([scrub(r.model_dump()) for r in result])
    return scrub(result.model_dump())


@pytest.mark.parametrize("name", list(anthropic_calls("m")))
def test_anthropic_sdk(stack: LocalStack, engine: str, model_name: str, name: str) -> None:
    call = anthropic_calls(model_name)[name]
    with anthropic.Anthropic(base_url=engine, api_key="x", max_retries=0) as direct, \
            anthropic.Anthropic(base_url=stack.gateway_url, api_key="x", max_retries=0) as gw:
        assert anthropic_outcome(lambda: call(gw)) == anthropic_outcome(lambda: call(direct))


def test_anthropic_sdk_async_concurrent(stack: LocalStack, engine: str, model_name: str) -> None:
    async def run(base: str) -> list[Any]:
        async with anthropic.AsyncAnthropic(base_url=base, api_key="x", max_retries=0) as c:
            async def stream() -> Any:
                s = await c.messages.create(model=model_name, max_tokens=8, messages=MSGS,
                                            extra_body={"temperature": 0}, stream=True)
                return chunks([scrub(e.model_dump()) async for e in s])

            async def create() -> Any:
                m = await c.messages.create(model=model_name, max_tokens=8, messages=MSGS,
                                            extra_body={"temperature": 0})
                return scrub(m.model_dump())

            return list(await asyncio.gather(stream(), stream(), create()))

    assert asyncio.run(run(stack.gateway_url)) == asyncio.run(run(engine))
