"""Per-key limits shared by every gateway replica, kept in Redis.

Without it N replicas give a tenant N times its limit. With `GATEWAY_FLOW__LIMITS_REDIS_URL`, a
key's two token buckets live in Redis: one Lua script call per request of a limited key, on
Redis's own clock; tokens are debited afterwards without waiting. When Redis fails,
`limits_redis_fail` decides (`open` admits, `closed` answers 503), and Redis is not asked again
for `limits_redis_retry_s`: an outage costs one timeout per period, not one per request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from gateway.flow.buckets import Refusal
from gateway.metrics import GatewayMetrics
from gateway.settings import FlowSettings
from gateway.shared_redis import REDIS_ERRORS, Outage, connect

log = logging.getLogger("llmserve.gateway.limits")

# The token buckets of buckets.py. KEYS: the requests and tokens buckets; ARGV: op, rpm, tpm, n.
# admit: the tokens bucket above zero, then take a request; refund: give one back; debit: take n
# tokens. Returns the wait as a string (Lua numbers would leave as integers): "0" admits, else
# prefixed "rpm:" or "tpm:".
_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local op = ARGV[1]
local function touch(key, per_minute)
  local rate = per_minute / 60.0
  local b = redis.call('HMGET', key, 'level', 'ts')
  local level = tonumber(b[1]) or per_minute
  local ts = tonumber(b[2]) or now
  if now > ts then level = math.min(per_minute, level + (now - ts) * rate) end
  return level, rate
end
local function store(key, level, per_minute)
  redis.call('HSET', key, 'level', tostring(level), 'ts', tostring(now))
  redis.call('EXPIRE', key, 120)
end
local rpm, tpm, n = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if op == 'admit' then
  if tpm > 0 then
    local level, rate = touch(KEYS[2], tpm)
    store(KEYS[2], level, tpm)
    if level <= 0 then return 'tpm:' .. tostring((1e-6 - level) / rate) end
  end
  if rpm > 0 then
    local level, rate = touch(KEYS[1], rpm)
    if level < 1 then
      store(KEYS[1], level, rpm)
      return 'rpm:' .. tostring((1 - level) / rate)
    end
    store(KEYS[1], level - 1, rpm)
  end
  return '0'
elseif op == 'refund' then
  local level = touch(KEYS[1], rpm)
  store(KEYS[1], math.min(rpm, level + 1), rpm)
elseif op == 'debit' then
  local level = touch(KEYS[2], tpm)
  store(KEYS[2], level - n, tpm)
end
return '0'
"""


class SharedLimits:
    """One Redis connection pool and script for every key of this gateway replica."""

    def __init__(self, settings: FlowSettings, metrics: GatewayMetrics) -> None:
        assert settings.limits_redis_url is not None
        self._redis: Any = connect(settings.limits_redis_url, settings.limits_redis_timeout_s)
        self._script = self._redis.register_script(_SCRIPT)
        self._fail_closed = settings.limits_redis_fail == "closed"
        self._retry_s = settings.limits_redis_retry_s
        self._outage = Outage(log, "shared limits", self._retry_s,
                              metrics.shared_limit_errors.inc)
        self._fallback = "failing " + ("closed" if self._fail_closed else "open")
        # Debits run in the background; keep references so they are not collected mid-flight.
        self._pending: set[asyncio.Task[object]] = set()

    async def close(self) -> None:
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)
        await self._redis.aclose()

    async def _call(self, tenant: str, op: str, rpm: float, tpm: float, n: float) -> str | None:
        if self._outage.down:
            return None
        keys = [f"llmserve:limits:{{{tenant}}}:rpm", f"llmserve:limits:{{{tenant}}}:tpm"]
        try:
            out = await self._script(keys=keys, args=[op, rpm, tpm, n])
        except REDIS_ERRORS as exc:
            self._outage.failed(exc, self._fallback)
            return None
        return out.decode() if isinstance(out, bytes) else str(out)

    async def admit(self, tenant: str, rpm: float | None, tpm: float | None) -> Refusal | None:
        """Charge one request to the tenant's shared buckets, or say which refuses and how long.

        `None` admits. On a Redis failure: `None` when failing open; a refusal with reason
        "unavailable" when failing closed."""
        out = await self._call(tenant, "admit", rpm or 0, tpm or 0, 1)
        if out is None:
            return Refusal("unavailable", self._retry_s) if self._fail_closed else None
        if out == "0":
            return None
        reason, _, wait = out.partition(":")
        return Refusal(reason, max(float(wait), 0.0))

    def refund(self, tenant: str, rpm: float | None) -> None:
        if rpm:
            self._background(self._call(tenant, "refund", rpm, 0, 1))

    def debit(self, tenant: str, tpm: float | None, tokens: int) -> None:
        if tpm and tokens > 0:
            self._background(self._call(tenant, "debit", 0, tpm, tokens))

    def _background(self, call: Coroutine[Any, Any, object]) -> None:
        task = asyncio.get_running_loop().create_task(call)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
