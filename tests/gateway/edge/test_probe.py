"""gateway/edge/probe.py: /health, /ready and /metrics on a port of their own, through the drain."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from bench.fake_upstream import Behaviour, start_in_thread
from gateway.settings import EdgeSettings, GatewaySettings
from tests import loopback
from tests.gateway.conftest import BackgroundStream
from tests.gateway.edge.conftest import Gateway, edge_gateway, until_closed
from tests.openai_error import openai_error
from tests.ports import free_port
from tests.waiting import wait_for


def test_the_probe_port_serves_probes_only(gw: Gateway) -> None:
    assert loopback.get(gw.probe_url + "/health").json() == {"status": "ok"}
    assert loopback.get(gw.probe_url + "/ready").status_code == 200
    assert "llmserve_connections_open" in loopback.get(gw.probe_url + "/metrics").text
    r = loopback.get(gw.probe_url + "/v1/models")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"



def test_the_probe_port_serves_upgrade_requests_as_plain_http(gw: Gateway) -> None:
    # Its listener had uvicorn's default WebSocket protocol: a WebSocket upgrade of /health got a
    # 403 in text/plain, and a POST with one no answer at all.
    ws = (b"connection: upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\n"
          b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n")
    answers = until_closed(gw.probe, b"GET /health HTTP/1.1\r\nhost: x\r\n" + ws + b"\r\n")
    assert answers == [(200, b'{"status":"ok"}')]
    answers = until_closed(gw.probe, b"POST /health HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n"
                           + ws + b"\r\n{}")
    assert [status for status, _ in answers] == [400]
    assert openai_error(answers[0][1])["type"] == "invalid_request_error"

@pytest.mark.slow
def test_the_probe_port_answers_through_the_drain() -> None:
    """The API listener closes at SIGTERM; the probe listener stays until the drain is over, so
    the kubelet reads /ready 503 (and /health 200), not a refused connection."""
    with start_in_thread(Behaviour(token_delay_s=0.05)) as up, edge_gateway(up) as gw:
        stream = BackgroundStream(gw.url, max_tokens=40)
        stream.flowing()  # 40 tokens x 50 ms: two seconds of drain ahead
        os.kill(gw.pid, signal.SIGTERM)
        # Once the gateway has taken the signal (a loaded machine may take a while), /ready
        # says so; the probe listener answers all along (a refused connection fails this).
        wait_for(lambda: loopback.get(gw.probe_url + "/ready").status_code == 503,
                 what="/ready never said 503 after SIGTERM")
        ready = loopback.get(gw.probe_url + "/ready")
        assert ready.status_code == 503
        assert ready.json()["error"]["message"] == "gateway is draining"
        assert loopback.get(gw.probe_url + "/health").status_code == 200
        assert stream.join().rstrip().endswith("data: [DONE]")
        assert gw.proc.wait(15) in (0, -signal.SIGTERM)


@pytest.mark.parametrize("which", ["GATEWAY_PORT", "GATEWAY_EDGE__PROBE_PORT"])
def test_a_port_in_use_is_one_line_and_exit_2_before_start_up(which: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        api, probe = (port, free_port()) if which == "GATEWAY_PORT" else (free_port(), port)
        proc = subprocess.run(
            [sys.executable, "-m", "gateway", "--host", "127.0.0.1", "--port", str(api),
             "--backend", "http://127.0.0.1:9", "--edge.probe-port", str(probe)],
            capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"llmserve-gateway: error: {which}={port}: cannot listen on "
                           f"127.0.0.1:{port} (Address already in use)\n")


def test_the_probe_port_must_differ_from_the_api_port() -> None:
    with pytest.raises(ValueError, match="GATEWAY_EDGE__PROBE_PORT"):
        GatewaySettings(port=8000, edge=EdgeSettings(probe_port=8000))
