"""The probe listener on a thread and an event loop of its own.

Why: with the probe listener on the main loop, /health on the probe port took up to 181.5 ms
during a flood of 20k idle connections on the API port (docs/benchmarks.md), although it has a
socket of its own. Both listeners shared one loop, and a loop turn can be long under a flood:
uvloop (libuv) accepts every pending connection of a listener in one turn and builds a protocol
for each before returning, their connection_made callbacks all run in the next turn, and the head
deadlines of connections opened together expire together. A probe needs several turns (accept,
read, the app, the write), each queued behind such a batch. A second loop on its own thread is
scheduled by the kernel and the GIL (its switch interval, 5 ms), whatever the main loop's turns
cost.

The probe app (gateway/edge.py: /health, /ready, /metrics) runs on this loop and reads the
gateway's state the main loop owns: readiness, the router's backends, the metrics registry (its
own locks). Those reads take no locks and await nothing, so they see the state as it was at some
instant, which is all a probe asks.

Liveness stays honest: the main loop beats every `BEAT_S`, and /health answers 503 once it has
not beaten for `STALL_S`: a wedged loop still fails its liveness probe, a busy one no longer does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.config import Config
from uvicorn.server import ServerState

from gateway.edge import Edge, open_probe_listener
from gateway.errors import GatewayError, send_error

log = logging.getLogger("gateway.probes")

BEAT_S = 0.5
# A kubelet liveness probe fails after its timeout (3 s in the chart) times its failureThreshold
# (3); a main loop stalled this long is wedged, not busy.
STALL_S = 10.0


class LoopStalled(GatewayError):
    status = 503
    type = "service_unavailable"
    code = "event_loop_stalled"


class Heartbeat:
    """The main loop's last beat, written there and read from the probe thread."""

    def __init__(self) -> None:
        self.at = time.monotonic()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._beat(), name="heartbeat")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _beat(self) -> None:
        while True:
            self.at = time.monotonic()
            await asyncio.sleep(BEAT_S)

    def stalled_for(self) -> float:
        return time.monotonic() - self.at


class LivenessApp:
    """/health fails while the main loop is stalled; everything else goes to `app`."""

    def __init__(self, app: ASGIApp, heartbeat: Heartbeat) -> None:
        self.app = app
        self.heartbeat = heartbeat

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/health":
            stalled = self.heartbeat.stalled_for()
            if stalled > STALL_S:
                await send_error(send, LoopStalled(
                    f"the gateway's event loop has not run for {stalled:.0f} s"))
                return
        await self.app(scope, receive, send)


class ProbeThread:
    """Serve the probe listener from a daemon thread; `start` returns once it listens (or raises
    the bind's OSError), `stop` closes it and its connections and joins the thread."""

    def __init__(self, config: Config, edge: Edge, app: ASGIApp, app_state: dict[str, Any],
                 host: str, port: int) -> None:
        self.heartbeat = Heartbeat()
        self._args = (config, edge, LivenessApp(app, self.heartbeat), app_state, host, port)
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._state: ServerState | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="probe-listener", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error
        self.heartbeat.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server, self._state = self._loop.run_until_complete(
                open_probe_listener(*self._args))
        except BaseException as exc:  # noqa: BLE001 - handed to start(), which raises it
            self._error = exc
            self._ready.set()
            self._loop.close()
            return
        self._ready.set()
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def _close(self) -> None:
        assert self._server is not None and self._state is not None
        self._server.close()
        for connection in list(self._state.connections):
            connection.shutdown()
        # Let answers in progress finish writing (a probe is a few hundred bytes), then stop.
        for _ in range(20):
            if not self._state.connections:
                break
            await asyncio.sleep(0.05)

    def stop(self) -> None:
        self.heartbeat.stop()
        if not self._thread.is_alive():
            return
        done = asyncio.run_coroutine_threadsafe(self._close(), self._loop)
        with contextlib.suppress(Exception):
            done.result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
