"""The hot path: proxy one OpenAI completion request to a replica, streamed or not.

This is a raw ASGI endpoint, not a FastAPI route function: a route would wrap every SSE event in
Starlette's response machinery, and the per-event cost is what bounds the gateway (see README,
performance). Rules it keeps:
- retry on another replica only while nothing has reached the client; the response head is held
  back until the first upstream body chunk for exactly that reason;
- a stream that breaks after its first byte ends with one in-band error event and no [DONE];
- a client disconnect at any point (queued, prefill, mid-stream) cancels the request, and the
  upstream connection is closed, not pooled, so the engine aborts the generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import orjson
from starlette.types import Message, Receive, Scope, Send

from gateway.api.accounting import count_usage, log_failure
from gateway.api.deps import ProxyDeps
from gateway.api.inflight import DRAIN_EXPIRED, Exchange
from gateway.api.schemas import Kind, ParsedRequest, parse_request
from gateway.api.splice import WRITER_KEY, ClientWriter
from gateway.api.stream import relay_stream
from gateway.errors import (
    GatewayError,
    ModelNotFound,
    Unavailable,
    UpstreamFailed,
    normalize_upstream_error,
    send_error,
    sse_error_event,
)
from gateway.flow.admission import Pool
from gateway.flow.batcher import Batcher, UpstreamCall, batch_key
from gateway.flow.tenants import Tenant
from gateway.routing.backend import Backend
from gateway.routing.policy import RouteRequest
from gateway.routing.router import Router
from gateway.transport.base import UpstreamResponse
from gateway.usage import usage_counts

log = logging.getLogger("gateway.proxy")


class ClientGone(Exception):
    """The client disconnected; nothing more can be sent."""


async def read_body(receive: Receive) -> bytes:
    # The body-limit middleware wraps `receive` and stops oversized bodies before they pile up here.
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks) if len(chunks) != 1 else chunks[0]


class ProxyEndpoint:
    def __init__(self, deps: ProxyDeps, path: str, kind: Kind) -> None:
        self._d = deps
        self._path = path
        self._kind = kind
        self._session_header = deps.settings.affinity.session_header.lower().encode("latin-1")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            raw = await read_body(receive)
            req = parse_request(raw, self._kind)
        except ClientGone:
            return
        except GatewayError as exc:
            await send_error(send, exc)
            return

        # From here the client may vanish at any await: a hang-up cancels this task, which unwinds
        # into the upstream response's close(). The edge protocol reports it from its
        # connection_lost (a callback, no task per request); other servers only through
        # receive(), which a watcher task awaits in the background.
        task = asyncio.current_task()
        writer: ClientWriter | None = scope.get(WRITER_KEY)
        ex = Exchange(task, started, scope.get("state", {}).get("request_id", "-"), writer)
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
            # A bug, not an upstream failure: log it, and answer in OpenAI's shape if we still can
            # (the fast lane has no framework handler behind it).
            log.exception("proxy error")
            with contextlib.suppress(Exception):
                await send_error(send, GatewayError("internal error"))
        finally:
            if watcher is not None:
                watcher.cancel()
            if writer is not None:
                writer.lost = None
            inflight.discard(ex)

    async def _serve(
        self, scope: Scope, req: ParsedRequest, raw: bytes, send: Send, ex: Exchange
    ) -> None:
        d = self._d
        flow = d.flow
        # Unknown models skip admission (they end in 404 or 503 below) so that made-up model
        # names cannot create pools.
        if flow is None or not d.router.knows_model(req.model):
            await self._forward(scope, req, raw, send, ex, None, None)
            return
        tenant = flow.tenants.for_key(scope.get("state", {}).get("api_key"))
        pool = flow.pool(req.model)
        try:
            await flow.check_limits(tenant, req.model)
            if not pool.try_acquire(tenant.name, tenant.weight):
                try:
                    await pool.acquire(tenant, tenant.priority_class(scope["headers"]))
                except GatewayError:
                    tenant.refund()
                    raise
        except GatewayError as exc:
            d.metrics.requests.labels(req.model, "", str(exc.status)).inc()
            await send_error(send, exc)
            return
        tenant.admitted()
        try:
            await self._forward(scope, req, raw, send, ex, pool, tenant)
        finally:
            pool.release(tenant.name)

    async def _forward(
        self, scope: Scope, req: ParsedRequest, raw: bytes, send: Send, ex: Exchange,
        pool: Pool | None, tenant: Tenant | None,
    ) -> None:
        d = self._d
        model = req.model
        if req.stream and not req.client_wants_usage:
            # Ask for usage on our own account (token metrics); SseRelay strips it again.
            req.body["stream_options"] = {**(req.body.get("stream_options") or {}),
                                          "include_usage": True}
            raw = orjson.dumps(req.body)
        headers = _upstream_headers(scope)
        # Made-up model names skip the batcher (they end in 404 or 503 below): its metrics and
        # its queues are per model, and a client must not mint those.
        if (d.batcher is not None and self._kind == "completion" and not req.stream
                and d.router.knows_model(model)):
            key = batch_key(req.body)
            if key is not None:
                await self._batched(d.batcher, req, key, send, ex, tenant)
                return

        route = (_route_request(req, scope, self._session_header)
                 if d.router.wants_affinity(model) else None)
        tried: list[Backend] = []
        last_error: GatewayError | None = None
        for _ in range(d.settings.retries + 1):
            backend = _next_replica(d, model, tried, route)
            if backend is None:
                break
            try:
                await self._attempt(backend, req, raw, headers, send, ex, pool, tenant)
            except GatewayError as exc:
                # Nothing reached the client yet: safe to try another replica.
                last_error = _failed(d, model, backend, exc)
            else:
                return
            finally:
                backend.release()

        if last_error is None:
            if d.router.knows_any_model() and not d.router.knows_model(model):
                last_error = ModelNotFound(
                    f"The model '{model}' does not exist or is not served here", param="model"
                )
            else:
                last_error = Unavailable(
                    f"no healthy replica for model '{model}'",
                    retry_after=d.settings.health_interval_s,
                )
            # A made-up model name must not mint a metric series per request.
            label = model if d.router.knows_model(model) else "unknown"
            d.metrics.requests.labels(label, "", str(last_error.status)).inc()
        else:
            log_failure(ex, last_error)
        await send_error(send, last_error)

    async def _batched(
        self, batcher: Batcher, req: ParsedRequest, key: bytes, send: Send, ex: Exchange,
        tenant: Tenant | None,
    ) -> None:
        started = ex.started
        try:
            result = await batcher.submit(req.model, req.body, key)
        except GatewayError as exc:
            self._d.metrics.requests.labels(req.model, "", str(exc.status)).inc()
            log_failure(ex, exc)
            await send_error(send, exc)
            return
        body = result.body
        if result.status != 200:
            body = normalize_upstream_error(result.status, body, ex.rid)
        await _send_json(send, result.status, body)
        m = self._d.metrics
        # Once per client request, not per upstream call: a batch of N answers N requests.
        m.requests.labels(req.model, result.backend, str(result.status)).inc()
        if result.status == 200:
            # A whole answer has no first token to time: E2E only, never TTFT.
            now = asyncio.get_running_loop().time()
            m.e2e.labels(req.model).observe(now - started)
            count_usage(m, req.model, tenant, (result.prompt_tokens, result.completion_tokens)
                         if result.usage_known else None)

    async def _attempt(
        self,
        backend: Backend,
        req: ParsedRequest,
        raw: bytes,
        headers: dict[str, str],
        send: Send,
        ex: Exchange,
        pool: Pool | None,
        tenant: Tenant | None,
    ) -> None:
        """One try on one replica: it answers the client, or raises GatewayError while the client
        has seen nothing (the caller may then retry elsewhere)."""
        d = self._d
        dispatched = d.flow.clock() if pool is not None and d.flow is not None else 0.0
        resp = await d.transport.post(
            backend.url + self._path, raw, headers, streaming=req.stream
        )
        try:
            if resp.status != 200:
                body = await resp.read()
                resp.release()
                _note_draining(d.router, backend, resp.status, body)
                _raise_if_server_error(resp.status, body)
                # A 4xx is the caller's problem, not the replica's: no retry, no ejection.
                d.router.report_success(backend)
                await _send_json(send, resp.status,
                                 normalize_upstream_error(resp.status, body, ex.rid))
                d.metrics.requests.labels(req.model, backend.url, str(resp.status)).inc()
                return
            if req.stream:
                await relay_stream(self._d, backend, req, resp, send, ex, pool, tenant, dispatched)
            else:
                await self._relay_whole(backend, req, resp, send, ex.started, tenant, pool,
                                        dispatched)
        except BaseException:
            resp.close()
            raise

    async def _relay_whole(
        self, backend: Backend, req: ParsedRequest, resp: UpstreamResponse, send: Send,
        started: float, tenant: Tenant | None, pool: Pool | None, dispatched: float,
    ) -> None:
        d = self._d
        body = await resp.read()
        resp.release()
        done = d.flow.clock() if pool is not None and d.flow is not None else 0.0
        d.router.report_success(backend)
        await _send_json(send, 200, body)
        m = d.metrics
        series = m.series(req.model)
        # A whole answer has no first token to time: E2E only, never TTFT.
        now = asyncio.get_running_loop().time()
        series.e2e.observe(now - started)
        series.request(backend.url, "200")
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            obj = None
        counts = usage_counts(obj.get("usage")) if isinstance(obj, dict) else None
        count_usage(m, req.model, tenant, counts)
        if pool is not None and counts is not None:
            # The other request class: the whole latency, judged per generated token.
            pool.sample_whole(done - dispatched, counts[1], dispatched)

def _route_request(req: ParsedRequest, scope: Scope, session_header: bytes) -> RouteRequest:
    """What an affinity policy routes by: an explicit session key (header, else the OpenAI `user`
    field) and the prompt's bytes from its start, in a form where turn N+1 extends turn N."""
    for name, value in scope["headers"]:
        if name == session_header:
            return RouteRequest(req.model, value.decode("latin-1"))
    user = req.body.get("user")
    if isinstance(user, str) and user:
        return RouteRequest(req.model, user)
    if req.kind == "chat":
        prefix = orjson.dumps(req.body["messages"])
    else:
        prompt = req.body["prompt"]
        prefix = prompt.encode() if isinstance(prompt, str) else orjson.dumps(prompt)
    return RouteRequest(req.model, None, prefix)


def _next_replica(
    d: ProxyDeps, model: str, tried: list[Backend], route: RouteRequest | None = None
) -> Backend | None:
    """The next replica for `model` that is not in `tried`, acquired (the caller releases it);
    every pick after the first is a retry, taken from the retry budget (None when spent)."""
    budget = d.router.retry_budget
    if not tried:
        budget.request()
    backend = d.router.pick(model, tried, route)
    if backend is not None:
        if tried:
            if not budget.try_retry():
                d.metrics.retries_refused.labels(model).inc()
                return None
            d.metrics.retries.labels(model).inc()
        tried.append(backend)
        backend.acquire()
    return backend


# The error code of a worker that drains for a restart (worker/drain.py says the same).
DRAINING_CODE = "draining"


def _note_draining(router: Router, backend: Backend, status: int, body: bytes) -> None:
    """A 503 saying the replica drains takes it out of rotation now, not at the next probe: every
    request sent there meanwhile would cost a retry from the budget."""
    if status != 503:
        return
    try:
        code = orjson.loads(body)["error"]["code"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return
    if code == DRAINING_CODE:
        router.report_draining(backend)


def _raise_if_server_error(status: int, body: bytes) -> None:
    """A 5xx is the replica's failure (retry elsewhere, count towards ejection); a 4xx is not."""
    if status >= 500:
        raise UpstreamFailed(
            f"replica answered HTTP {status}: {body[:200].decode('utf-8', 'replace')}"
        )


def _failed(d: ProxyDeps, model: str, backend: Backend, exc: GatewayError) -> GatewayError:
    """Book a failed attempt on `backend` (passive health, metrics); returns `exc`."""
    d.router.report_failure(backend)
    d.metrics.requests.labels(model, backend.url, str(exc.status)).inc()
    return exc


def make_upstream_call(deps: ProxyDeps, path: str) -> UpstreamCall:
    """A whole-body POST with the proxy's replica choice and retries, for the batcher: nothing
    reaches a client here, so every failure may be retried on another replica."""

    async def call(model: str, body: bytes) -> tuple[int, bytes, str]:
        d = deps
        tried: list[Backend] = []
        last_error: GatewayError | None = None
        headers = {"content-type": "application/json"}
        for _ in range(d.settings.retries + 1):
            backend = _next_replica(d, model, tried)
            if backend is None:
                break
            try:
                resp = await d.transport.post(backend.url + path, body, headers, streaming=False)
                try:
                    raw = await resp.read()
                except BaseException:
                    resp.close()
                    raise
                resp.release()
                _note_draining(d.router, backend, resp.status, raw)
                _raise_if_server_error(resp.status, raw)
                d.router.report_success(backend)
                return resp.status, raw, backend.url
            except GatewayError as exc:
                last_error = _failed(d, model, backend, exc)
            finally:
                backend.release()
        raise last_error or Unavailable(
            f"no healthy replica for model '{model}'", retry_after=d.settings.health_interval_s
        )

    return call


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


def _upstream_headers(scope: Scope) -> dict[str, str]:
    headers = {"content-type": "application/json"}
    rid = scope.get("state", {}).get("request_id")
    if rid:
        headers["x-request-id"] = rid
    return headers


async def _send_json(send: Send, status: int, body: bytes) -> None:
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode())],
    })
    await send({"type": "http.response.body", "body": body})
