"""Per-key limits across gateway replicas: two real gateway processes share one tenant's RPM
through a real Redis (redis-server on loopback), and keep serving when Redis dies, failing open
or closed as configured. Without Redis each replica enforces 1/N of the limit."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.flow.keys import ApiKey
from gateway.flow.tenants import Tenants
from gateway.metrics import GatewayMetrics
from gateway.settings import FlowSettings
from tests import loopback
from tests.gateway.conftest import UpstreamFactory, spawned_gateway, url_of, write_keys
from tests.openai_error import openai_error
from tests.redisserver import RedisServer

REPO = Path(__file__).resolve().parents[3]
BODY = {"model": "demo", "prompt": "hi", "max_tokens": 2}
KEY = "sk-shared"
RPM = 120


def _keys_file(tmp_path: Path) -> Path:
    return write_keys(tmp_path, {KEY: {"tenant": "acme", "rpm": RPM}})


@contextlib.contextmanager
def gateway_process(backend: str, keys: Path, **flow: str) -> Iterator[str]:
    """`python -m gateway` as its own process, configured through GATEWAY_* only."""
    env = {"GATEWAY_BACKENDS": json.dumps([backend]), "GATEWAY_API_KEYS_FILE": str(keys),
           "GATEWAY_HEALTH_INTERVAL_S": "0.2", "GATEWAY_FLOW__SCRAPE_ENGINES": "false",
           **{f"GATEWAY_FLOW__{k.upper()}": v for k, v in flow.items()}}
    with spawned_gateway(env=env) as (_, url):
        yield url


async def _burst(urls: list[str], n: int) -> tuple[list[int], list[int], float]:
    """`n` requests spread round-robin over `urls`, 8 at a time; statuses per gateway."""
    statuses: list[list[int]] = [[] for _ in urls]
    sem = asyncio.Semaphore(8)
    headers = {"Authorization": f"Bearer {KEY}"}
    async with loopback.async_client(timeout=10) as client:

        async def one(i: int) -> None:
            async with sem:
                r = await client.post(urls[i % len(urls)] + "/v1/completions", json=BODY,
                                      headers=headers)
                statuses[i % len(urls)].append(r.status_code)

        started = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(n)))
        elapsed = time.monotonic() - started
    other = sorted(c for s in statuses for c in s if c not in (200, 429))
    assert not other, f"statuses other than 200 and 429: {other}"
    return ([s.count(200) for s in statuses], [s.count(429) for s in statuses], elapsed)


@pytest.mark.redis
async def test_two_gateways_share_one_tenants_rpm(
    upstreams: UpstreamFactory, redis: RedisServer, tmp_path: Path
) -> None:
    up = upstreams()
    keys = _keys_file(tmp_path)
    with gateway_process(url_of(up), keys, limits_redis_url=redis.url) as a, \
            gateway_process(url_of(up), keys, limits_redis_url=redis.url) as b:
        admitted, refused, elapsed = await _burst([a, b], 3 * RPM)
    total = sum(admitted)
    # One bucket for both: its capacity (a minute's allowance) plus what refilled meanwhile.
    allowed = RPM + RPM / 60 * elapsed
    assert RPM <= total <= allowed * 1.05, (admitted, refused, elapsed)
    # Both replicas charged it and both refused: neither had a bucket of its own.
    assert all(n > 0 for n in admitted) and all(n > 0 for n in refused)
    assert sum(admitted) + sum(refused) == 3 * RPM

    # The control, in the same run: without Redis each replica has its own bucket.
    with gateway_process(url_of(up), keys) as a, gateway_process(url_of(up), keys) as b:
        alone, _, _ = await _burst([a, b], 3 * RPM)
    assert sum(alone) >= 2 * RPM
    print(f"shared: admitted {admitted} refused {refused} in {elapsed:.2f}s "
          f"(bucket allows {allowed:.1f}); without Redis: admitted {alone}")


@pytest.mark.redis
@pytest.mark.parametrize("mode", ["open", "closed"])
async def test_gateway_keeps_serving_when_redis_dies(
    upstreams: UpstreamFactory, redis: RedisServer, tmp_path: Path, mode: str
) -> None:
    up = upstreams()
    keys = _keys_file(tmp_path)
    headers = {"Authorization": f"Bearer {KEY}"}
    with gateway_process(url_of(up), keys, limits_redis_url=redis.url,
                         limits_redis_fail=mode) as url:
        async with loopback.async_client(base_url=url, timeout=10) as client:
            assert (await client.post("/v1/completions", json=BODY, headers=headers)).is_success
            redis.stop()
            answers = [await client.post("/v1/completions", json=BODY, headers=headers)
                       for _ in range(10)]
            metrics = (await client.get("/metrics")).text
            # Endpoints without per-key charges are unaffected either way.
            assert (await client.get("/v1/models", headers=headers)).status_code == 200
    if mode == "open":
        assert [r.status_code for r in answers] == [200] * 10
    else:
        for r in answers:
            assert r.status_code == 503, r.text
            assert openai_error(r.content)["code"] == "rate_limits_unavailable"
            assert int(r.headers["retry-after"]) >= 1
    errors = [line for line in metrics.splitlines()
              if line.startswith("llmserve_shared_limits_errors_total ")]
    assert errors and float(errors[0].split()[1]) >= 1


def test_without_redis_each_replica_enforces_its_share() -> None:
    key = ApiKey("acme", b"\0" * 32, rpm=RPM, tpm=6000)
    tenant = Tenants(GatewayMetrics(), "normal", replicas=4).for_key(key)
    assert tenant.limits.requests is not None and tenant.limits.tokens is not None
    assert tenant.limits.requests.capacity == RPM / 4
    assert tenant.limits.tokens.capacity == 6000 / 4
    admitted = 0
    while tenant.limits.admit() is None:
        admitted += 1
    assert admitted == RPM // 4


@pytest.mark.parametrize(
    ("values", "fragment"),
    [
        ({"limits_redis_url": "redis://r:6379/0", "limit_replicas": 3}, "set one of the two"),
        ({"limits_redis_url": "http://r:6379"}, "limits_redis_url must be a redis://"),
        ({"limits_redis_fail": "maybe"}, "limits_redis_fail"),
        ({"limit_replicas": 0}, "limit_replicas"),
    ],
)
def test_settings_refuse_inconsistent_shared_limits(values: dict[str, object],
                                                    fragment: str) -> None:
    with pytest.raises(ValidationError) as err:
        FlowSettings.model_validate(values)
    assert fragment in str(err.value)
