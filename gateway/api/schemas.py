"""What the gateway reads of a request, by hand (it runs on every request): the model it routes
by, whether the answer streams, whether the client asked for usage. Nothing else is judged here:
the engine validates the request and answers for it, so the gateway never refuses what the engine
would serve (docs/api.md). Values are read as vLLM's request models read them (pydantic's lax mode:
"true" is true, "5" is 5); one the gateway cannot read is left for the engine to refuse.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gateway.api.endpoints import Endpoint, Kind
from gateway.api.form import form_fields
from gateway.errors import UnsupportedMediaType
from gateway.jsonobj import json_object


@dataclass(slots=True)
class ParsedRequest:
    kind: Kind
    body: dict[str, Any]
    # "" when the request names none the gateway can read: the one model served answers it.
    model: str
    stream: bool
    # The client asked for usage, or nothing may be asked on its behalf: nothing is stripped.
    client_wants_usage: bool
    # The body is a JSON object (else the engine answers for it, or a 415 if it came compressed).
    readable: bool = True


def parse_request(raw: bytes, kind: Kind) -> ParsedRequest:
    """A completion request (chat or not). Never raises: what the gateway cannot read is
    forwarded for the engine to answer."""
    body = json_object(raw)
    if body is None:
        return ParsedRequest(kind, {}, "", False, True, readable=False)
    m = body.get("model")
    stream = lax_true(body.get("stream"))
    so = body.get("stream_options")
    # Usage is asked for on the client's behalf only where the request leaves room for it
    # (stream_options absent, or an object): a malformed one goes to the engine untouched.
    wants_usage = lax_true(so.get("include_usage")) if isinstance(so, dict) else so is not None
    return ParsedRequest(kind, body, m if isinstance(m, str) else "", stream, wants_usage)


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
        if endpoint.route == "body":
            body = json_object(raw) or {}
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
