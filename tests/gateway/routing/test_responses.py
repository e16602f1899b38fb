"""Where stored responses live (gateway/routing/responses.py): the id read from an answer, the
bounded memory, and two gateway replicas sharing the map through a real Redis."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from gateway.routing.responses import KEY_PREFIX, ResponseHomes, response_id_of
from gateway.settings import FlowSettings, ResponsesSettings
from tests.redisserver import RedisServer

A, B = "http://10.0.0.1:8000", "http://10.0.0.2:8000"
RESPONSE = {"id": "resp_abc", "object": "response", "status": "completed", "output": []}


def test_the_id_of_a_whole_answer() -> None:
    assert response_id_of(orjson.dumps(RESPONSE)) == "resp_abc"


def test_the_id_of_a_stream_from_its_first_event() -> None:
    created = {"type": "response.created", "sequence_number": 0, "response": RESPONSE}
    first = b"event: response.created\ndata: " + orjson.dumps(created) + b"\n\n"
    assert response_id_of(first) == "resp_abc"
    # As vLLM frames it (no event line), and with a later event cut short after it.
    assert response_id_of(b"data: " + orjson.dumps(created) + b"\n\ndata: {\"ty") == "resp_abc"


@pytest.mark.parametrize("answer", [
    b"",
    b"not json",
    orjson.dumps({"error": {"message": "x", "code": 400}}),
    orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion"}),
    orjson.dumps([RESPONSE]),
    b"data: [DONE]\n\n",
    orjson.dumps({**RESPONSE, "id": ""}),
])
def test_answers_without_a_response_id(answer: bytes) -> None:
    assert response_id_of(answer) is None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_memory_forgets_the_least_recently_used_first_and_after_its_ttl() -> None:
    clock = Clock()
    homes = ResponseHomes(ResponsesSettings(max_entries=2, ttl_s=10), FlowSettings(),
                          clock=clock)
    assert not homes.shared
    await homes.remember("r1", A)
    await homes.remember("r2", B)
    assert await homes.home("r1") == A  # r1 used: r2 is now the oldest
    await homes.remember("r3", A)
    assert (await homes.home("r2"), await homes.home("r1"), len(homes)) == (None, A, 2)
    clock.now = 10.0
    assert await homes.home("r1") is None
    assert len(homes) == 1  # r3 goes when asked for, not before
    assert await homes.home("r3") is None and len(homes) == 0
    assert await homes.home("never") is None


def _shared(redis: RedisServer, ttl_s: float = 60) -> ResponseHomes:
    flow = FlowSettings(limits_redis_url=redis.url, limits_redis_retry_s=30)
    return ResponseHomes(ResponsesSettings(ttl_s=ttl_s), flow)


@pytest.mark.redis
async def test_two_gateway_replicas_share_the_map_through_redis(redis: RedisServer) -> None:
    one, two = _shared(redis), _shared(redis)
    try:
        assert one.shared and two.shared
        await one.remember("resp_1", A)
        assert await two.home("resp_1") == A
        assert await two.home("resp_2") is None
        # The entry expires in Redis too: vLLM's store is not forever either (an engine restart).
        short = _shared(redis, ttl_s=0.2)
        await short.remember("resp_3", B)
        assert await two.home("resp_3") == B
        await asyncio.sleep(0.3)
        assert await one.home("resp_3") is None
        await short.close()
    finally:
        await one.close()
        await two.close()


@pytest.mark.redis
async def test_a_redis_outage_leaves_each_replica_its_own_memory(
    redis: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    one, two = _shared(redis), _shared(redis)
    try:
        await one.remember("before", A)
        redis.stop()
        await one.remember("during", B)  # no exception: memory holds it
        assert await one.home("during") == B
        assert await one.home("before") == A
        assert await two.home("before") is None  # Redis was its only source
        warnings = [r for r in caplog.records if "Redis failed" in r.getMessage()]
        assert len(warnings) == 2  # once per replica and period, not per call
        assert await two.home("other") is None  # within the period: Redis not asked again
        assert len([r for r in caplog.records if "Redis failed" in r.getMessage()]) == 2
    finally:
        await one.close()
        await two.close()


@pytest.mark.redis
async def test_the_entry_is_a_plain_key_with_an_expiry(redis: RedisServer) -> None:
    """Operators can read the map with redis-cli: one key per response, its replica's URL."""
    import redis.asyncio as aioredis

    homes = _shared(redis, ttl_s=100)
    client = aioredis.from_url(redis.url)
    try:
        await homes.remember("resp_x", A)
        assert await client.get(KEY_PREFIX + "resp_x") == A.encode()
        assert 99_000 < await client.pttl(KEY_PREFIX + "resp_x") <= 100_000
    finally:
        await client.aclose()
        await homes.close()
