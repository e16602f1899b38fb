"""The batcher's side of the proxy (gateway/flow/batcher.py is the batcher itself): which
requests it takes, the upstream call it sends batches with, and each member's answer. With
`batch.enabled` off (the default) none of this runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.types import Send

from gateway.api.accounting import count_usage, log_failure
from gateway.api.deps import ProxyDeps
from gateway.api.endpoints import COMPLETIONS
from gateway.api.inflight import Exchange
from gateway.api.replicas import check_answer, try_replicas
from gateway.api.schemas import ParsedRequest
from gateway.errors import GatewayError, send_body, send_error, upstream_error_body
from gateway.flow.batcher import Batcher, UpstreamCall, batch_key
from gateway.flow.tenants import Tenant
from gateway.routing.backend import Backend
from gateway.settings import BatchSettings


def build_batcher(settings: BatchSettings, d: ProxyDeps,
                  queued: Callable[[str], int]) -> Batcher | None:
    """The batcher of /v1/completions when `batch.enabled`; `queued` tells a model's admission
    queue, which widens the window."""
    if not settings.enabled:
        return None
    return Batcher(settings, d.metrics, _upstream_call(d, COMPLETIONS.path), queued=queued)


def batchable(d: ProxyDeps, req: ParsedRequest) -> bytes | None:
    """The batch key of a whole /v1/completions request the batcher takes, else None. Made-up
    model names skip it: its metrics and queues are per model."""
    if d.batcher is None or req.stream or not d.router.knows_model(req.model):
        return None
    return batch_key(req.body)


async def answer_batched(
    d: ProxyDeps, req: ParsedRequest, key: bytes, send: Send, ex: Exchange,
    tenant: Tenant | None,
) -> None:
    """Answer a completion through the batcher, which sends it upstream with others like it."""
    assert d.batcher is not None
    try:
        result = await d.batcher.submit(req.model, req.body, key)
    except GatewayError as exc:
        d.metrics.requests.labels(req.model, COMPLETIONS.label, "", str(exc.status)).inc()
        log_failure(d.failures, ex, exc)
        await send_error(send, exc)
        return
    body = result.body
    if result.status != 200:
        body = upstream_error_body(result.status, body, d.upstream_bodies, ex.rid) or body
    await send_body(send, result.status, body)
    m = d.metrics
    # Once per client request, not per upstream call: a batch of N answers N requests.
    m.requests.labels(req.model, COMPLETIONS.label, result.backend, str(result.status)).inc()
    if result.status == 200:
        m.e2e.labels(req.model).observe(asyncio.get_running_loop().time() - ex.started)
        count_usage(m, req.model, tenant, result.usage)


def _upstream_call(d: ProxyDeps, path: str) -> UpstreamCall:
    """A whole-body POST with the proxy's replica choice and retries, for the batcher: nothing
    reaches a client here, so every failure may be retried on another replica."""
    headers = {"content-type": "application/json"}

    async def call(model: str, body: bytes) -> tuple[int, bytes, str]:
        async def attempt(backend: Backend) -> tuple[int, bytes, str]:
            resp = await d.transport.post(backend.url + path, body, headers, streaming=False)
            raw = await resp.read()
            check_answer(d, backend, resp.status, raw)
            d.router.report_success(backend)
            return resp.status, raw, backend.url

        return await try_replicas(d, model, path, [], attempt)

    return call
