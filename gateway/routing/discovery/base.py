"""The one thing the router asks of a discovery source."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol


class Discovery(Protocol):
    def updates(self) -> AsyncIterator[frozenset[str]]:
        """Yield the full set of backend base URLs (no trailing slash): first the initial set,
        then the whole set again on every change. Each call starts an independent stream."""
        ...


class DiscoveryError(Exception):
    """A discovery source cannot work as configured (raised at start-up); the message names the
    setting to fix, and the CLI prints it on one line."""
