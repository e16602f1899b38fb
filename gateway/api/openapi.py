"""The gateway's OpenAPI document, served at /openapi.json.

Written out, not generated: the completion endpoints are raw ASGI (app.FastLane), invisible to
FastAPI. It states what the gateway reads of a body (model and stream, api/schemas.py; docs/api.md)
and every status it can answer; every other field, and whether a body is valid at all, is the
engine's to judge: its 400 is relayed as it wrote it. tests/gateway/api/
test_openapi.py holds the gateway to it with schemathesis. The admin API (/admin/, api/admin.py;
docs/lora.md) is the operators', installed only with an admin key, and not in this document.
"""

from __future__ import annotations

from typing import Any

_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}},
}}}

_WHY = {
    "400": "the request is malformed (the error's param names the field)",
    "401": "missing or unknown API key (only when the gateway has a keys file)",
    "404": "no such model, or no such path",
    "405": "wrong method; the Allow header names the right one",
    "413": "request body over the limit",
    "415": "the body was sent compressed (Content-Encoding); send it as plain JSON",
    "429": "the API key's requests or tokens per minute are spent; see Retry-After",
    "502": "the model server failed to answer",
    "503": "overloaded, no healthy replica, or shutting down; see Retry-After",
    "504": "the model server did not answer in time",
}


def _errors(*codes: str) -> dict[str, Any]:
    return {c: {"description": _WHY[c],
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
            for c in codes}


# What the gateway reads of a body: every other field, and these fields' validity, are the
# engine's to judge. Any JSON object is forwarded.
_COMMON: dict[str, Any] = {
    "model": {"description": "the model (or LoRA adapter) to route to; absent or not a "
                             "non-empty string: the one model served, or a 400 when several are"},
    "stream": {"description": "read as the engine reads it (true, \"true\", 1 ...): the answer "
                              "streams as server-sent events"},
}
_CHAT = {"type": "object", "properties": {
    **_COMMON, "messages": {"description": "the conversation; the engine validates it"}}}
_COMPLETION = {"type": "object", "properties": {
    **_COMMON, "prompt": {"description": "the prompt; the engine validates it"}}}


def _completion_op(summary: str, body: dict[str, Any]) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "responses": {
            "200": {"description": "the answer: JSON, or server-sent events when stream is true "
                                   "(a stream broken after its first byte ends with one error "
                                   "event)",
                    "content": {"application/json": {"schema": {"type": "object"}},
                                # JSON chunks, then the literal [DONE]: no one schema.
                                "text/event-stream": {"schema": {}}}},
            **_errors("400", "401", "404", "413", "415", "429", "502", "503", "504"),
        },
    }}


def _get(summary: str, content_type: str, *errors: str) -> dict[str, Any]:
    return {"get": {"summary": summary, "responses": {
        "200": {"description": "OK", "content": {content_type: {"schema": {}}}},
        **_errors(*errors),
    }}}


def openapi_schema(title: str, version: str) -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": {
            "/v1/chat/completions": _completion_op("OpenAI chat completions", _CHAT),
            "/v1/completions": _completion_op("OpenAI completions", _COMPLETION),
            "/v1/models": _get("models served by at least one available replica",
                               "application/json", "401"),
            "/health": _get("liveness: the process answers", "application/json"),
            "/ready": _get("readiness: some replica is up and the gateway is not draining",
                           "application/json", "503"),
            "/metrics": _get("Prometheus metrics", "text/plain"),
        },
        "components": {"schemas": {"Error": _ERROR}},
    }
