"""A lean load client for streamed completions (raw asyncio streams on uvloop).

Deliberately not aiohttp/httpx: the client shares a core with the fake upstream, and whatever it
spends is taken from the measurement's headroom. Each connection is HTTP/1.1 keep-alive; a
response is done when the chunked terminator arrives.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

_TERM = b"\r\n0\r\n\r\n"


def build_request(url: str, model: str, tokens: int, path: str = "/v1/chat/completions",
                  headers: dict[str, str] | None = None, prompt: str = "hi") -> bytes:
    """One streamed chat completion of `tokens` tokens, as raw HTTP/1.1 bytes."""
    u = urlparse(url)
    body = json.dumps({
        "model": model, "stream": True, "max_tokens": tokens,
        "messages": [{"role": "user", "content": prompt}],
    }).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    return (f"POST {path} HTTP/1.1\r\nhost: {u.hostname}:{u.port}\r\n{extra}"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
            ).encode() + body


def pct(values: list[float], q: float) -> float:
    """The `q` quantile of `values` (nearest rank), NaN when there are none."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


class Conn:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.r: asyncio.StreamReader | None = None
        self.w: asyncio.StreamWriter | None = None

    async def request(self, raw: bytes, ttft: list[float] | None = None) -> bool:
        """Send one streamed request and read it to the end; True if it was a whole 200 stream."""
        if self.w is None:
            self.r, self.w = await asyncio.open_connection(self.host, self.port)
        assert self.r is not None
        t0 = time.perf_counter()
        self.w.write(raw)
        buf = b""
        while b"\r\n\r\n" not in buf:
            data = await self.r.read(65536)
            if not data:
                raise ConnectionError("closed before the response head")
            buf += data
        head, _, buf = buf.partition(b"\r\n\r\n")
        ok = head.startswith(b"HTTP/1.1 200")
        if b"content-length:" in head.lower():
            n = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            while len(buf) < n:
                buf += await self.r.read(65536)
            return False
        seen_data = False
        while True:
            if not seen_data and b"data:" in buf:
                seen_data = True
                if ttft is not None:
                    ttft.append(time.perf_counter() - t0)
            if buf.endswith(_TERM) or buf == b"0\r\n\r\n":
                return ok and b"[DONE]" in buf
            data = await self.r.read(65536)
            if not data:
                raise ConnectionError("closed mid-stream")
            # Keep only a tail: enough to spot the terminator and [DONE] across reads.
            buf = buf[-64:] + data if seen_data else buf + data

    def close(self) -> None:
        if self.w is not None:
            self.w.close()
            self.w = None


@dataclass
class Result:
    ok: int = 0
    errors: int = 0
    seconds: float = 0.0
    ttft: list[float] = field(default_factory=list)

    @property
    def rps(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    def pct(self, q: float) -> float:
        return pct(self.ttft, q)

    @property
    def p50(self) -> float:
        return statistics.median(self.ttft) if self.ttft else float("nan")


async def throughput(url: str, model: str, tokens: int, concurrency: int, duration_s: float,
                     headers: dict[str, str] | None = None, prompt: str = "hi") -> Result:
    """Whole streams per second with `concurrency` keep-alive connections in a closed loop."""
    u = urlparse(url)
    raw = build_request(url, model, tokens, headers=headers, prompt=prompt)
    res = Result()
    # Warm up the connections (and the server's pools) before the clock starts.
    conns = [Conn(u.hostname or "127.0.0.1", u.port or 80) for _ in range(concurrency)]
    await asyncio.gather(*(c.request(raw) for c in conns))
    stop = time.perf_counter() + duration_s

    async def loop(c: Conn) -> None:
        while time.perf_counter() < stop:
            try:
                if await c.request(raw):
                    res.ok += 1
                else:
                    res.errors += 1
            except (ConnectionError, OSError):
                res.errors += 1
                c.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(loop(c) for c in conns))
    res.seconds = time.perf_counter() - t0
    for c in conns:
        c.close()
    return res


async def latency(url: str, model: str, tokens: int, count: int,
                  headers: dict[str, str] | None = None, prompt: str = "hi") -> Result:
    """TTFT of `count` streamed requests one after another on one keep-alive connection."""
    u = urlparse(url)
    raw = build_request(url, model, tokens, headers=headers, prompt=prompt)
    c = Conn(u.hostname or "127.0.0.1", u.port or 80)
    res = Result()
    for _ in range(20):
        await c.request(raw)
    t0 = time.perf_counter()
    for _ in range(count):
        if await c.request(raw, res.ttft):
            res.ok += 1
        else:
            res.errors += 1
    res.seconds = time.perf_counter() - t0
    c.close()
    return res
