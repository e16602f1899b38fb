"""gateway/edge/limits.py: each refusal counted, logged once per interval, answered in JSON."""

from __future__ import annotations

import logging

import pytest

from gateway.edge.limits import Edge, raw_response
from gateway.errors import RequestTimeout
from gateway.metrics import GatewayMetrics
from gateway.settings import EdgeSettings
from tests.openai_error import openai_error


def test_edge_events_count_every_time_and_log_once_per_interval(
        caplog: pytest.LogCaptureFixture) -> None:
    metrics = GatewayMetrics()
    edge = Edge(EdgeSettings(), metrics)
    with caplog.at_level(logging.WARNING, logger="gateway.edge"):
        for _ in range(5):
            edge.event("head_timeout", ("10.0.0.1", 1234))
        edge.event("connection_cap", None)
    assert metrics.edge_events.labels("head_timeout")._value.get() == 5
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "head_timeout from 10.0.0.1:1234" in lines[0]


def test_a_refusal_is_a_whole_response_that_closes_the_connection() -> None:
    raw = raw_response(RequestTimeout("too slow"), [(b"server", b"x")])
    head, body = raw.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 408 Request Timeout"
    assert b"server: x" in lines and b"connection: close" in lines
    assert b"content-length: %d" % len(body) in lines
    assert openai_error(body)["message"] == "too slow"
