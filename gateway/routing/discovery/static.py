from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable


class StaticDiscovery:
    def __init__(self, urls: Iterable[str]) -> None:
        self._urls = frozenset(u.rstrip("/") for u in urls)

    async def updates(self) -> AsyncIterator[frozenset[str]]:
        yield self._urls
        await asyncio.Event().wait()  # a static list never changes
