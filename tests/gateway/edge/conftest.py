"""A real `python -m gateway` with the edge's limits set low, for attacks from bench/edge_attacks.py."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import orjson
import pytest

from bench.fake_upstream import Behaviour, FakeUpstream, start_in_thread
from tests import loopback
from tests.gateway.conftest import gateway_process
from tests.ports import free_port

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
        lines = loopback.get(self.probe_url + "/metrics").text.splitlines()
        return sum(float(line.rsplit(" ", 1)[1]) for line in lines
                   if line.startswith(name) and label in line)


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


def json_error(body: bytes) -> dict[str, object]:
    """The `error` object of an OpenAI error body, its shape checked."""
    err = orjson.loads(body)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return dict(err)
