"""The Endpoint Picker Protocol's messages (Gateway API Inference Extension, proposal 004), as
Envoy's ext_proc v3 protobufs: what the EPP reads from a ProcessingRequest and the
ProcessingResponses it answers with.

- The pick goes back twice, with the same value: the `x-gateway-destination-endpoint` request
  header (an ORIGINAL_DST cluster, or Istio's override_host policy, route by it) and the
  `envoy.lb` dynamic metadata. The header is set with OVERWRITE: a client's own value never
  survives.
- The data plane may narrow the choice with `envoy.lb.subset_hint` filter metadata
  (`x-gateway-destination-endpoint-subset`: a list of ip:port), and reports the endpoint that
  served with `envoy.lb` `x-gateway-destination-endpoint-served`.
- In FULL_DUPLEX_STREAMED body mode every body byte comes back to Envoy in
  `streamed_response` mutations, in chunks of at most ~62 kB (Envoy refuses larger).
- A refusal is an ImmediateResponse: the status, Retry-After, and OpenAI's error JSON.

The generated protobuf modules (PyPI xds-protos) carry no type information; this module is the
one boundary where their messages are built and read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from envoy.config.core.v3 import base_pb2  # type: ignore[import-untyped]
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb  # type: ignore[import-untyped]
from envoy.type.v3 import http_status_pb2  # type: ignore[import-untyped]
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict

from gateway.errors import GatewayError

DESTINATION = "x-gateway-destination-endpoint"
SERVED = "x-gateway-destination-endpoint-served"
SUBSET = "x-gateway-destination-endpoint-subset"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"

_OVERWRITE = base_pb2.HeaderValueOption.HeaderAppendAction.Value("OVERWRITE_IF_EXISTS_OR_ADD")

# What a ProcessingRequest/ProcessingResponse is, to the rest of the package.
Message = Any


def headers_of(http_headers: Message) -> list[tuple[bytes, bytes]]:
    """An ext_proc HttpHeaders as ASGI-style (lower-case name, value) byte pairs, pseudo-headers
    (:path, :method, ...) included. Envoy sends `raw_value`; `value` is the older field."""
    return [(h.key.lower().encode("latin-1"), h.raw_value or h.value.encode("latin-1"))
            for h in http_headers.headers.headers]


def header(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for k, v in headers:
        if k == name:
            return v
    return None


def _metadata(request: Message, namespace: str) -> dict[str, Any]:
    filters = request.metadata_context.filter_metadata
    if namespace not in filters:
        return {}
    return MessageToDict(filters[namespace])


def subset_hint(request: Message) -> frozenset[str] | None:
    """The endpoints (ip:port) the data plane allows for this request, or None: no hint, any
    endpoint of the pool. An empty set allows none."""
    hint = _metadata(request, SUBSET_NAMESPACE).get(SUBSET)
    if hint is None:
        return None
    if isinstance(hint, str):
        hint = hint.split(",")
    return frozenset(str(h).strip() for h in hint if str(h).strip())


def served_endpoint(request: Message) -> str | None:
    """The endpoint that served the request, as the data plane reports it (response path)."""
    served = _metadata(request, LB_NAMESPACE).get(SERVED)
    return served if isinstance(served, str) and served else None


def _header(name: str, value: bytes) -> Message:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=name, raw_value=value), append_action=_OVERWRITE)


def route_to(endpoint: str, set_headers: Iterable[tuple[str, bytes]] = (),
             remove: Iterable[str] = ()) -> Message:
    """The request-headers answer that sends the request to `endpoint` (ip:port): the header
    (overwriting any the client sent) and the `envoy.lb` metadata, with the same value."""
    mutation = pb.HeaderMutation(
        set_headers=[_header(DESTINATION, endpoint.encode()),
                     *(_header(k, v) for k, v in set_headers)],
        remove_headers=list(remove))
    meta = struct_pb2.Struct()
    meta.update({LB_NAMESPACE: {DESTINATION: endpoint}})
    return pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(response=pb.CommonResponse(header_mutation=mutation)),
        dynamic_metadata=meta)


def continue_request_headers() -> Message:
    return pb.ProcessingResponse(request_headers=pb.HeadersResponse())


def continue_response_headers() -> Message:
    return pb.ProcessingResponse(response_headers=pb.HeadersResponse())


def body_chunks(body: bytes, end_of_stream: bool, limit: int, *,
                response: bool) -> Iterator[Message]:
    """`body` back to Envoy as streamed body mutations of at most `limit` bytes each; the last
    carries `end_of_stream`. An empty body is one (empty) message, so that the end still goes."""
    field = "response_body" if response else "request_body"
    n = len(body)
    start = 0
    while True:
        chunk = body[start:start + limit]
        start += limit
        last = start >= n
        yield pb.ProcessingResponse(**{field: pb.BodyResponse(response=pb.CommonResponse(
            body_mutation=pb.BodyMutation(streamed_response=pb.StreamedBodyResponse(
                body=chunk, end_of_stream=end_of_stream and last))))})
        if last:
            return


def trailers(response: bool) -> Message:
    if response:
        return pb.ProcessingResponse(response_trailers=pb.TrailersResponse())
    return pb.ProcessingResponse(request_trailers=pb.TrailersResponse())


def immediate(exc: GatewayError, extra: Iterable[tuple[bytes, bytes]] = ()) -> Message:
    """The refusal Envoy sends the client at once, in place of an upstream answer: the error's
    status, its headers (content type, Retry-After) and OpenAI's error JSON."""
    headers = [*exc.headers(), *extra]
    return pb.ProcessingResponse(immediate_response=pb.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=exc.status),
        headers=pb.HeaderMutation(set_headers=[
            _header(k.decode("latin-1"), v) for k, v in headers]),
        body=exc.body(),
        details=f"llmserve_epp_{exc.status}"))
