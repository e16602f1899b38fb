"""The hot path's entry: one request to an engine endpoint (api/endpoints.py), streamed or not, as a
raw ASGI endpoint (a FastAPI route would wrap every SSE event in Starlette's response machinery).

It keeps the request's lifecycle: its body, admission (flow control), and its end however it comes:
- a client disconnect at any point cancels the request, and the upstream connection is closed,
  not pooled, so the engine aborts the generation;
- a drain whose timeout expires ends it with a 503, or mid-stream with one in-band error event;
- a bug is logged and answered in OpenAI's shape if the client has seen nothing yet.
Where it goes from there is api/forward.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from starlette.types import Message, Receive, Scope, Send

from gateway.api.deps import ProxyDeps
from gateway.api.endpoints import Endpoint
from gateway.api.forward import Forwarder
from gateway.api.inflight import DRAIN_EXPIRED, Exchange
from gateway.api.replicas import any_model, default_model, pinned
from gateway.api.schemas import ParsedRequest, encoding_error, parse_other, parse_request
from gateway.api.splice import WRITER_KEY, ClientWriter
from gateway.errors import GatewayError, PayloadTooLarge, send_error, sse_error_event
from gateway.flow.door import admit

log = logging.getLogger("gateway.proxy")


class ClientGone(Exception):
    """The client disconnected; nothing more can be sent."""


async def read_body(receive: Receive) -> bytes:
    # The body-limit middleware stops oversized bodies before they pile up here.
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks) if len(chunks) != 1 else chunks[0]


def _content_type(scope: Scope) -> bytes:
    for k, v in scope["headers"]:
        if k == b"content-type":
            return bytes(v)
    return b""


class ProxyEndpoint:
    def __init__(self, deps: ProxyDeps, endpoint: Endpoint) -> None:
        self._d = deps
        self._endpoint = endpoint
        self._kind = endpoint.kind
        self._forward = Forwarder(deps, endpoint).forward

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            raw = await read_body(receive)
            if self._kind == "other":
                req = parse_other(raw, self._endpoint, _content_type(scope))
            else:
                req = parse_request(raw, self._kind)
                if not req.readable:
                    # A compressed body: the engine could not read it either; say why.
                    unsupported = encoding_error(scope["headers"])
                    if unsupported is not None:
                        raise unsupported
            if not req.model and self._endpoint.route != "any":
                req.model = default_model(self._d.router, self._d.parent_of)
        except ClientGone:
            return
        except PayloadTooLarge:
            raise  # the body limit's (api/middleware.py): it drains the body, then answers
        except GatewayError as exc:
            await send_error(send, exc)
            return

        # From here a hang-up cancels this task (closing the upstream response): the edge protocol
        # reports it from connection_lost, other servers through receive(), awaited by a watcher.
        task = asyncio.current_task()
        state = scope.get("state", {})
        writer: ClientWriter | None = state.get(WRITER_KEY)
        ex = Exchange(task, started, state.get("request_id", "-"), writer)
        inflight = self._d.inflight
        inflight.add(ex)
        watcher = None
        if writer is not None:
            writer.lost = ex.hang_up
        else:
            watcher = loop.create_task(_watch_disconnect(receive, ex))
        try:
            await self._serve(scope, req, raw, send, ex)
        except asyncio.CancelledError:
            if ex.expired:
                # The drain timed out (InFlight.expire): answer, or end the stream, in-band.
                if task is not None:
                    task.uncancel()
                await _end_expired(send, ex)
            elif not ex.gone:
                raise
            # Our own cancellation for a disconnect: absorb it, the request is over.
            elif task is not None:
                task.uncancel()
        except Exception:
            # A bug: log it, and answer in OpenAI's shape if the client has seen nothing yet.
            log.exception("proxy error")
            with contextlib.suppress(Exception):
                await send_error(send, GatewayError("internal error"))
        finally:
            if watcher is not None:
                watcher.cancel()
            # The writer is the connection's: the next request on it may have set its own already.
            if writer is not None and writer.lost == ex.hang_up:
                writer.lost = None
            inflight.discard(ex)

    async def _serve(
        self, scope: Scope, req: ParsedRequest, raw: bytes, send: Send, ex: Exchange
    ) -> None:
        d = self._d
        endpoint = self._endpoint
        pin: str | None = None
        try:
            if endpoint.pinnable:
                # Before admission: a response fetched or cancelled by id is admitted (per-key
                # limits, a slot, the tenant's count) with the model of the replica holding it.
                pin = await d.pin(endpoint, req, scope)
                if pin is not None and not req.model:
                    models = pinned(d, pin).models
                    req.model = min(models) if models else ""
                if not req.model and endpoint.route == "any":
                    req.model = any_model(d)
            admitted = await admit(d.flow, d.router, d.wake, d.parent_of, req.model,
                                   scope.get("state", {}).get("api_key"), scope["headers"],
                                   req.stream)
        except GatewayError as exc:
            label = req.model if d.router.knows_model(req.model) else "unknown"
            d.metrics.requests.labels(label, endpoint.label, "", str(exc.status)).inc()
            await send_error(send, exc)
            return
        if admitted is None:
            await self._forward(scope, req, raw, send, ex, None, None, pin)
            return
        pool, tenant = admitted
        try:
            await self._forward(scope, req, raw, send, ex, pool, tenant, pin)
        finally:
            pool.release(tenant.name, req.stream)


async def _watch_disconnect(receive: Receive, ex: Exchange) -> None:
    message: Message = await receive()
    # Once the response is complete uvicorn answers every receive() with http.disconnect: that
    # is not a hang-up, and cancelling then would abort the upstream connection while the proxy
    # reads the chunked terminator, which may come in a later read than [DONE] (hang_up checks).
    if message["type"] == "http.disconnect":
        ex.hang_up()


async def _end_expired(send: Send, ex: Exchange) -> None:
    """Answer a request the drain timeout cut: a 503 if the client has seen nothing, else one
    in-band error event that closes the stream. Never raises (the client may be gone too)."""
    with contextlib.suppress(Exception):
        if not ex.head_sent:
            await send_error(send, DRAIN_EXPIRED)
        elif not ex.responded:
            await send({"type": "http.response.body", "body": sse_error_event(DRAIN_EXPIRED),
                        "more_body": False})
