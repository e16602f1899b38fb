"""What the edge's checks cost per request, in the protocol alone: the same keep-alive requests fed
to uvicorn's HttpToolsProtocol and to gateway/edge.py's EdgeProtocol, in-process, alternating.

No sockets and no upstream: a stub transport and an app that answers at once, so the difference
between the two is the edge's per-request work (head accounting, header count, two deadline timers,
the overridden callbacks). Divide it by the gateway's whole cost per streamed request (~570 us at
1,750 req/s on one core, docs/benchmarks.md) for its share of streamed throughput. Light enough
(one core for a few seconds) to run beside other work; bench.flow_overhead is the end-to-end check.

    python -m bench.edge_overhead [--requests 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from typing import Any

import uvloop
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from gateway.edge import Edge, EdgeProtocol
from gateway.metrics import GatewayMetrics
from gateway.settings import EdgeSettings

REQUEST = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw:8000\r\nuser-agent: bench\r\n"
           b"authorization: Bearer sk-bench\r\ncontent-type: application/json\r\n"
           b"accept: */*\r\ncontent-length: 96\r\n\r\n" + b"{" + b"x" * 94 + b"}")


class StubTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = 0
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += len(data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_reading(self) -> bool:
        return True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass


async def app(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})


async def per_request_us(cls: type[HttpToolsProtocol], requests: int) -> float:
    config = Config(app, log_level="warning", http="httptools")
    config.load()
    proto = cls(config=config, server_state=ServerState(), app_state={})
    transport = StubTransport()
    proto.connection_made(transport)
    t0 = time.perf_counter()
    for _ in range(requests):
        proto.data_received(REQUEST)
        await asyncio.sleep(0)  # the request's task runs and answers
    elapsed = time.perf_counter() - t0
    assert not transport.closing and transport.written > requests * 50
    proto.connection_lost(None)
    return elapsed / requests * 1e6


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.edge_overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    edge = EdgeProtocol.bound(Edge(EdgeSettings(), GatewayMetrics()))
    rows: dict[str, list[float]] = {"uvicorn httptools": [], "edge": []}

    async def run() -> None:
        order = [("uvicorn httptools", HttpToolsProtocol), ("edge", edge)]
        for r in range(args.rounds):
            for name, cls in order if r % 2 == 0 else order[::-1]:  # A B B A: no order bias
                gc.collect()
                us = await per_request_us(cls, args.requests)
                rows[name].append(us)
                print(f"round {r + 1} {name:18s} {us:7.2f} us/request", flush=True)

    uvloop.run(run())
    base, mine = (statistics.median(rows[k]) for k in rows)
    fast = {k: min(v) for k, v in rows.items()}
    print(f"fastest rounds: uvicorn {fast['uvicorn httptools']:.2f} us, edge {fast['edge']:.2f} us")
    print(f"\nmedian of {args.rounds} rounds x {args.requests} keep-alive requests: uvicorn "
          f"{base:.2f} us, edge {mine:.2f} us, +{mine - base:.2f} us per request "
          f"({(mine - base) / 570 * 100:.2f}% of a ~570 us streamed request)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
