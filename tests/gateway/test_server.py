"""Lifecycle of `python -m gateway`: a bad setting fails fast; SIGTERM turns /ready unready and
drains in-flight streams."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import orjson
import pytest
import uvicorn
import uvloop

from bench.fake_upstream import Behaviour, start_in_thread
from bench.load import build_request
from gateway.__main__ import main
from gateway.app import build_app
from gateway.server import _DrainingServer
from gateway.settings import GatewaySettings
from tests import loopback
from tests.cli import run_main
from tests.gateway.conftest import (
    BackgroundStream,
    UpstreamFactory,
    gateway_process,
    run_gateway,
    url_of,
)
from tests.ports import free_port

# `python -m gateway`'s main() in this process (tests/gateway/test_cli.py runs the command itself).
# A bad setting or keys file stops it before anything binds or logs.


def test_bad_setting_is_one_line_naming_it() -> None:
    proc = run_main(main, "--timeouts.total-s", "1", "--timeouts.first-byte-s", "5")
    assert proc.returncode == 2
    assert "GATEWAY_TIMEOUTS" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("content", [None, "dir", b"{not json", b'{"keys": [{"tenant": 1}]}',
                                     b"\xff\xfe"])
def test_bad_keys_file_is_one_line_and_a_nonzero_exit(tmp_path: Path,
                                                      content: bytes | str | None) -> None:
    path = tmp_path / "keys.json"
    if content == "dir":
        path.mkdir()  # unreadable as a file, even for root (a chmod 000 file is not)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    proc = run_main(main, "--port", str(free_port()), "--api-keys-file", str(path))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "GATEWAY_API_KEYS_FILE" in lines[0], proc.stderr


def test_sigterm_lets_the_inflight_stream_finish_then_exits(upstreams: UpstreamFactory) -> None:
    up = upstreams(token_delay_s=0.02)
    with gateway_process(up) as (gw, url):  # the drain: the longest request (900 s)
        stream = BackgroundStream(url)
        stream.flowing()  # 50 tokens x 20 ms: a second of stream left
        os.kill(gw.pid, signal.SIGTERM)
        assert stream.join().rstrip().endswith("data: [DONE]")
        # uvicorn re-raises the signal once it has shut down gracefully: the exit status says
        # "terminated by SIGTERM", as Kubernetes expects, but only after the drain.
        assert gw.wait(15) in (0, -signal.SIGTERM)


def test_drain_expiry_ends_each_open_stream_with_one_error_event(
    upstreams: UpstreamFactory,
) -> None:
    """Streams still open when the drain timeout expires each get one in-band error event and a
    proper end (no [DONE], no cut connection), a whole answer still pending gets a 503, and
    nothing is logged as a traceback."""
    up = upstreams(token_delay_s=0.05)  # 400 tokens: 20 s, far past the 1 s drain
    # A drain shorter than the total, which the settings refuse (tests/gateway/short_drain.py).
    with gateway_process(up, main=[str(Path(__file__).with_name("short_drain.py")), "1"]) as (
            gw, url):
        results: list[str | BaseException] = []

        def stream() -> None:
            try:
                with loopback.stream("POST", url + "/v1/chat/completions", timeout=30, json={
                        "model": "demo", "stream": True, "max_tokens": 400,
                        "messages": [{"role": "user", "content": "hi"}]}) as r:
                    results.append(r.read().decode())
            except httpx.HTTPError as exc:  # a cut stream: what the fix prevents
                results.append(exc)

        whole: list[httpx.Response | BaseException] = []

        def unanswered() -> None:
            try:
                whole.append(loopback.post(url + "/v1/completions", timeout=30, json={
                    "model": "demo", "prompt": "hi", "max_tokens": 400}))
            except httpx.HTTPError as exc:
                whole.append(exc)

        threads = [threading.Thread(target=stream) for _ in range(3)]
        threads.append(threading.Thread(target=unanswered))
        for t in threads:
            t.start()
        # All four are in (three streaming, one waiting for its answer; the scrape counts itself)
        # before the signal closes the listener: a loaded machine may take a while to connect.
        deadline = time.monotonic() + 10
        while _in_flight(url) < 5:
            assert time.monotonic() < deadline, "the requests never all arrived"
            time.sleep(0.05)
        time.sleep(0.2)  # and the streams have events out
        os.kill(gw.pid, signal.SIGTERM)
        for t in threads:
            t.join(15)
        assert gw.wait(15) in (0, -signal.SIGTERM)
        assert gw.stderr is not None
        log = gw.stderr.read()
    assert len(results) == 3
    for text in results:
        assert isinstance(text, str), f"stream cut without an in-band error: {text!r}"
        events = [e for e in text.split("\n\n") if e.strip()]
        assert "[DONE]" not in text
        errors = [e for e in events if '"error"' in e]
        assert errors == [events[-1]], events[-3:]
        assert orjson.loads(errors[0].removeprefix("data: "))["error"]["code"] == "shutting_down"
        assert len(events) > 3  # it was cut mid-stream, not refused
    [answer] = whole
    assert isinstance(answer, httpx.Response), f"no answer: {answer!r}"
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "shutting_down"
    assert "Traceback" not in log and "Cancel" not in log, log
    assert "ending 4 open request(s)" in log


async def test_ready_turns_unready_when_the_drain_starts(upstreams: UpstreamFactory) -> None:
    """Step 3 of the lifecycle: the signal handler flips /ready to 503 before uvicorn stops
    accepting; /health (liveness) stays 200 so the drain is not cut short by a restart."""
    up = upstreams()
    settings = GatewaySettings(backends=[url_of(up)], health_interval_s=0.1)
    app = build_app(settings)
    async with app.api.router.lifespan_context(app.api), loopback.async_client(
        transport=httpx.ASGITransport(app=app), base_url="http://gw"
    ) as client:
        deadline = time.monotonic() + 10
        while (await client.get("/ready")).status_code != 200:
            assert time.monotonic() < deadline, "the backend was never probed up"
            await asyncio.sleep(0.05)
        server = _DrainingServer(uvicorn.Config(app), app.state)
        server.handle_exit(signal.SIGTERM, None)
        r = await client.get("/ready")
        assert r.status_code == 503
        assert r.json()["error"]["message"] == "gateway is draining"
        assert int(r.headers["retry-after"]) >= 1
        assert (await client.get("/health")).status_code == 200
        assert server.should_exit  # and uvicorn's own shutdown was started


def _in_flight(url: str) -> float:
    for line in loopback.get(url + "/metrics").text.splitlines():
        if line.startswith("llmserve_requests_in_flight "):
            return float(line.split()[1])
    raise AssertionError("llmserve_requests_in_flight is not exported")


def test_requests_in_flight_counts_the_open_streams(upstreams: UpstreamFactory) -> None:
    """Read from the server's request tasks at scrape time (the scrape counts itself)."""
    up = upstreams(tokens=40, token_delay_s=0.05)
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with gateway_process(up) as (_, url):
        idle = _in_flight(url)
        with loopback.client(timeout=30) as client:
            streams = [client.stream("POST", url + "/v1/chat/completions", json=body)
                       for _ in range(3)]
            responses = [s.__enter__() for s in streams]
            try:
                assert all(r.status_code == 200 for r in responses)
                assert _in_flight(url) == idle + 3
            finally:
                for s in streams:
                    s.__exit__(None, None, None)
        deadline = time.monotonic() + 10
        while _in_flight(url) != idle:  # the hung-up streams end as their disconnects land
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert idle == 1


class _KeepAliveClient:
    """Streamed requests over one keep-alive connection, read to the chunked terminator or
    abandoned after the first event. Plain blocking sockets: the client makes no cycles of its
    own, so whatever the collector finds below is the server's."""

    def __init__(self, port: int, raw: bytes) -> None:
        self._port, self._raw = port, raw
        self._sock: socket.socket | None = None

    def stream(self, *, abandon: bool) -> None:
        if self._sock is None:
            self._sock = socket.create_connection(("127.0.0.1", self._port), timeout=10)
        self._sock.sendall(self._raw)
        buf = b""
        while not (buf.endswith(b"\r\n0\r\n\r\n") or abandon and b"data:" in buf):
            data = self._sock.recv(65536)
            assert data, "the gateway closed the connection"
            buf = buf[-64:] + data
        assert abandon or b"[DONE]" in buf
        if abandon:  # hang up mid-stream: the proxy cancels, the upstream call is dropped
            self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


@pytest.mark.slow  # 220 streamed requests with the collector off: seconds
def test_requests_leave_no_reference_cycles_for_the_collector() -> None:
    """Each request's objects are freed by reference counting as it ends, abandoned ones too.

    `run` makes the cyclic GC rare (`gc.freeze()`, a first threshold of 20,000 allocations), on
    the premise that the relay makes no cycles. A cycle per request breaks it quietly: the
    requests in flight at each young collection move to an older generation, become garbage there
    and wait for a full collection, which comes after millions of allocations, so the process
    grows in a straight line between them (bench/soak.py sees it as RSS growth). Here the
    collector is off while streamed requests go through the edge, the proxy and the h1 transport,
    on uvloop as `python -m gateway` runs them, some abandoned mid-stream; then one collection
    counts what only it could free."""
    requests, abandon_every, reconnect_every = 200, 5, 20
    pace = Behaviour(tokens=4, token_delay_s=0.002)  # abandoned streams are still running
    with start_in_thread(pace, loop_factory=uvloop.new_event_loop) as up, \
            run_gateway(backends=[url_of(up)], loop="uvloop") as gw:
        port = int(gw.url.rsplit(":", 1)[1])
        client = _KeepAliveClient(port, build_request(gw.url, "demo", pace.tokens))
        for i in range(20):  # warm: pools, lazily made metric series, first-use caches
            client.stream(abandon=i == 0)
        gc.collect()
        gc.disable()
        try:
            before = up.aborted
            for i in range(requests):  # the last ones whole: the abandoned ones have ended
                client.stream(abandon=i % abandon_every == 0)
                if i % reconnect_every == reconnect_every - 1:
                    client.close()
            deadline = time.monotonic() + 5
            while up.aborted - before < requests // abandon_every and time.monotonic() < deadline:
                time.sleep(0.01)
            abandoned = up.aborted - before
            found = gc.collect()
        finally:
            gc.enable()
            client.close()
    # Every abandoned stream was cut upstream too, i.e. the cancellation path really ran.
    assert abandoned == requests // abandon_every, (
        f"{abandoned} of {requests // abandon_every} abandoned streams were cut upstream in 5 s")
    assert found < requests // 20, f"{found} objects in reference cycles after {requests} requests"
