from __future__ import annotations

from collections import Counter

from gateway.routing.backend import Backend
from gateway.routing.policy import LeastOutstanding, RouteRequest

REQ = RouteRequest("m")


def backends(*outstanding: int) -> list[Backend]:
    out = []
    for i, n in enumerate(outstanding):
        b = Backend(f"http://b{i}:8000")
        for _ in range(n):
            b.outstanding += 1
        out.append(b)
    return out


def test_picks_fewest_outstanding() -> None:
    bs = backends(3, 1, 2)
    p = LeastOutstanding()
    # Whatever the rotation, the least loaded wins every time.
    assert all(p.pick(bs, REQ) is bs[1] for _ in range(6))


def test_ties_rotate_so_sequential_requests_spread() -> None:
    bs = backends(0, 0, 0)
    p = LeastOutstanding()
    counts = Counter(p.pick(bs, REQ) for _ in range(6))
    assert counts == {bs[0]: 2, bs[1]: 2, bs[2]: 2}


def test_sequential_requests_at_concurrency_one_spread() -> None:
    # acquire/pick/release in a loop: every replica is at 0 each time, yet all take turns.
    bs = backends(0, 0)
    p = LeastOutstanding()
    seen = []
    for _ in range(4):
        b = p.pick(bs, REQ)
        assert b is not None
        b.outstanding += 1
        seen.append(b.url)
        b.outstanding -= 1
    assert seen.count(bs[0].url) == 2 and seen.count(bs[1].url) == 2


def test_only_the_least_loaded_share_the_rotation() -> None:
    bs = backends(0, 4, 0)
    p = LeastOutstanding()
    counts = Counter(p.pick(bs, REQ) for _ in range(10))
    assert counts == {bs[0]: 5, bs[2]: 5}


def test_candidates_are_what_the_router_passes() -> None:
    # Exclusion is the router's job (see test_router): the policy sees only what it is given.
    bs = backends(0, 0, 0)
    p = LeastOutstanding()
    assert {p.pick(bs[1:], REQ) for _ in range(4)} == {bs[1], bs[2]}


def test_empty_and_single() -> None:
    p = LeastOutstanding()
    assert p.pick([], REQ) is None
    (only,) = backends(5)
    assert p.pick([only], REQ) is only
