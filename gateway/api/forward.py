"""One admitted request on its way to a replica: through the batcher, or to replicas in turn,
retried elsewhere only while nothing has reached the client (the relay holds the head back).
"""

from __future__ import annotations

import orjson
from starlette.types import Scope, Send

from gateway.api.accounting import log_failure
from gateway.api.deps import ProxyDeps
from gateway.api.inflight import Exchange
from gateway.api.replicas import check_answer, route_request, try_replicas
from gateway.api.schemas import Kind, ParsedRequest
from gateway.api.stream import relay_stream
from gateway.api.whole import answer_batched, relay_whole
from gateway.errors import GatewayError, normalize_upstream_error, send_body, send_error
from gateway.flow.admission import Pool
from gateway.flow.batcher import batch_key
from gateway.flow.tenants import Tenant
from gateway.routing.backend import Backend


def ask_usage(req: ParsedRequest) -> bytes:
    """The body of a stream whose client did not ask for usage, asking for it on our own account
    (token metrics, per-key limits); the relay strips it again. Only the final usage: running
    usage (vLLM's continuous_usage_stats, sent only with include_usage) would ride on every chunk
    the client reads."""
    so = req.body.get("stream_options") or {}
    req.body["stream_options"] = {
        **{k: v for k, v in so.items() if k != "continuous_usage_stats"}, "include_usage": True}
    return orjson.dumps(req.body)


class Forwarder:
    """Forwards requests of one endpoint (`path`, `kind`) to the replicas."""

    def __init__(self, deps: ProxyDeps, path: str, kind: Kind) -> None:
        self._d = deps
        self._path = path
        self._kind = kind
        self._session_header = deps.settings.affinity.session_header.lower().encode("latin-1")

    async def forward(
        self, scope: Scope, req: ParsedRequest, raw: bytes, send: Send, ex: Exchange,
        pool: Pool | None, tenant: Tenant | None,
    ) -> None:
        d = self._d
        model = req.model
        if req.stream and not req.client_wants_usage:
            raw = ask_usage(req)
        headers = {"content-type": "application/json"}
        rid = scope.get("state", {}).get("request_id")
        if rid:
            headers["x-request-id"] = rid
        # Made-up model names skip the batcher, whose metrics and queues are per model.
        if (d.batcher is not None and self._kind == "completion" and not req.stream
                and d.router.knows_model(model)):
            key = batch_key(req.body)
            if key is not None:
                await answer_batched(d, d.batcher, req, key, send, ex, tenant)
                return

        route = (route_request(req, scope, self._session_header)
                 if d.router.wants_affinity(model) else None)
        tried: list[Backend] = []
        try:
            await try_replicas(d, model, tried, lambda backend: self._attempt(
                backend, req, raw, headers, send, ex, pool, tenant), route)
        except GatewayError as exc:
            # Counted once, by the final status: at the last replica tried, or, with none to try,
            # with a made-up model name as "unknown".
            if tried:
                log_failure(d.failures, ex, exc)
                d.metrics.requests.labels(model, tried[-1].url, str(exc.status)).inc()
            else:
                label = model if d.router.knows_model(model) else "unknown"
                d.metrics.requests.labels(label, "", str(exc.status)).inc()
            await send_error(send, exc)

    async def _attempt(
        self, backend: Backend, req: ParsedRequest, raw: bytes, headers: dict[str, str],
        send: Send, ex: Exchange, pool: Pool | None, tenant: Tenant | None,
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
                await send_body(send, resp.status, normalize_upstream_error(
                    resp.status, body, d.upstream_bodies, ex.rid))
                d.metrics.requests.labels(req.model, backend.url, str(resp.status)).inc()
                return
            if req.stream:
                await relay_stream(d, backend, req, resp, send, ex, pool, tenant, dispatched)
            else:
                await relay_whole(d, backend, req, resp, send, ex.started, tenant, pool,
                                  dispatched)
        except BaseException:
            resp.close()
            raise
