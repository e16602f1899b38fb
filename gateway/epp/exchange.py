"""One ext_proc stream: one HTTP request that Envoy holds, from its headers to its answer's end.

With request bodies in FULL_DUPLEX_STREAMED mode Envoy sends the headers, then the body in
chunks, without waiting for answers. The EPP keeps the chunks until the body's end (the pick needs
the whole prompt: model, stream flag, prefix), then answers the headers (the destination, see
protocol.py) and hands the body back in chunks Envoy accepts. A request without a body (a GET) is
picked at its headers. A refusal is an immediate response instead, and the stream ends.

The answer's headers and body chunks are answered at once (answer.py watches them on the way).
However the stream ends (the answer's end, Envoy's cancel when the client hangs up, an error),
the slot and the backend's count are given back once.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

from gateway.api.deps import ProxyDeps
from gateway.epp import protocol
from gateway.epp.answer import Answer
from gateway.epp.picker import Pick, Picker, Refused, host_port
from gateway.errors import GatewayError, PayloadTooLarge
from gateway.settings import EppSettings

log = logging.getLogger("gateway.epp")

# Headers the EPP takes out before forwarding: a client must not steer Envoy's routing or claim
# what the data plane reports (the destination itself is overwritten in protocol.route_to).
_STRIPPED = (protocol.SERVED, protocol.SUBSET)


class Exchange:
    def __init__(self, deps: ProxyDeps, picker: Picker, settings: EppSettings,
                 clock: Callable[[], float]) -> None:
        self._d = deps
        self._picker = picker
        self._chunk = settings.chunk_bytes
        self._clock = clock
        self._path = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._subset: frozenset[str] | None = None
        self._body: list[bytes] = []
        self._size = 0
        self._started = 0.0
        self._pick: Pick | None = None
        self._answer: Answer | None = None

    async def run(self, requests: AsyncIterator[protocol.Message]
                  ) -> AsyncIterator[protocol.Message]:
        """The stream's answers, one or more per message Envoy sends."""
        try:
            async for message in requests:
                kind = message.WhichOneof("request")
                if kind == "request_headers":
                    self._started = self._clock()
                    self._headers = protocol.headers_of(message.request_headers)
                    self._path = protocol.header(self._headers, b":path") or b""
                    self._subset = protocol.subset_hint(message)
                    if message.request_headers.end_of_stream:
                        out = await self._decide(b"", has_body=False)
                        for answer in out:
                            yield answer
                        if self._pick is None:
                            return
                elif kind == "request_body":
                    part = message.request_body
                    self._size += len(part.body)
                    if self._size <= self._d.settings.max_body_bytes:
                        self._body.append(part.body)
                    if part.end_of_stream:
                        out = await self._decide(b"".join(self._body), has_body=True)
                        self._body = []
                        for answer in out:
                            yield answer
                        if self._pick is None:
                            return
                elif kind == "response_headers":
                    yield self._answer_headers(message)
                elif kind == "response_body":
                    part = message.response_body
                    out_body = part.body
                    if self._answer is not None:
                        out_body = self._answer.feed(part.body, part.end_of_stream)
                        await self._answer.tell_home(part.end_of_stream)
                    for answer in protocol.body_chunks(out_body, part.end_of_stream, self._chunk,
                                                       response=True):
                        yield answer
                elif kind == "request_trailers":
                    yield protocol.trailers(response=False)
                elif kind == "response_trailers":
                    if self._answer is not None:
                        self._answer.finish(complete=True)
                    yield protocol.trailers(response=True)
        finally:
            self._close()

    async def _decide(self, body: bytes, has_body: bool) -> list[protocol.Message]:
        """Pick (or refuse) once the whole request is here: the answers to send now."""
        try:
            if self._size > self._d.settings.max_body_bytes:
                raise Refused(PayloadTooLarge(
                    f"request body exceeds {self._d.settings.max_body_bytes} bytes"))
            pick = await self._picker.pick(self._path, self._headers, body, self._subset)
        except Refused as exc:
            return [protocol.immediate(exc.error, exc.headers)]
        except GatewayError as exc:  # a bug's error shape, not a refusal by design
            log.exception("pick failed")
            return [protocol.immediate(exc)]
        self._pick = pick
        endpoint = host_port(pick.backend)
        extra: list[tuple[str, bytes]] = []
        if pick.changed:
            extra.append(("content-length", b"%d" % len(pick.body)))
        out = [protocol.route_to(endpoint, extra, remove=_STRIPPED)]
        if has_body:
            out.extend(protocol.body_chunks(pick.body, True, self._chunk, response=False))
        return out

    def _answer_headers(self, message: protocol.Message) -> protocol.Message:
        headers = protocol.headers_of(message.response_headers)
        status = int(protocol.header(headers, b":status") or b"0")
        pick = self._pick
        if pick is not None:
            served = protocol.served_endpoint(message)
            if served is not None and served != host_port(pick.backend):
                # The data plane went elsewhere (its retry down a list, a fallback): the answer
                # is that endpoint's, for passive health and the count in flight.
                other = next((b for b in self._d.router.backends() if host_port(b) == served),
                             None)
                if other is not None:
                    pick.backend.outstanding -= 1
                    other.outstanding += 1
                    pick.backend = other
            events = (protocol.header(headers, b"content-type") or b"").startswith(
                b"text/event-stream")
            self._answer = Answer(self._d, pick, self._started, status, self._clock, events)
            if message.response_headers.end_of_stream:
                self._answer.finish(complete=True)
        return protocol.continue_response_headers()

    def _close(self) -> None:
        if self._answer is not None:
            self._answer.finish(complete=False)  # a no-op when it finished already
        elif self._pick is not None:
            self._pick.release()  # picked, but no answer came back (upstream unreachable...)
        self._pick = None
        self._answer = None
