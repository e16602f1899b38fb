"""Static discovery: the `--backend` / GATEWAY_BACKENDS list, fixed for the process lifetime."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterable


class Static:
    def __init__(self, urls: Iterable[str]) -> None:
        self._urls = frozenset(u.rstrip("/") for u in urls)

    async def updates(self) -> AsyncGenerator[frozenset[str], None]:
        yield self._urls
        await asyncio.Event().wait()  # never changes; the consumer cancels us
