"""The probe listener on its own thread: it answers while the main loop is busy, and /health
fails once the main loop has not run for STALL_S."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest
import uvicorn

from gateway import probe_thread
from gateway.edge import Edge
from gateway.metrics import GatewayMetrics
from gateway.probe_thread import ProbeThread
from gateway.settings import EdgeSettings
from tests.ports import free_port


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b'{"status":"ok"}'})


def poll(url: str, until: threading.Event, out: list[tuple[int, float]]) -> None:
    with httpx.Client(timeout=5) as c:
        while not until.is_set():
            t0 = time.perf_counter()
            status = c.get(url, headers={"connection": "close"}).status_code
            out.append((status, time.perf_counter() - t0))
            time.sleep(0.01)


def test_probes_answer_while_the_main_loop_is_blocked_and_health_fails_when_it_stalls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(probe_thread, "STALL_S", 1.0)
    port = free_port()
    url = f"http://127.0.0.1:{port}/health"
    answers: list[tuple[int, float]] = []

    async def main() -> None:
        edge = Edge(EdgeSettings(), GatewayMetrics())
        probes = ProbeThread(uvicorn.Config(app), edge, app, {}, "127.0.0.1", port)
        probes.start()
        try:
            await asyncio.sleep(0.2)  # a beat or two
            done = threading.Event()
            poller = threading.Thread(target=poll, args=(url, done, answers))
            poller.start()
            time.sleep(1.6)  # noqa: ASYNC251 - on purpose: the main loop blocked, no turn at all
            await asyncio.sleep(0.6)  # running again: it beats
            done.set()
            poller.join(10)
        finally:
            probes.stop()

    asyncio.run(main())
    statuses = [s for s, _ in answers]
    assert statuses[0] == 200 and statuses[-1] == 200, statuses
    # Answered throughout (a blocked main loop used to block them all), then 503 past STALL_S.
    assert 503 in statuses, statuses
    assert max(t for _, t in answers) < 0.5, answers
    with pytest.raises(httpx.TransportError):  # stopped: the listener is closed
        httpx.get(url, timeout=2)
