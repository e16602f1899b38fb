"""bench.floor_proxy, bench.asgi_floor and bench.task_floor are contenders in bench.paired_cpu:
their CPU per request means something only if they relay whole answers on kept-alive connections,
as the gateway does."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from bench.fake_upstream import Behaviour, start_in_thread
from tests.ports import free_port


@contextlib.contextmanager
def floor_proxy(module: str, upstream_port: int) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", module, "--port", str(port),
                             "--upstream", f"127.0.0.1:{upstream_port}"])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(httpx.TransportError):
                httpx.get(url + "/health")
                break
            assert time.monotonic() < deadline, "the floor proxy never answered"
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.slow
@pytest.mark.parametrize("module", ["bench.floor_proxy", "bench.asgi_floor", "bench.task_floor"])
def test_streams_and_plain_answers_are_relayed_whole_on_one_connection(module: str) -> None:
    with start_in_thread(Behaviour(tokens=20, token_delay_s=0.001)) as up, \
            floor_proxy(module, up.port) as url, httpx.Client(base_url=url, timeout=10) as client:
        for _ in range(3):
            text = client.post("/v1/chat/completions", json={
                "model": "demo", "stream": True, "max_tokens": 20,
                "messages": [{"role": "user", "content": "hi"}]}).text
            assert text.rstrip().endswith("data: [DONE]")
            assert text.count('"content"') >= 20
            assert client.get("/health").status_code == 200
        # Each answer's end was found (else the next request on the connection would hang), and
        # the one upstream connection was reused for every request, the readiness probe's too.
        assert up.opened == 1
