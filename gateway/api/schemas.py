"""Request validation for the OpenAI endpoints the gateway proxies, by hand: it runs on every
request, and the engine validates the long tail of sampling fields itself. Checked here: what the
gateway depends on (model, stream, stream_options) and the fields whose wrong types would surface
as confusing engine errors, each answered with OpenAI's 400 naming the `param`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.api.endpoints import Endpoint, Kind
from gateway.api.form import form_fields
from gateway.errors import InvalidRequest, UnsupportedMediaType

# The sampling fields checked here (api/openapi.py documents them from the same tables).
COUNTS = ("max_tokens", "max_completion_tokens", "n")  # integers >= 1
RANGES = {"temperature": (0, 2), "top_p": (0, 1)}  # numbers within [lo, hi]


@dataclass(slots=True)
class ParsedRequest:
    kind: Kind
    body: dict[str, Any]
    model: str
    stream: bool
    client_wants_usage: bool


def _is_int(v: object) -> bool:
    # 5.0 is an integer to JSON Schema and to the engine (vLLM's pydantic models, lax mode). The
    # parser reads integers beyond int64/uint64 as floats: those are out of range.
    if isinstance(v, float):
        return v.is_integer() and -(2.0**63) < v < 2.0**64
    return isinstance(v, int) and not isinstance(v, bool)


def _check_prompt(v: object) -> None:
    if isinstance(v, str):
        return
    if isinstance(v, list) and v:
        if all(isinstance(p, str) for p in v) or all(_is_int(p) for p in v):
            return
        if all(isinstance(p, list) and p and all(_is_int(t) for t in p) for p in v):
            return
    raise InvalidRequest(
        "prompt must be a string, an array of strings, or an array (of arrays) of token ids",
        param="prompt")


def parse_request(raw: bytes, kind: Kind) -> ParsedRequest:
    if not raw:
        raise InvalidRequest("request body is empty; expected a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc.msg}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")

    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model is required and must be a non-empty string", param="model")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidRequest("stream must be a boolean", param="stream")

    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise InvalidRequest("messages must be a non-empty array", param="messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise InvalidRequest(
                    f"messages[{i}] must be an object with a string 'role'", param=f"messages[{i}]")
    elif "prompt" not in body:
        raise InvalidRequest("prompt is required", param="prompt")
    else:
        _check_prompt(body["prompt"])

    wants_usage = False
    so = body.get("stream_options")
    if so is not None:
        if not isinstance(so, dict):
            raise InvalidRequest("stream_options must be an object", param="stream_options")
        if not stream:
            raise InvalidRequest(
                "stream_options is only allowed when stream is true", param="stream_options")
        # null is "not set", as for `stream` (and as vLLM reads it).
        iu = so.get("include_usage")
        if iu is None:
            iu = False
        if not isinstance(iu, bool):
            raise InvalidRequest(
                "stream_options.include_usage must be a boolean",
                param="stream_options.include_usage")
        wants_usage = iu

    for name in COUNTS:
        v = body.get(name)
        if v is not None and (not _is_int(v) or v < 1):
            raise InvalidRequest(f"{name} must be an integer >= 1", param=name)
    for name, (lo, hi) in RANGES.items():
        v = body.get(name)
        if v is not None and (type(v) not in (int, float) or not lo <= v <= hi):
            raise InvalidRequest(f"{name} must be a number between {lo:g} and {hi:g}", param=name)
    return ParsedRequest(kind, body, model, stream, wants_usage)


_FORM_FIELDS = frozenset(("model", "stream"))
# The strings pydantic's lax mode (vLLM's request models) reads as booleans.
_TRUE = frozenset(("1", "on", "t", "true", "y", "yes"))


def lax_true(v: object) -> bool:
    """True where vLLM's request models would read `v` as true (a bool, 1, or a string such as
    "true" or "yes"); anything else, wrong types included, is false here and the engine's to
    judge."""
    if isinstance(v, bool):
        return v
    if isinstance(v, int | float):
        return v == 1
    return isinstance(v, str) and v.strip().lower() in _TRUE


def parse_other(raw: bytes, endpoint: Endpoint, content_type: bytes) -> ParsedRequest:
    """What the gateway reads of a request to an engine endpoint other than the completions:
    the model it routes by and whether the answer streams. Nothing is refused here: a body the
    gateway cannot read has no model (routed to the one served model, if one is, whose engine
    answers for the body), and every other field is the engine's to validate."""
    body: dict[str, Any] = {}
    if endpoint.route == "form":
        fields = form_fields(content_type, raw, _FORM_FIELDS)
        model = fields.get("model", "")
        stream = lax_true(fields.get("stream"))
    else:
        if endpoint.route == "body" and raw:
            try:
                parsed = orjson.loads(raw)
            except orjson.JSONDecodeError:
                parsed = None
            if isinstance(parsed, dict):
                body = parsed
        m = body.get("model")
        model = m if isinstance(m, str) else ""
        stream = lax_true(body.get("stream"))
    # Nothing is asked on the client's behalf, so nothing is stripped: the relay passes all.
    return ParsedRequest(endpoint.kind, body, model, stream, True)


def encoding_error(headers: Iterable[tuple[bytes, bytes]]) -> UnsupportedMediaType | None:
    """Why a body that failed to parse did, when it was sent compressed: the gateway does not
    decompress bodies (a small one could inflate far past the body limit). Asked only once parsing
    failed, so the common request pays nothing for it."""
    for k, v in headers:
        if k == b"content-encoding" and v.strip().lower() not in (b"", b"identity"):
            return UnsupportedMediaType(
                f"Content-Encoding {v.decode('latin-1')!r} is not supported; send the JSON body "
                "uncompressed")
    return None
