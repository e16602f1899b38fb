"""The OpenAI error model and every exception handler of the gateway.

Every non-2xx body the gateway emits comes from here, in OpenAI's shape:
``{"error": {"message": str, "type": str, "param": str | None, "code": str | None}}``.
Raw-ASGI code uses `send_error`; for FastAPI routes `install_handlers` turns `GatewayError`s and
FastAPI's own errors into the same shape. No handler ever echoes a traceback to the client.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from math import ceil
from time import monotonic

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import Send

from gateway.jsonobj import json_object

log = logging.getLogger("gateway.errors")

JSON_HEADERS = ((b"content-type", b"application/json"),)


class GatewayError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str | None = None
    # What the client reads instead of `message`, when `message` holds internal detail (replica
    # addresses, an upstream's own body) that belongs in the log only.
    public: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.retry_after = None if retry_after is None else retry_after_s(retry_after)

    def body(self) -> bytes:
        return error_body(self.public or self.message, self.type, self.param, self.code)

    def headers(self) -> list[tuple[bytes, bytes]]:
        h = list(JSON_HEADERS)
        if self.retry_after is not None:
            h.append((b"retry-after", str(self.retry_after).encode()))
        return h


def retry_after_s(seconds: float) -> int:
    """The one rounding of a wait for clients: the Retry-After header and every message that
    names the wait ("retry after Ns") say this number. Whole seconds, rounded up: a client that
    waits exactly that long must find the door open again. Never 0, which invites a hot retry
    loop."""
    return max(1, ceil(seconds))


class InvalidRequest(GatewayError):
    status, type = 400, "invalid_request_error"


class AuthenticationFailed(GatewayError):
    status, type, code = 401, "invalid_request_error", "invalid_api_key"


class ModelNotFound(GatewayError):
    status, type, code = 404, "invalid_request_error", "model_not_found"


class NotFound(GatewayError):
    status, type, code = 404, "invalid_request_error", "not_found"


class MethodNotAllowed(GatewayError):
    status, type, code = 405, "invalid_request_error", "method_not_allowed"


class PayloadTooLarge(GatewayError):
    status, type, code = 413, "invalid_request_error", "payload_too_large"


class UnsupportedMediaType(GatewayError):
    status, type, code = 415, "invalid_request_error", "unsupported_media_type"


class RequestTimeout(GatewayError):
    status, type, code = 408, "invalid_request_error", "request_timeout"


class HeadTooLarge(GatewayError):
    status, type, code = 431, "invalid_request_error", "request_header_fields_too_large"


class RateLimited(GatewayError):
    status, type, code = 429, "rate_limit_error", "rate_limit_exceeded"


class UpstreamFailed(GatewayError):
    """`message` is the detail for the log (which replica, what it said); clients read `public`."""

    status, type, code = 502, "server_error", "upstream_error"
    public = ("The model server failed to answer; the gateway's log has the detail under this "
              "response's x-request-id")


class Unavailable(GatewayError):
    status, type, code = 503, "server_error", "service_unavailable"


class UpstreamTimeout(GatewayError):
    status, type, code = 504, "server_error", "upstream_timeout"


class RateLimitedLog:
    """Warnings from one call site, at most `burst` per `interval_s`; the rest are counted and the
    count rides on the next line let through, so a flood of failures is not a flood of lines."""

    def __init__(self, logger: logging.Logger, interval_s: float = 10.0, burst: int = 5) -> None:
        self._log = logger
        self._interval = interval_s
        self._burst = burst
        self._window = -interval_s
        self._sent = 0
        self.suppressed = 0

    def warning(self, msg: str, *args: object) -> None:
        now = monotonic()
        if now - self._window >= self._interval:
            self._window, self._sent = now, 0
        if self._sent >= self._burst:
            self.suppressed += 1
            return
        self._sent += 1
        if self.suppressed:
            msg += " (%d similar line(s) suppressed)"
            args = (*args, self.suppressed)
            self.suppressed = 0
        self._log.warning(msg, *args)


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})


def sse_error_event(exc: GatewayError) -> bytes:
    """The single in-band event that ends a stream which broke after its first byte."""
    return b"data: " + exc.body() + b"\n\n"


async def send_error(
    send: Send, exc: GatewayError, extra_headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    await send_body(send, exc.status, exc.body(), [*exc.headers(), *extra_headers])


async def send_body(send: Send, status: int, body: bytes,
                    headers: Sequence[tuple[bytes, bytes]] = JSON_HEADERS) -> None:
    """A whole response: `headers` with the content length, then `body`."""
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


def upstream_error_body(
    status: int, body: bytes, warnings: RateLimitedLog, request_id: str = "-"
) -> bytes | None:
    """An engine's error answer as the client gets it: None when `body` is an error object
    (vLLM's `{"error": {...}}`, the flat `{"object": "error", ...}` of older versions, or
    FastAPI's `{"detail": ...}` for a path or method the engine does not serve), which is relayed
    byte for byte; else the gateway's own error body. A body that is not an error
    object (an HTML page from a proxy in front of the engine, say) is never relayed: it may name
    internal hosts; `warnings` (the log) gets it."""
    data = json_object(body)
    if data is not None:
        err = data.get("error")
        if not (isinstance(err, dict) and isinstance(err.get("message"), str)):
            err = data
        if isinstance(err.get("message"), str) or "detail" in data:
            return None
    if body.strip():
        warnings.warning("request %s: upstream answered HTTP %d with a non-JSON body: %r",
                         request_id, status, body[:300])
    return error_body(f"upstream returned HTTP {status}", _type_for(status), None, None)


def _type_for(status: int) -> str:
    return "invalid_request_error" if 400 <= status < 500 else "server_error"


def _json(exc: GatewayError, extra: Mapping[str, str] | None = None) -> Response:
    headers = {k.decode(): v.decode() for k, v in exc.headers()}
    if extra:
        headers.update(extra)
    return Response(exc.body(), status_code=exc.status, headers=headers)


def install_handlers(app: FastAPI) -> None:
    async def on_gateway_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, GatewayError)
        return _json(exc)

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        mapped: GatewayError
        if exc.status_code == 404:
            mapped = NotFound(f"No such endpoint: {request.url.path}")
        elif exc.status_code == 405:
            allow = (exc.headers or {}).get("Allow", "")
            mapped = MethodNotAllowed(
                f"Method {request.method} is not allowed on {request.url.path}; use {allow}")
        else:
            mapped = GatewayError(str(exc.detail))
            mapped.status = exc.status_code
            mapped.type = _type_for(exc.status_code)
        # Headers the framework set (Allow on a 405) stay; the content type is ours.
        extra = {k: v for k, v in (exc.headers or {}).items() if k.lower() != "content-type"}
        return _json(mapped, extra)

    async def on_invalid(_: Request, exc: Exception) -> Response:
        # FastAPI's own answer is a 422 {"detail": [...]}: a typed path, query or body parameter
        # that does not validate is OpenAI's 400 naming it, as the proxy's own checks answer.
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(part) for part in first.get("loc", ()) if part not in ("path", "query", "body")]
        param = ".".join(loc) or None
        return _json(InvalidRequest(f"{param or 'request'}: {first.get('msg', 'invalid')}",
                                    param=param))

    async def on_unexpected(_: Request, exc: Exception) -> Response:
        log.exception("unhandled error")
        return _json(GatewayError("internal error"))

    app.add_exception_handler(GatewayError, on_gateway_error)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(RequestValidationError, on_invalid)
    app.add_exception_handler(Exception, on_unexpected)
