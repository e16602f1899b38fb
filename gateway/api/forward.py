"""One admitted request on its way to a replica: through the batcher, or to replicas in turn,
retried elsewhere only while nothing has reached the client (the relay holds the head back).

The completions have their own relay (usage asked for and stripped again, batching); every other
engine endpoint (api/endpoints.py) is relayed as the engine answers it: its status, its body, its
content type, a stream event by event through the same streamed relay.
"""

from __future__ import annotations

from collections.abc import Awaitable

import orjson
from starlette.types import Scope, Send

from gateway.api.accounting import log_failure
from gateway.api.batched import answer_batched, batchable
from gateway.api.deps import ProxyDeps
from gateway.api.endpoints import Endpoint
from gateway.api.inflight import Exchange
from gateway.api.replicas import any_model, check_answer, pinned, route_request, try_replicas
from gateway.api.resume import ResumePlan
from gateway.api.schemas import ParsedRequest
from gateway.api.stream import relay_stream
from gateway.api.whole import relay_whole
from gateway.errors import JSON_HEADERS, GatewayError, send_body, send_error, upstream_error_body
from gateway.flow.admission import Pool
from gateway.flow.tenants import Tenant
from gateway.routing.backend import Backend

# Response headers that describe one hop's connection or framing, not the answer: never relayed.
HOP_HEADERS = frozenset((b"connection", b"keep-alive", b"transfer-encoding", b"content-length",
                         b"date", b"server", b"proxy-connection", b"trailer", b"upgrade"))


def relayed_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """An engine answer's headers as the client gets them (the framing is the gateway's own)."""
    return [(k, v) for k, v in headers if k not in HOP_HEADERS]


def ask_usage(req: ParsedRequest) -> bytes:
    """The body of a stream whose client did not ask for usage, asking for it on our own account
    (token metrics, per-key limits); the relay strips it again. Only the final usage: running
    usage (vLLM's continuous_usage_stats, sent only with include_usage) would ride on every chunk
    the client reads."""
    so = req.body.get("stream_options") or {}  # an object or absent (api/schemas.py)
    req.body["stream_options"] = {
        **{k: v for k, v in so.items() if k != "continuous_usage_stats"}, "include_usage": True}
    return orjson.dumps(req.body)


class Forwarder:
    """Forwards requests of one endpoint to the replicas."""

    def __init__(self, deps: ProxyDeps, endpoint: Endpoint) -> None:
        self._d = deps
        self._endpoint = endpoint
        self._path = endpoint.path
        self._kind = endpoint.kind
        self._label = endpoint.label
        self._session_header = deps.settings.affinity.session_header.lower().encode("latin-1")

    async def forward(
        self, scope: Scope, req: ParsedRequest, raw: bytes, send: Send, ex: Exchange,
        pool: Pool | None, tenant: Tenant | None, pin: str | None = None,
    ) -> None:
        """`pin`: the backend URL the endpoint's pin hook chose (ProxyDeps.pin, asked by the
        proxy before admission), or None."""
        d = self._d
        if self._kind == "other":
            await self._forward_other(scope, req, raw, send, ex, pool, tenant, pin)
            return
        model = req.model
        plan = None
        if req.stream and req.readable and d.settings.stream_resumes:
            # Taken before the body changes below: the client's own request.
            plan = ResumePlan(req)
        if req.stream and not req.client_wants_usage:
            raw = ask_usage(req)
        if plan is not None and plan.why_not is None and not plan.client_ids:
            # The ids a resume starts from (api/resume.py); the relay hides them again.
            req.body["return_token_ids"] = True
            raw = orjson.dumps(req.body)
        headers = {"content-type": "application/json"}
        rid = scope.get("state", {}).get("request_id")
        if rid:
            headers["x-request-id"] = rid
        key = batchable(d, req) if self._kind == "completion" else None
        if key is not None:
            await answer_batched(d, req, key, send, ex, tenant)
            return

        route = (route_request(req, scope, self._session_header, self._endpoint.prompt)
                 if d.router.wants_affinity(model) else None)
        if plan is not None:
            plan.route = route
        tried: list[Backend] = []
        try:
            await try_replicas(d, model, self._label, tried, lambda backend: self._attempt(
                backend, req, raw, headers, send, ex, pool, tenant, plan), route)
        except GatewayError as exc:
            self._failed(req, exc, tried, ex)
            await send_error(send, exc)

    def _failed(self, req: ParsedRequest, exc: GatewayError, tried: list[Backend],
                ex: Exchange) -> None:
        # Counted once, by the final status: at the last replica tried, or, with none to try,
        # with a made-up model name as "unknown".
        d = self._d
        if tried:
            log_failure(d.failures, ex, exc)
            d.metrics.requests.labels(req.model, self._label, tried[-1].url,
                                      str(exc.status)).inc()
        else:
            label = req.model if d.router.knows_model(req.model) else "unknown"
            d.metrics.requests.labels(label, self._label, "", str(exc.status)).inc()

    async def _forward_other(
        self, scope: Scope, req: ParsedRequest, raw: bytes, send: Send, ex: Exchange,
        pool: Pool | None, tenant: Tenant | None, pin: str | None,
    ) -> None:
        """Any other engine endpoint: the request as the client sent it (method, path, query,
        body, content type), the answer as the engine gave it."""
        d = self._d
        headers: dict[str, str] = {}
        for k, v in scope["headers"]:
            if k == b"content-type":
                headers["content-type"] = v.decode("latin-1")
                break
        rid = scope.get("state", {}).get("request_id")
        if rid:
            headers["x-request-id"] = rid
        # The path as the client sent it (a response id in it), with its query string.
        path = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string")
        target = (path + b"?" + query if query else path).decode("latin-1")
        method = scope["method"]
        tried: list[Backend] = []

        def attempt(backend: Backend) -> Awaitable[None]:
            return self._attempt_other(backend, method, target, req, raw, headers, send, ex,
                                       pool, tenant)

        try:
            if pin is not None:
                backend = pinned(d, pin)
                if not req.model and backend.models:
                    req.model = min(backend.models)  # its metrics' model label
                tried.append(backend)
                backend.outstanding += 1
                try:
                    await attempt(backend)
                finally:
                    backend.outstanding -= 1
                return
            if not req.model:
                req.model = any_model(d)
            route = (route_request(req, scope, self._session_header, self._endpoint.prompt)
                     if self._endpoint.prompt and d.router.wants_affinity(req.model) else None)
            await try_replicas(d, req.model, self._label, tried, attempt, route)
        except GatewayError as exc:
            self._failed(req, exc, tried, ex)
            await send_error(send, exc)

    async def _attempt_other(
        self, backend: Backend, method: str, target: str, req: ParsedRequest, raw: bytes,
        headers: dict[str, str], send: Send, ex: Exchange, pool: Pool | None,
        tenant: Tenant | None,
    ) -> None:
        """One try of another endpoint on one replica (as `_attempt`)."""
        d = self._d
        dispatched = d.flow.clock() if pool is not None and d.flow is not None else 0.0
        resp = await d.transport.request(method, backend.url + target, raw, headers,
                                         streaming=req.stream)
        try:
            out_headers = relayed_headers(resp.headers)
            if resp.status != 200:
                body = await resp.read()
                check_answer(d, backend, resp.status, body)
                d.router.report_success(backend)
                own = upstream_error_body(resp.status, body, d.upstream_bodies, ex.rid)
                if own is None:
                    await send_body(send, resp.status, body, out_headers)
                else:
                    await send_body(send, resp.status, own)
                d.metrics.requests.labels(req.model, self._label, backend.url,
                                          str(resp.status)).inc()
                return
            if any(k == b"content-type" and v.startswith(b"text/event-stream")
                   for k, v in out_headers):
                await relay_stream(d, backend, req, resp, send, ex, pool, tenant, dispatched,
                                   self._endpoint, out_headers)
            else:
                await relay_whole(d, backend, req, resp, send, ex.started, tenant, pool,
                                  dispatched, self._endpoint, out_headers)
        except BaseException:
            resp.close()
            raise

    async def _attempt(
        self, backend: Backend, req: ParsedRequest, raw: bytes, headers: dict[str, str],
        send: Send, ex: Exchange, pool: Pool | None, tenant: Tenant | None,
        plan: ResumePlan | None,
    ) -> None:
        """One try on one replica: it answers the client, or raises GatewayError while the client
        has seen nothing (the caller may then retry elsewhere)."""
        d = self._d
        dispatched = d.flow.clock() if pool is not None and d.flow is not None else 0.0
        resp = await d.transport.post(backend.url + self._path, raw, headers, streaming=req.stream)
        try:
            if resp.status != 200:
                body = await resp.read()
                check_answer(d, backend, resp.status, body)
                d.router.report_success(backend)
                # The engine's error object as it wrote it (vLLM's JSON: the head the completions'
                # transport does not collect would say so).
                own = upstream_error_body(resp.status, body, d.upstream_bodies, ex.rid)
                await send_body(send, resp.status, body if own is None else own, JSON_HEADERS)
                d.metrics.requests.labels(req.model, self._label, backend.url,
                                          str(resp.status)).inc()
                return
            if req.stream:
                await relay_stream(d, backend, req, resp, send, ex, pool, tenant, dispatched,
                                   self._endpoint, plan=plan)
            else:
                await relay_whole(d, backend, req, resp, send, ex.started, tenant, pool,
                                  dispatched, self._endpoint)
        except BaseException:
            resp.close()
            raise
