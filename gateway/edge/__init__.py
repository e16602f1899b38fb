"""The HTTP edge: what a hostile or slow client can make the gateway hold, bounded in the protocol.

uvicorn's httptools protocol has no cap on the request head, no deadline for a head or a body
that never completes, and no cap on idle connections (`limit_concurrency` counts requests, and
answers /health with a text/plain 503). The edge adds them on uvicorn's public surface: a protocol
subclass calling `super()` in every callback it extends (`protocol.EdgeProtocol`), with the limits
and refusal records a process shares (`limits.Edge`), and a listener of the probes' own (`probe`).
"""

from gateway.edge.limits import Edge, QuietRequests, check_fd_limit
from gateway.edge.probe import open_probe_listener
from gateway.edge.protocol import EdgeProtocol

__all__ = ["Edge", "EdgeProtocol", "QuietRequests", "check_fd_limit", "open_probe_listener"]
