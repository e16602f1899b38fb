"""Whole (non-streamed) answers, from a replica or from the batcher: E2E is observed, not TTFT."""

from __future__ import annotations

import asyncio

from starlette.types import Send

from gateway.api.accounting import count_usage, log_failure
from gateway.api.deps import ProxyDeps
from gateway.api.inflight import Exchange
from gateway.api.schemas import ParsedRequest
from gateway.errors import GatewayError, normalize_upstream_error, send_body, send_error
from gateway.flow.admission import Pool
from gateway.flow.batcher import Batcher
from gateway.flow.tenants import Tenant
from gateway.routing.backend import Backend
from gateway.transport.base import UpstreamResponse
from gateway.usage import body_usage


async def relay_whole(
    d: ProxyDeps, backend: Backend, req: ParsedRequest, resp: UpstreamResponse, send: Send,
    started: float, tenant: Tenant | None, pool: Pool | None, dispatched: float,
) -> None:
    """Relay a replica's whole 200 answer, and count its tokens."""
    body = await resp.read()
    done = d.flow.clock() if pool is not None and d.flow is not None else 0.0
    d.router.report_success(backend)
    await send_body(send, 200, body)
    m = d.metrics
    series = m.series(req.model)
    series.e2e.observe(asyncio.get_running_loop().time() - started)
    series.request(backend.url, "200")
    counts = body_usage(body)
    count_usage(m, req.model, tenant, counts)
    if pool is not None and counts is not None:
        # The other request class: the whole latency, judged per generated token.
        pool.sample_whole(done - dispatched, counts[1], dispatched)


async def answer_batched(
    d: ProxyDeps, batcher: Batcher, req: ParsedRequest, key: bytes, send: Send, ex: Exchange,
    tenant: Tenant | None,
) -> None:
    """Answer a completion through the batcher, which sends it upstream with others like it."""
    try:
        result = await batcher.submit(req.model, req.body, key)
    except GatewayError as exc:
        d.metrics.requests.labels(req.model, "", str(exc.status)).inc()
        log_failure(d.failures, ex, exc)
        await send_error(send, exc)
        return
    body = result.body
    if result.status != 200:
        body = normalize_upstream_error(result.status, body, d.upstream_bodies, ex.rid)
    await send_body(send, result.status, body)
    m = d.metrics
    # Once per client request, not per upstream call: a batch of N answers N requests.
    m.requests.labels(req.model, result.backend, str(result.status)).inc()
    if result.status == 200:
        m.e2e.labels(req.model).observe(asyncio.get_running_loop().time() - ex.started)
        count_usage(m, req.model, tenant, result.usage)
