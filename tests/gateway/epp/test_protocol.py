"""The endpoint picker protocol at the gRPC seam: messages as Envoy sends them, over a real gRPC
channel to the EPP, without Envoy (what Envoy here cannot send: the served-endpoint metadata)."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import grpc
import orjson
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict
from grpc_health.v1 import health_pb2

from gateway.__main__ import main
from gateway.epp import protocol
from gateway.errors import Unavailable
from tests.gateway.conftest import UpstreamFactory, url_of
from tests.gateway.epp.conftest import RunningEpp, host_port, run_epp
from tests.waiting import wait_for


def test_bodies_go_back_in_chunks_envoy_accepts() -> None:
    body = bytes(range(256)) * 1000
    out = list(protocol.body_chunks(body, True, 62_000, response=False))
    parts = [m.request_body.response.body_mutation.streamed_response for m in out]
    assert all(len(p.body) <= 62_000 for p in parts)
    assert b"".join(p.body for p in parts) == body
    assert [p.end_of_stream for p in parts] == [False] * (len(parts) - 1) + [True]
    (empty,) = protocol.body_chunks(b"", True, 62_000, response=True)
    assert empty.response_body.response.body_mutation.streamed_response.end_of_stream


def test_a_refusal_is_openai_error_json_with_retry_after() -> None:
    m = protocol.immediate(Unavailable("busy", code="overloaded", retry_after=2.2))
    r = m.immediate_response
    assert r.status.code == 503
    headers = {h.header.key: h.header.raw_value for h in r.headers.set_headers}
    assert headers["retry-after"] == b"3" and headers["content-type"] == b"application/json"
    assert orjson.loads(r.body)["error"] == {
        "message": "busy", "type": "server_error", "param": None, "code": "overloaded"}


def _headers(*pairs: tuple[str, str], eos: bool = False) -> Any:
    return pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs]), end_of_stream=eos)


def _metadata(namespace: str, values: dict[str, Any]) -> Any:
    s = struct_pb2.Struct()
    s.update(values)
    return base_pb2.Metadata(filter_metadata={namespace: s})


class Stream:
    """One ext_proc stream to the EPP, driven message by message as Envoy would."""

    def __init__(self, epp: RunningEpp) -> None:
        self._channel = grpc.insecure_channel(f"127.0.0.1:{epp.port}")
        self._out: queue.Queue[Any] = queue.Queue()
        self._answers = pb_grpc.ExternalProcessorStub(self._channel).Process(self._requests())

    def _requests(self) -> Iterator[Any]:
        while (m := self._out.get()) is not None:
            yield m

    def send(self, **message: Any) -> None:
        self._out.put(pb.ProcessingRequest(**message))

    def recv(self) -> Any:
        return next(self._answers)

    def close(self) -> None:
        self._out.put(None)
        for _ in self._answers:
            pass
        self._channel.close()


CHAT = orjson.dumps({"model": "demo", "messages": [{"role": "user", "content": "x"}]})


def test_the_pick_and_the_served_endpoint(upstreams: UpstreamFactory) -> None:
    """The pick comes back as the header (set with OVERWRITE) and as `envoy.lb` metadata, the
    same value; when the data plane reports another endpoint served (its retry went elsewhere),
    the answer is booked to that one: here its 500 counts against it, not against the pick."""
    a, b = upstreams(), upstreams()
    with run_epp(backends=[url_of(a), url_of(b)]) as epp:
        s = Stream(epp)
        s.send(request_headers=_headers((":method", "POST"), (":path", "/v1/chat/completions"),
                                        (protocol.DESTINATION, "6.6.6.6:6")))
        s.send(request_body=pb.HttpBody(body=CHAT, end_of_stream=True))
        route = s.recv()
        (dest,) = [h for h in route.request_headers.response.header_mutation.set_headers
                   if h.header.key == protocol.DESTINATION]
        assert dest.append_action == base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
        picked = dest.header.raw_value.decode()
        assert MessageToDict(route.dynamic_metadata) == {
            "envoy.lb": {protocol.DESTINATION: picked}}
        body = s.recv().request_body.response.body_mutation.streamed_response
        assert (body.body, body.end_of_stream) == (CHAT, True)
        other = next(host_port(u) for u in (url_of(a), url_of(b)) if host_port(u) != picked)
        s.send(response_headers=_headers((":status", "500"), eos=True),
               metadata_context=_metadata("envoy.lb", {protocol.SERVED: other}))
        assert s.recv().HasField("response_headers")
        s.close()
        by = {host_port(x.url): x for x in epp.state.router.backends()}
        assert epp.call(lambda: (by[other].failures, by[picked].failures)) == (1, 0)
        assert epp.call(lambda: [x.outstanding for x in by.values()]) == [0, 0]
        assert epp.call(lambda: epp.state.flow.pool("demo").in_flight) == 0  # type: ignore[union-attr]


def test_a_stream_cut_before_the_answer_gives_the_slot_back(upstreams: UpstreamFactory) -> None:
    up = upstreams()
    with run_epp(backends=[url_of(up)]) as epp:
        s = Stream(epp)
        s.send(request_headers=_headers((":method", "POST"), (":path", "/v1/chat/completions")))
        s.send(request_body=pb.HttpBody(body=CHAT, end_of_stream=True))
        s.recv()
        pool = epp.call(lambda: epp.state.flow.pool("demo"))  # type: ignore[union-attr]
        assert epp.call(lambda: pool.in_flight) == 1
        s.close()  # Envoy ends the stream: the upstream was unreachable, the client left...
        assert epp.call(lambda: pool.in_flight) == 0


def test_a_stream_whose_done_passed_is_whole_however_the_exchange_ends(
    upstreams: UpstreamFactory,
) -> None:
    """A client reads `[DONE]` and closes its connection; Envoy then cancels the ext_proc stream
    before the upstream's end reaches it. The answer was whole: booked 200 with its usage, not
    499 (the real engines behind Envoy showed it: a session's turns all booked as hang-ups)."""
    up = upstreams()
    with run_epp(backends=[url_of(up)]) as epp:
        s = Stream(epp)
        s.send(request_headers=_headers((":method", "POST"), (":path", "/v1/chat/completions")))
        s.send(request_body=pb.HttpBody(body=orjson.dumps({
            "model": "demo", "stream": True,
            "messages": [{"role": "user", "content": "x"}]}), end_of_stream=True))
        s.recv()
        s.recv()
        s.send(response_headers=_headers((":status", "200"),
                                         ("content-type", "text/event-stream")))
        assert s.recv().HasField("response_headers")
        chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "demo"}
        events = b"".join(b"data: " + orjson.dumps({**chunk, **e}) + b"\n\n" for e in (
            {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1,
                                      "total_tokens": 6}},
        )) + b"data: [DONE]\n\n"
        s.send(response_body=pb.HttpBody(body=events, end_of_stream=False))
        s.recv()
        s.close()
        wait_for(lambda: epp.metric("llmserve_requests_total") >= 1, what="the answer booked")
        registry = epp.state.metrics.registry
        statuses = {x.labels["status"]: x.value
                    for m in epp.call(lambda: list(registry.collect())) for x in m.samples
                    if x.name == "llmserve_requests_total"}
        assert statuses == {"200": 1.0}
        assert epp.metric("llmserve_output_tokens_total") == 1


def test_health_liveness_and_readiness(upstreams: UpstreamFactory) -> None:
    serving = health_pb2.HealthCheckResponse.SERVING
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    with run_epp(backends=["http://127.0.0.1:9"], wait_ready=False) as epp:
        assert epp.health("liveness") == serving
        assert epp.health("readiness") == not_serving
        assert epp.health(protocol_service()) == not_serving
    with run_epp(backends=[url_of(upstreams())]) as epp:
        assert epp.health("readiness") == serving
        assert epp.health(protocol_service()) == serving


def protocol_service() -> str:
    return "envoy.service.ext_proc.v3.ExternalProcessor"


def test_help_shows_the_epp_flags_with_their_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["epp", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--epp.port int ext_proc gRPC port (GIE's convention: 9002), with gRPC health " \
           "(default: 9002)" in out
    assert "--mode {gateway,epp}" in out
