"""The HTTP edge: what a hostile or slow client can make the gateway hold, bounded in the protocol.

uvicorn's httptools protocol has no cap on the request head (httptools joins a header value piece
by piece, so one 128 MB value costs quadratic copying on the event loop), no deadline for a head
or a body that never completes, and no cap on open connections (`limit_concurrency` is checked
only once a head is complete, so idle connections never meet it and hold their fds, while
/health gets uvicorn's text/plain 503, which fails a liveness probe). The edge adds them on
uvicorn's public surface: a subclass of its protocol that calls `super()` for every callback it
extends, uvicorn's `Config`, and ASGI.

- `limits.Edge`: the limits a process's connections share, and the record of each refusal;
- `protocol.EdgeProtocol`: the protocol that enforces them;
- `writer.ConnectionWriter`: a connection as the proxy's streamed relay writes to it;
- `probe.open_probe_listener`: /health, /ready and /metrics on a port of their own.
"""

from gateway.edge.limits import Edge, check_fd_limit
from gateway.edge.probe import open_probe_listener
from gateway.edge.protocol import EdgeProtocol

__all__ = ["Edge", "EdgeProtocol", "check_fd_limit", "open_probe_listener"]
