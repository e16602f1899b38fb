from __future__ import annotations

import pytest

from gateway.routing.backend import Backend
from gateway.routing.policy import LeastOutstanding, RouteRequest, make_policy

REQ = RouteRequest("m")


def backends(*outstanding: int) -> list[Backend]:
    out = []
    for i, n in enumerate(outstanding):
        b = Backend(f"http://b{i}:8000")
        b.outstanding = n
        out.append(b)
    return out


def test_picks_fewest_outstanding() -> None:
    bs = backends(3, 1, 2)
    assert LeastOutstanding().pick(bs, REQ) is bs[1]


def test_ties_rotate_so_sequential_requests_spread() -> None:
    bs = backends(0, 0, 0)
    p = LeastOutstanding()
    picks = [p.pick(bs, REQ) for _ in range(6)]
    assert {id(b) for b in picks} == {id(b) for b in bs}
    assert all(picks.count(b) == 2 for b in bs)


def test_empty_and_single() -> None:
    p = LeastOutstanding()
    assert p.pick([], REQ) is None
    (only,) = backends(5)
    assert p.pick([only], REQ) is only


def test_unknown_policy_names_the_setting() -> None:
    with pytest.raises(ValueError, match="GATEWAY_ROUTING_POLICY"):
        make_policy("random-ish")
