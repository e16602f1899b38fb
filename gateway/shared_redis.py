"""The gateway's one way to use the Redis its replicas share (GATEWAY_FLOW__LIMITS_REDIS_URL):
per-key limits (flow/shared_limits.py) and where stored responses live (routing/responses.py).

Each user gets an asyncio connection pool with short timeouts and no retry on a timeout, and an
`Outage`: after a failure, Redis is not asked again for a while, so an outage costs one timeout
per period, not one per request; the user decides what a request gets meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from time import monotonic
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

# What a failed Redis call raises: its own errors, a timeout, a refused or reset connection.
REDIS_ERRORS = (TimeoutError, RedisError, OSError)


def connect(url: str, timeout_s: float) -> Any:
    """A client (with its connection pool) for `url`; nothing is connected before the first
    call. `Any`: redis-py's asyncio client is not typed for mypy --strict."""
    return aioredis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                             retry_on_timeout=False)


class Outage:
    """After a failure, `down` is true for `retry_s`: the caller skips Redis meanwhile. Each
    failure calls `on_error` (a metric) and, once per period, logs what failed and the fallback."""

    def __init__(self, log: logging.Logger, what: str, retry_s: float,
                 on_error: Callable[[], None] = lambda: None) -> None:
        self._log = log
        self._what = what
        self._retry_s = retry_s
        self._on_error = on_error
        self._down_until = 0.0

    @property
    def down(self) -> bool:
        return monotonic() < self._down_until

    def failed(self, exc: BaseException, fallback: str) -> None:
        self._on_error()
        if not self.down:
            self._log.warning("%s: Redis failed (%s); %s for %.0fs", self._what,
                              type(exc).__name__, fallback, self._retry_s)
        self._down_until = monotonic() + self._retry_s
