"""The streamed answer: an upstream SSE stream relayed to the client, the proxy's hottest path.

Rules it keeps (with the proxy's):
- the response head is held back until the first upstream event, so a replica that fails before
  it can still be retried elsewhere;
- past the first byte there is no retry: a broken stream ends with one in-band error event;
- the chunk carrying [DONE] completes the response at once;
- TTFT, ITL, TPOT, E2E and token counts are observed once per stream, never per event.

Where the server offers a direct writer (the edge protocol), the events after the head go through
the fast lane of api/splice.py; otherwise each chunk is pulled and sent through ASGI.
"""

from __future__ import annotations

import asyncio

from starlette.types import Send

from gateway.api.accounting import count_usage, log_failure
from gateway.api.deps import ProxyDeps
from gateway.api.inflight import Exchange
from gateway.api.schemas import ParsedRequest
from gateway.api.splice import Splice
from gateway.api.sse import SseRelay
from gateway.errors import GatewayError, UpstreamFailed, sse_error_event
from gateway.flow.admission import Pool
from gateway.flow.tenants import Tenant
from gateway.routing.backend import Backend
from gateway.transport.base import UpstreamResponse

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


async def relay_stream(
    d: ProxyDeps, backend: Backend, req: ParsedRequest, resp: UpstreamResponse, send: Send,
    ex: Exchange, pool: Pool | None, tenant: Tenant | None, dispatched: float,
) -> None:
    """Relay one upstream SSE stream whose head said 200 (module docstring)."""
    started = ex.started
    loop = asyncio.get_running_loop()
    relay = SseRelay(strip_usage=not req.client_wants_usage)
    # Hold the head until the first real bytes: until then a failure may still be retried.
    first = b""
    while not first:
        chunk = await resp.readany()
        if not chunk:
            raise UpstreamFailed("replica closed the stream before its first event")
        first = relay.feed(chunk)
    d.router.report_success(backend)
    ttft = loop.time() - started
    if pool is not None and d.flow is not None:
        # The engine's own TTFT (dispatch -> first event): what the adaptive limit steers.
        pool.sample(d.flow.clock() - dispatched, dispatched)
    writer = ex.writer
    fast = writer is not None and not relay.saw_done and writer.can_start()
    if fast:
        # The fast lane (api/splice.py): the head and the first events leave in one write, the
        # rest from the upstream read callback. The head skips the middleware's `send`
        # wrapper, so the request id header is added here, as RequestIdMiddleware would.
        assert writer is not None
        headers = (SSE_HEADERS if ex.rid == "-"
                   else [*SSE_HEADERS, (b"x-request-id", ex.rid.encode("latin-1"))])
        blocked = not writer.start(200, headers, first)
    else:
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    ex.head_sent = True

    # The chunk that carries [DONE] ends the response (more_body=False) at once: a client
    # that hangs up right after [DONE] must count as served, not as a disconnect.
    complete = False
    status = "200"
    readany = resp.readany
    feed = relay.feed
    # ITL: one gap per event after the first, stamped when its chunk arrived; events that
    # arrive together get 0. Observed once at the end, never per event (observe_many).
    now = loop.time
    gaps: list[float] = [0.0] * (first.count(b"\n\n") - 1)
    last = started + ttft
    try:
        out = first
        if fast:
            assert writer is not None
            splice = Splice(relay, writer, gaps, last, now)
            while True:
                if blocked:
                    await writer.flow.drain()
                splice.blocked = False
                await resp.push(splice)
                if relay.saw_done:
                    out = splice.final
                    break
                if not splice.blocked:
                    raise UpstreamFailed("replica ended the stream without [DONE]")
                blocked = True
        while not relay.saw_done:
            await send({"type": "http.response.body", "body": out, "more_body": True})
            out = b""
            while not out:
                chunk = await readany()
                if not chunk:
                    raise UpstreamFailed("replica ended the stream without [DONE]")
                out = feed(chunk)
            t = now()
            gaps.append(t - last)
            last = t
            extra = out.count(b"\n\n") - 1  # a C scan of a short chunk
            if extra > 0:
                gaps += [0.0] * extra
        await send({"type": "http.response.body", "body": out + relay.flush(),
                    "more_body": False})
        complete = ex.responded = True
    except GatewayError as exc:
        resp.close()
        # Past the first byte there is no retry: end the stream with one in-band error event.
        d.router.report_failure(backend)
        log_failure(ex, exc)
        status = str(exc.status)
        await send({"type": "http.response.body", "body": sse_error_event(exc),
                    "more_body": False})
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
        series.ttft.observe(ttft)
        series.e2e.observe(e2e)
        if relay.saw_done:
            # vllm bench serve counts no gap for [DONE] nor the usage-only event: both come
            # last, so they are the last entries.
            del gaps[max(0, len(gaps) - (2 if req.client_wants_usage else 1)):]
        series.itl.observe_many(gaps)
        if relay.completion_tokens > 1:
            series.tpot.observe((e2e - ttft) / (relay.completion_tokens - 1))
        series.request(backend.url, status)
        if relay.usage_known:
            count_usage(m, req.model, tenant, (relay.prompt_tokens, relay.completion_tokens))
        elif complete:  # a cut stream may just not have reached its usage yet
            series.usage_invalid.inc()
    if not complete:
        return  # ended in-band above; the upstream connection is closed
    # Read the chunked-encoding terminator so the connection goes back to the pool.
    try:
        while await readany():
            pass
    except GatewayError:
        resp.close()  # the answer is whole; only the connection is lost
        return
    resp.release()
