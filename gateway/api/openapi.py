"""The gateway's OpenAPI document, served at /openapi.json.

Written out, not generated: the completion endpoints are raw ASGI (app.FastLane), invisible to
FastAPI. It states what the gateway checks (api/schemas.py) and every status it can answer, each
error in OpenAI's shape; other fields are the engine's to validate. tests/gateway/api/
test_openapi.py holds the gateway to it with schemathesis. The admin API (/admin/, api/admin.py;
docs/lora.md) is the operators', installed only with an admin key, and not in this document.
"""

from __future__ import annotations

from typing import Any

from gateway.api.schemas import COUNTS, RANGES

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


# Integers are what the JSON parser (orjson) reads, int64 or uint64: bigger ones are a 400.
_INT64 = {"minimum": -(2**63), "maximum": 2**64 - 1}
_COUNT = {"type": ["integer", "null"], "minimum": 1, "maximum": 2**64 - 1}

# What gateway/api/schemas.py checks; anything else is the engine's to judge.
_COMMON: dict[str, Any] = {
    "model": {"type": "string", "minLength": 1},
    "stream": {"type": ["boolean", "null"]},
    **dict.fromkeys(COUNTS, _COUNT),
    **{name: {"type": ["number", "null"], "minimum": lo, "maximum": hi}
       for name, (lo, hi) in RANGES.items()},
}

_CHAT = {
    "type": "object", "required": ["model", "messages"],
    "properties": {**_COMMON, "messages": {
        "type": "array", "minItems": 1,
        "items": {"type": "object", "required": ["role"],
                  "properties": {"role": {"type": "string"}}},
    }},
}

_TOKENS = {"type": "array", "minItems": 1, "items": {"type": "integer", **_INT64}}
_COMPLETION = {
    "type": "object", "required": ["model", "prompt"],
    "properties": {**_COMMON, "prompt": {"anyOf": [
        {"type": "string"},
        {"type": "array", "minItems": 1, "items": {"type": "string"}},
        _TOKENS,
        {"type": "array", "minItems": 1, "items": _TOKENS},
    ]}},
}


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
