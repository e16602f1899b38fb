"""A /metrics endpoint on loopback serving synthetic series of known values, for a real Prometheus
to scrape where no real exporter can run (DCGM's needs a GPU) or a test needs exact figures.

A gauge serves its value; a counter grows at `value` per second from the exporter's start, from
`COUNTER_BASE` (far from zero, so Prometheus's rate() extrapolation never stops at zero).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COUNTER_BASE = 1e6


@dataclass(frozen=True)
class Series:
    name: str
    labels: Mapping[str, str]
    value: float
    counter: bool = False  # `value` is the increase per second


def exposition(series: list[Series], elapsed: float) -> str:
    lines = []
    for s in series:
        labels = ",".join(f'{k}="{v}"' for k, v in s.labels.items())
        value = COUNTER_BASE + s.value * elapsed if s.counter else s.value
        lines.append(f"{s.name}{{{labels}}} {value!r}")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def synthetic_exporter(series: list[Series]) -> Iterator[str]:
    """Serve `series` at http://127.0.0.1:<port>/metrics while the block runs; yields the URL."""
    start = time.monotonic()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = exposition(series, time.monotonic() - start).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="synthetic-exporter", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
