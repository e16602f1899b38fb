"""The limits a process's client connections share, and the record of every refusal.

Every refusal counts in `llmserve_edge_events{reason}` and logs at most one line per reason per
10 s. A refusal the client can still read is answered in OpenAI's JSON shape
(`raw_response`), written by the protocol itself: no request cycle exists for it.
"""

from __future__ import annotations

import logging
import resource
from http import HTTPStatus

from gateway.errors import GatewayError, RateLimitedLog
from gateway.metrics import GatewayMetrics
from gateway.settings import EdgeSettings

log = logging.getLogger("gateway.edge")

REASONS = ("head_too_large", "too_many_headers", "head_timeout", "body_timeout", "body_unread",
           "connection_cap", "bad_request")


class Edge:
    """The edge's settings and its counters, shared by every connection of a process."""

    def __init__(self, settings: EdgeSettings, metrics: GatewayMetrics) -> None:
        self.settings = settings
        # Children made up front: each reason is exported (at 0) before it first happens.
        self._counters = {r: metrics.edge_events.labels(r) for r in REASONS}
        self._logs = {r: RateLimitedLog(log, burst=1) for r in REASONS}

    def event(self, reason: str, client: tuple[str, int] | None, detail: str = "") -> None:
        self._counters[reason].inc()
        self._logs[reason].warning(
            "edge: %s from %s%s", reason, f"{client[0]}:{client[1]}" if client else "?",
            f" ({detail})" if detail else "")


class QuietRequests(logging.Filter):
    """uvicorn logs a warning for every request it cannot parse, and one (two without a WebSocket
    protocol) for every request with an `Upgrade` header it does not take up: a client could write
    a log line per request. The edge records the first itself (`bad_request`, at most one line per
    10 s); for upgrades, which the gateway answers as plain HTTP (`ws="none"`, as RFC 9110
    allows), this filter logs at most one line per 10 s."""

    _INVALID = "Invalid HTTP request received."
    _UPGRADE = ("Unsupported upgrade request.", "No supported WebSocket library detected")

    def __init__(self) -> None:
        super().__init__()
        self._log = RateLimitedLog(log, burst=1)

    def filter(self, record: logging.LogRecord) -> bool:
        if not isinstance(record.msg, str):
            return True
        if record.msg == self._INVALID:
            return False
        if not record.msg.startswith(self._UPGRADE):
            return True
        if record.msg == self._UPGRADE[0]:
            self._log.warning("edge: upgrade requests answered as plain HTTP/1.1")
        return False


def check_fd_limit(settings: EdgeSettings) -> None:
    """Warn when the process cannot open `max_connections` sockets plus room for upstream
    connections and the probes: then fd exhaustion, not the cap, decides who gets refused."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and settings.max_connections + 1024 > soft:
        log.warning("GATEWAY_EDGE__MAX_CONNECTIONS=%d leaves less than 1024 of the %d file "
                    "descriptors this process may open (ulimit -n) for upstreams and probes",
                    settings.max_connections, soft)


def raw_response(error: GatewayError, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """A whole HTTP/1.1 response for `error` that closes the connection."""
    body = error.body()
    out = [b"HTTP/1.1 %d %s\r\n" % (error.status, HTTPStatus(error.status).phrase.encode())]
    for name, value in (*default_headers, *error.headers(),
                        (b"content-length", b"%d" % len(body)), (b"connection", b"close")):
        out += (name, b": ", value, b"\r\n")
    out += (b"\r\n", body)
    return b"".join(out)
