"""uvicorn servers in a thread of the test process (the gateway under test, fake LoRA replicas):
started, then stopped as soon as the test is done with them.

uvicorn's main loop looks at `should_exit` every 0.1 s; a test that stops a server waited half a
tick on average, on each of the ~100 gateways the fast tier starts. Here the loop also wakes when
`stop()` is called. The shutdown itself (connections, in-flight tasks, the lifespan) is uvicorn's.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator

import uvicorn

# uvicorn's tick: it refreshes the Date header once every ten of them.
_TICK_S = 0.1


class ThreadServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.__wake: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    async def main_loop(self) -> None:
        # uvicorn's loop (on_tick every 0.1 s until it says stop), with a wake-up between ticks.
        wake = asyncio.Event()
        self.__wake = (asyncio.get_running_loop(), wake)
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 1) % 864_000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), _TICK_S)

    def stop(self) -> None:
        """From any thread. `should_exit` first: a loop not yet waiting sees it at its first tick."""
        self.should_exit = True
        if self.__wake is not None:
            loop, wake = self.__wake
            with contextlib.suppress(RuntimeError):  # the loop has already ended
                loop.call_soon_threadsafe(wake.set)


@contextlib.contextmanager
def serve_in_thread(config: uvicorn.Config, start_timeout_s: float = 10,
                    ) -> Iterator[ThreadServer]:
    """`config` served in a daemon thread until the block ends; entered once uvicorn has started
    (lifespan up, socket listening) or its thread has ended (a failed start-up)."""
    server = ThreadServer(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + start_timeout_s
        while not server.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)
        yield server
    finally:
        server.stop()
        thread.join(10)
