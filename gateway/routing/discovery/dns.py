"""DNS discovery: a headless Service's A records (one per ready pod), re-resolved periodically:
scale-ups, rollouts and crashes followed without any Kubernetes permissions.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncGenerator, Awaitable, Callable

log = logging.getLogger("gateway.discovery.dns")

Resolver = Callable[[str], Awaitable[list[str]]]


async def resolve_a(name: str) -> list[str]:
    """IPv4 addresses of `name` through the system resolver (the loop's getaddrinfo)."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        name, None, family=socket.AF_INET, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


class Dns:
    def __init__(
        self, name: str, port: int, interval_s: float, resolver: Resolver = resolve_a
    ) -> None:
        self._name = name
        self._port = port
        self._interval_s = interval_s
        self._resolve = resolver

    async def updates(self) -> AsyncGenerator[frozenset[str], None]:
        last: frozenset[str] | None = None
        while True:
            try:
                addrs = await self._resolve(self._name)
                current = frozenset(f"http://{a}:{self._port}" for a in addrs)
            except OSError as exc:
                # A failed lookup is not "no backends": keep routing to the last known set.
                log.warning("resolving %s failed: %s", self._name, exc)
                current = last if last is not None else frozenset()
            if current != last:
                last = current
                yield current
            await asyncio.sleep(self._interval_s)
