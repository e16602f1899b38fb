"""Whole (non-streamed) answers from a replica (the batcher's: api/batched.py): E2E is observed,
not TTFT."""

from __future__ import annotations

import asyncio

from starlette.types import Send

from gateway.api.accounting import count_usage
from gateway.api.deps import ProxyDeps
from gateway.api.endpoints import Endpoint
from gateway.api.schemas import ParsedRequest
from gateway.errors import send_body
from gateway.flow.admission import Pool
from gateway.flow.tenants import Tenant
from gateway.routing.backend import Backend
from gateway.transport import UpstreamResponse
from gateway.usage import body_usage


async def relay_whole(
    d: ProxyDeps, backend: Backend, req: ParsedRequest, resp: UpstreamResponse, send: Send,
    started: float, tenant: Tenant | None, pool: Pool | None, dispatched: float,
    endpoint: Endpoint, head: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """Relay a replica's whole 200 answer (with the engine's own headers, `head`, when given),
    and count its tokens."""
    body = await resp.read()
    done = d.flow.clock() if pool is not None and d.flow is not None else 0.0
    d.router.report_success(backend)
    if endpoint.pinnable:
        await d.answered(endpoint, req, backend.url, body)
    if head is None:
        await send_body(send, 200, body)
    else:
        await send_body(send, 200, body, head)
    m = d.metrics
    series = m.series(req.model)
    if endpoint.generative:
        series.e2e.observe(asyncio.get_running_loop().time() - started)
    series.request(endpoint.label, backend.url, "200")
    if not endpoint.usage:
        return
    counts = body_usage(body, lenient=endpoint.kind == "other")
    count_usage(m, req.model, tenant, counts)
    if pool is not None and counts is not None:
        # The other request class: the whole latency, judged per generated token.
        pool.sample_whole(done - dispatched, counts[1], dispatched)


