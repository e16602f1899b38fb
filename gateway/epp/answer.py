"""The upstream's answer as the EPP sees it pass (FULL_DUPLEX_STREAMED response bodies): every
chunk goes back to Envoy at once, and on its way the EPP learns what the proxy learns when it
relays: the first token (a TTFT sample for the pool's adaptive limit), the usage (token metrics
and the key's tokens-per-minute), the status (passive health), the end (the slot is released),
and, for a stored Responses API answer, its id (the pin hook learns which replica holds it).

Streams go through the proxy's own splice (gateway/api/splice.py): same event framing, same
usage handling, and the usage event the EPP asked for on the client's behalf is stripped again.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.api.accounting import count_usage
from gateway.api.deps import ProxyDeps
from gateway.api.replicas import check_answer
from gateway.api.splice import Splice
from gateway.epp.picker import Pick
from gateway.errors import GatewayError
from gateway.usage import body_usage

# A whole answer is kept (for its usage, or an error's code) up to this size.
_KEEP_BYTES = 4 * 1024 * 1024


class Answer:
    """One request's answer, from its response headers to its end (`finish`)."""

    def __init__(self, d: ProxyDeps, pick: Pick, started: float, status: int,
                 clock: Callable[[], float], events: bool = False) -> None:
        self._d = d
        self._pick = pick
        self._started = started
        self._clock = clock
        self.status = status
        self._splice = (Splice(pick.dispatched, pick.strip_usage)
                        if pick.stream and status == 200 else None)
        self._kept: list[bytes] = []
        self._kept_bytes = 0
        self._done = False
        # A pinnable endpoint's 200 answer (`events`: an SSE stream) whose first bytes the pin
        # hook has not been told yet.
        self._untold = pick.pinnable is not None and status == 200
        self._events = events

    def feed(self, chunk: bytes, end: bool) -> bytes:
        """One body chunk from upstream; returns what goes on to the client now."""
        splice = self._splice
        if splice is None:
            if self._kept_bytes < _KEEP_BYTES:
                self._kept.append(chunk)
                self._kept_bytes += len(chunk)
            out = chunk
        else:
            first = not splice.gaps
            if chunk:
                splice.feed(chunk, self._clock())
            out = splice.held + splice.final
            splice.held = splice.final = b""
            if end:
                out += splice.flush()
            if first and splice.gaps:
                self._first_token()
        if end:
            self.finish(complete=True)
        return out

    async def tell_home(self, end: bool) -> None:
        """After each chunk: once the answer's first bytes are here (a stream's first event, a
        whole body at its end), the pin hook (the proxy's `answered`, api/responses.py) learns
        which replica made it, before Envoy passes on the bytes that carry its id."""
        if not self._untold:
            return
        first = b"".join(self._kept)
        if not end and not (self._events and b"\n\n" in first.replace(b"\r\n", b"\n")):
            return
        self._untold = False
        pick = self._pick
        assert pick.pinnable is not None and pick.request is not None
        await self._d.answered(pick.pinnable, pick.request, pick.backend.url, first)

    def _first_token(self) -> None:
        pick = self._pick
        assert self._splice is not None
        ttft = self._splice.gaps[0]
        if pick.pool is not None:
            # The engine's own TTFT (dispatch -> first event): what the adaptive limit steers.
            pick.pool.sample(ttft, pick.dispatched)
        if pick.model:
            self._d.metrics.series(pick.model).ttft.observe(self._clock() - self._started)

    def finish(self, complete: bool) -> None:
        """The answer is over (`complete`: its end came through; else the stream was cut): book
        it once, and release the slot. A stream whose `[DONE]` came through is whole, however the
        exchange ends: a client that read it closes its connection, and Envoy may then cancel the
        ext_proc stream before the upstream's own end reaches it."""
        if self._done:
            return
        self._done = True
        complete = complete or (self._splice is not None and self._splice.saw_done)
        d = self._d
        pick = self._pick
        try:
            self._book(complete)
        finally:
            pick.release()
        if pick.model:  # a made-up or absent name must not create series
            series = d.metrics.series(pick.model)
            series.e2e.observe(self._clock() - self._started)
            series.request(pick.endpoint, pick.backend.url, str(self.status) if complete else "499")

    def _book(self, complete: bool) -> None:
        d = self._d
        pick = self._pick
        status = self.status
        if status != 200:
            try:
                check_answer(d, pick.backend, status, b"".join(self._kept))
                d.router.report_success(pick.backend)  # a 4xx is the caller's
            except GatewayError:
                d.router.report_failure(pick.backend)
            return
        d.router.report_success(pick.backend)
        splice = self._splice
        if splice is not None:
            counts = splice.usage.counts
            if counts is not None:
                count_usage(d.metrics, pick.model, pick.tenant, counts)
            elif not complete and pick.tenant is not None:
                # Cut before its usage: one token per event sent, as the proxy charges.
                pick.tenant.used(0, len(splice.gaps))
            return
        if not pick.model:
            return  # not a completion: nothing to count
        counts = body_usage(b"".join(self._kept)) if complete else None
        if counts is not None and pick.pool is not None:
            pick.pool.sample_whole(self._clock() - pick.dispatched, counts[1], pick.dispatched)
        if complete:
            count_usage(d.metrics, pick.model, pick.tenant, counts)
