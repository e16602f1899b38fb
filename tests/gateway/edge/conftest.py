"""A real `python -m gateway` with the edge's limits set low, for attacks from bench/edge_attacks.py."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from bench.fake_upstream import Behaviour, FakeUpstream, start_in_thread
from tests.gateway.conftest import gateway_process
from tests.ports import free_port
from tests.waiting import metric_sum, scrape

HEAD_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 300
BODY_LIMIT = 1024 * 1024


@dataclass
class Gateway:
    proc: subprocess.Popen[str]
    port: int
    probe: int
    upstream: int

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def probe_url(self) -> str:
        return f"http://127.0.0.1:{self.probe}"

    def metric(self, name: str, label: str = "") -> float:
        return metric_sum(scrape(self.probe_url), name, label)


@contextlib.contextmanager
def edge_gateway(up: FakeUpstream, *flags: str) -> Iterator[Gateway]:
    """`python -m gateway` in front of `up`, with a probe listener of its own."""
    probe = free_port()
    with gateway_process(up, "--log-level", "warning", "--edge.probe-port", str(probe),
                         *flags) as (proc, url):
        yield Gateway(proc, int(url.rsplit(":", 1)[1]), probe, up.port)


@pytest.fixture(scope="package")
def gw() -> Iterator[Gateway]:
    """One gateway for the package's attacks, its limits low enough to reach in a test."""
    with start_in_thread(Behaviour()) as up, edge_gateway(
        up,
        "--edge.head-timeout-s", str(HEAD_TIMEOUT_S), "--edge.body-timeout-s",
        str(BODY_TIMEOUT_S), "--edge.max-connections", str(MAX_CONNECTIONS),
        "--max-body-bytes", str(BODY_LIMIT),
    ) as gateway:
        yield gateway


def until_closed(port: int, *pieces: bytes, gap_s: float = 0.1,
                 timeout_s: float = 5) -> list[tuple[int, bytes]]:
    """Send `pieces` on one connection, `gap_s` apart, and read until the gateway closes it
    (within `timeout_s`): the status and body of each Content-Length answer, all there was."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        for i, piece in enumerate(pieces):
            if i:
                time.sleep(gap_s)
            sock.sendall(piece)
        received = b""
        while chunk := sock.recv(65536):  # a TimeoutError here: the connection was left open
            received += chunk
    answers = []
    while received:
        head, sep, rest = received.partition(b"\r\n\r\n")
        assert sep, f"not a whole answer: {received!r}"
        lines = head.split(b"\r\n")
        length = next(int(line.split(b":", 1)[1]) for line in lines
                      if line.lower().startswith(b"content-length:"))
        assert len(rest) >= length, f"a cut answer: {received!r}"
        answers.append((int(lines[0].split(b" ")[1]), rest[:length]))
        received = rest[length:]
    return answers


def ended_log(proc: subprocess.Popen[str], timeout_s: float = 15) -> str:
    """The log of a gateway process told to stop (SIGTERM): it must exit within `timeout_s`,
    cleanly, having logged no traceback."""
    assert proc.wait(timeout_s) in (0, -signal.SIGTERM)
    assert proc.stderr is not None
    log = proc.stderr.read()
    assert "Traceback" not in log, log
    return log
