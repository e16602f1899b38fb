"""The Responses API's stored state through the gateway (api/responses.py): every request about a
stored response reaches the replica that made it, through one gateway or two sharing Redis."""

from __future__ import annotations

import pytest

from bench.fake_upstream import FakeUpstream
from gateway.routing.responses import KEY_PREFIX
from tests import loopback
from tests.gateway.conftest import UpstreamFactory, create_response, run_gateway, url_of
from tests.openai_error import openai_error
from tests.redisserver import RedisServer

# Round robin: without the pin, requests about a response would alternate between the replicas.
# One probe at start only, so an upstream's request count is the requests routed to it.
POLICY = {"routing_policy": "round_robin", "health_interval_s": 60,
          "flow": {"scrape_engines": False}}


def _served(ups: list[FakeUpstream], before: list[int]) -> list[int]:
    return [u.requests - b for u, b in zip(ups, before, strict=True)]


def _home(rid: str, ups: list[FakeUpstream]) -> FakeUpstream:
    return next(u for u in ups if rid.startswith(f"resp_{u.port}_"))


@pytest.mark.parametrize("stream", [False, True])
def test_requests_about_a_response_reach_its_replica(upstreams: UpstreamFactory,
                                                     stream: bool) -> None:
    ups = [upstreams(echo_other=True), upstreams(echo_other=True)]
    with run_gateway(backends=[url_of(u) for u in ups], **POLICY) as gw:
        for _ in range(2):  # one response made on each replica
            rid = create_response(gw.url, stream)
            home = _home(rid, ups)
            before = [u.requests for u in ups]
            for _ in range(3):
                assert loopback.get(f"{gw.url}/v1/responses/{rid}").status_code == 200
                assert loopback.post(f"{gw.url}/v1/responses/{rid}/cancel").status_code == 200
                nxt = loopback.post(gw.url + "/v1/responses", json={
                    "model": "demo", "input": "y", "previous_response_id": rid})
                assert nxt.status_code == 200
            served = _served(ups, before)
            assert served[ups.index(home)] == 9 and sum(served) == 9, served


def test_an_unknown_id_is_routed_as_usual(upstreams: UpstreamFactory) -> None:
    """Not known to the gateway (made before it ran): the engine answers for it, wherever."""
    ups = [upstreams(echo_other=True), upstreams(echo_other=True)]
    with run_gateway(backends=[url_of(u) for u in ups], **POLICY) as gw:
        before = [u.requests for u in ups]
        for _ in range(6):
            r = loopback.get(gw.url + "/v1/responses/resp_unknown")
            assert r.status_code == 200 and r.json()["path"] == "/v1/responses/resp_unknown"
        assert _served(ups, before) == [3, 3]  # spread, not pinned


@pytest.mark.redis
def test_two_gateways_sharing_redis_pin_each_others_responses(
    upstreams: UpstreamFactory, redis: RedisServer
) -> None:
    ups = [upstreams(echo_other=True), upstreams(echo_other=True)]
    backends = [url_of(u) for u in ups]
    shared = {**POLICY, "flow": {"scrape_engines": False, "limits_redis_url": redis.url}}
    with run_gateway(backends=backends, **shared) as one, \
            run_gateway(backends=backends, **shared) as two:
        for _ in range(2):
            rid = create_response(one.url)
            home = _home(rid, ups)
            before = [u.requests for u in ups]
            for _ in range(4):
                r = loopback.post(two.url + "/v1/responses", json={
                    "model": "demo", "input": "y", "previous_response_id": rid})
                assert r.status_code == 200
            assert _served(ups, before)[ups.index(home)] == 4


@pytest.mark.redis
def test_a_response_whose_replica_is_gone_is_a_plain_404(
    upstreams: UpstreamFactory, redis: RedisServer
) -> None:
    """Another gateway replica saw the response on a replica since removed (its URL no backend
    now): OpenAI's 404, naming the id and why, not a hop to a replica that never had it."""
    import redis as sync_redis

    up = upstreams(echo_other=True)
    client = sync_redis.Redis.from_url(redis.url)
    client.set(KEY_PREFIX + "resp_gone", "http://10.9.9.9:8000")
    client.close()
    shared = {**POLICY, "flow": {"scrape_engines": False, "limits_redis_url": redis.url}}
    with run_gateway(backends=[url_of(up)], **shared) as gw:
        before = up.requests
        for r, param in [
            (loopback.get(gw.url + "/v1/responses/resp_gone"), "response_id"),
            (loopback.post(gw.url + "/v1/responses/resp_gone/cancel"), "response_id"),
            (loopback.post(gw.url + "/v1/responses", json={
                "model": "demo", "input": "y", "previous_response_id": "resp_gone"}),
             "previous_response_id"),
        ]:
            assert r.status_code == 404
            err = openai_error(r.content)
            assert err["message"].startswith("Response with id 'resp_gone' not found: the "
                                             "replica that stored it is gone")
            assert (err["type"], err["param"]) == ("invalid_request_error", param)
        assert up.requests == before  # no request reached it
