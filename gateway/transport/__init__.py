"""How the gateway talks HTTP to an engine, behind two names: `Transport` (post, request, get,
close) and the `UpstreamResponse` it returns (status, headers, read, readany, push, close,
release). The api, flow and routing layers use only these names; h1.py's client is the one
implementation (a second one would make these a Protocol again).
"""

from gateway.transport.h1 import BodySink
from gateway.transport.h1 import H1Response as UpstreamResponse
from gateway.transport.h1 import H1Transport as Transport

__all__ = ["BodySink", "Transport", "UpstreamResponse"]
