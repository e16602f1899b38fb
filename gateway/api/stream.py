"""The streamed answer: an upstream SSE stream relayed to the client, the proxy's hottest path.

Rules it keeps (with the proxy's):
- the response head is held back until the first upstream event, so a replica that fails before
  it can still be retried elsewhere;
- past the first byte a broken stream is resumed on another replica where it can be
  (api/resume.py), else it ends with one in-band error event;
- the chunk carrying [DONE] completes the response at once;
- TTFT, ITL, TPOT, E2E and token counts are observed once per stream, never per event.

Every event goes through api/splice.py's `Splice`, from the upstream read callback.
"""

from __future__ import annotations

import asyncio

from starlette.types import Send

from gateway.api.accounting import count_usage, log_failure
from gateway.api.deps import ProxyDeps
from gateway.api.endpoints import Endpoint
from gateway.api.inflight import Exchange
from gateway.api.resume import EngineErrorEvent, ResumePlan, resume
from gateway.api.resume_splice import ResumeSplice
from gateway.api.schemas import ParsedRequest
from gateway.api.splice import Splice
from gateway.errors import GatewayError, UpstreamFailed, sse_error_event
from gateway.flow.admission import Pool
from gateway.flow.tenants import Tenant
from gateway.routing.backend import Backend
from gateway.transport import UpstreamResponse

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
# With a direct writer the splice writes chunk frames itself: the head says so, and the server
# frames its own writes (the first events, the last) the same way.
CHUNKED_SSE_HEADERS = [*SSE_HEADERS, (b"transfer-encoding", b"chunked")]


async def relay_stream(
    d: ProxyDeps, backend: Backend, req: ParsedRequest, resp: UpstreamResponse, send: Send,
    ex: Exchange, pool: Pool | None, tenant: Tenant | None, dispatched: float,
    endpoint: Endpoint, head: list[tuple[bytes, bytes]] | None = None,
    plan: ResumePlan | None = None,
) -> None:
    """Relay one upstream SSE stream whose head said 200 (module docstring). `head`: the
    engine's own response headers, relayed (the completions answer with the gateway's SSE head).
    A completion stream ends with [DONE]; another endpoint's (Responses, Messages) where its body
    ends. `plan`: how to resume it if it breaks (None: resuming is off)."""
    started = ex.started
    loop = asyncio.get_running_loop()
    completion = endpoint.kind != "other"
    splice = (Splice(started, strip_usage=not req.client_wants_usage, lenient_usage=not completion)
              if plan is None or plan.why_not is not None else
              ResumeSplice(started, not req.client_wants_usage, strip_ids=not plan.client_ids))
    feed = splice.feed
    # Hold the head until the first event: until then a failure may still be retried.
    await resp.push(feed)
    if not (splice.held or splice.final):
        raise UpstreamFailed("replica closed the stream before its first event")
    d.router.report_success(backend)
    if endpoint.pinnable:
        await d.answered(endpoint, req, backend.url, splice.held or splice.final)
    if pool is not None and d.flow is not None:
        # The engine's own TTFT (dispatch -> first event): what the adaptive limit steers.
        pool.sample(d.flow.clock() - dispatched, dispatched)
    writer = ex.writer
    if head is None:
        headers = SSE_HEADERS if writer is None else CHUNKED_SSE_HEADERS
    else:
        headers = head if writer is None else [*head, (b"transfer-encoding", b"chunked")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    ex.head_sent = True
    if writer is not None:
        splice.write_directly(writer)

    # The chunk that carries [DONE] ends the response (more_body=False) at once: a client
    # that hangs up right after [DONE] must count as served, not as a disconnect.
    complete = resumed = False
    status = "200"
    try:
        while not splice.saw_done:
            if splice.held:  # the first events, or any when the server offers no writer
                out, splice.held = splice.held, b""
                await send({"type": "http.response.body", "body": out, "more_body": True})
            elif splice.blocked:
                assert writer is not None
                splice.blocked = False
                await writer.drain()
            await resp.push(feed)
            if not (splice.held or splice.blocked or splice.saw_done):
                if not completion:
                    break  # the body ended: such a stream is whole without [DONE]
                raise UpstreamFailed("replica ended the stream without [DONE]")
        await send({"type": "http.response.body", "body": splice.final + splice.flush(),
                    "more_body": False})
        complete = ex.responded = True
    except GatewayError as exc:
        resp.close()
        d.router.report_failure(backend)
        left: GatewayError | None = exc
        if isinstance(splice, ResumeSplice) and splice.tail:
            left = EngineErrorEvent(splice.tail)
        if plan is not None:
            assert left is not None
            try:
                left = await resume(d, plan, splice if isinstance(splice, ResumeSplice) else None,
                                    backend, left, send, ex)
            except BaseException:  # as below: the drain's timeout, or the client hung up
                status = "503" if ex.expired else "499"
                raise
        if left is None:  # resumed elsewhere: the client has its whole answer
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            complete = resumed = ex.responded = True
        else:
            # End the stream with one in-band error event (the engine's own, if it sent one).
            # Terminal events deferred for the fingerprint are the client's tokens: sent first.
            log_failure(d.failures, ex, left)
            status = str(left.status)
            await send({"type": "http.response.body", "more_body": False,
                        "body": splice.take_deferred() + (
                            left.tail if isinstance(left, EngineErrorEvent)
                            else sse_error_event(left))})
    except BaseException:
        # The drain's timeout, or the client closed the request (disconnect cancels this task).
        status = "503" if ex.expired else "499"
        raise
    finally:
        # Observed when the client has its last byte, before the upstream's terminator is read
        # below: E2E ends there, and a client that scrapes /metrics right after [DONE] sees its
        # request counted (the terminator may come in a later read).
        m = d.metrics
        series = m.series(req.model)
        e2e = loop.time() - started
        ttft = splice.gaps[0]
        counts = splice.usage.counts
        if endpoint.generative:
            series.ttft.observe(ttft)
            series.e2e.observe(e2e)
        if completion:
            # ITL: the gaps after the first event's. vllm bench serve counts no gap for [DONE]
            # nor the usage-only event: both come last, so they are the last entries. (Other
            # streams send several events per token: their gaps are not token gaps.)
            itl = splice.gaps[1:]
            if splice.saw_done:
                del itl[max(0, len(itl) - (2 if req.client_wants_usage else 1)):]
            series.itl.observe_many(itl)
            if counts is not None and counts[1] > 1:
                series.tpot.observe((e2e - ttft) / (counts[1] - 1))
        series.request(endpoint.label, backend.url, status)
        if counts is not None:
            count_usage(m, req.model, tenant, counts)
        elif complete and endpoint.usage:  # a cut stream may not have reached its usage yet
            series.usage_invalid.inc()
        elif tenant is not None:
            # Cut before its usage (the client hung up, the replica broke): the key is charged
            # one token per event it was sent, else a client that hangs up just before the end
            # would stream for free past its tokens-per-minute limit.
            tenant.used(0, len(splice.gaps))
    if not complete or resumed:
        return  # ended in-band above, or resumed; the upstream connection is closed
    # Read the chunked-encoding terminator so the connection goes back to the pool.
    try:
        while await resp.readany():
            pass
    except GatewayError:
        resp.close()  # the answer is whole; only the connection is lost
        return
    resp.release()
