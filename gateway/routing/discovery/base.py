from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol


class Discovery(Protocol):
    def updates(self) -> AsyncIterator[frozenset[str]]:
        """Yield the full set of backend base URLs, first at once, then on every change."""
        ...
