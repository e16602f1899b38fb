from __future__ import annotations

import pytest

from gateway.flow.limiter import AimdLimiter
from tests.gateway.flow.conftest import FakeClock


def make(clock: FakeClock, initial: int = 10) -> AimdLimiter:
    return AimdLimiter(initial=initial, floor=2, ceiling=20, target_s=1.0, backoff=0.9,
                       clock=clock)


def test_grows_with_the_headroom_while_the_limit_binds(clock: FakeClock) -> None:
    lim = make(clock)
    for _ in range(4):
        lim.on_sample(0.2, clock(), in_flight=10)  # 80% headroom: +0.2 per sample
    assert lim.limit == 10
    lim.on_sample(0.2, clock(), in_flight=10)
    assert lim.limit == 11
    near = make(clock)
    for _ in range(9):
        near.on_sample(0.99, clock(), in_flight=10)  # at the target: +1 per `limit` samples
    assert near.limit == 10
    for _ in range(2):
        near.on_sample(0.99, clock(), in_flight=10)
    assert near.limit == 11
    for _ in range(500):
        lim.on_sample(0.2, clock(), in_flight=lim.limit)
    assert lim.limit == 20  # ceiling


def test_no_growth_when_idle(clock: FakeClock) -> None:
    lim = make(clock)
    for _ in range(100):
        lim.on_sample(0.2, clock(), in_flight=1)
    assert lim.limit == 10


def test_cuts_by_overshoot_once_per_round_trip(clock: FakeClock) -> None:
    lim = make(clock)
    before = clock()
    clock.advance(0.1)
    lim.on_sample(1.25, before, in_flight=10)  # 25% over target: x0.8
    assert lim.limit == 8
    # Requests dispatched before the cut report the old limit's latency: ignored.
    lim.on_sample(5.0, before, in_flight=10)
    assert lim.limit == 8
    clock.advance(0.1)
    lim.on_sample(10.0, clock(), in_flight=8)  # 10x over: never more than halved
    assert lim.limit == 4
    for _ in range(10):
        clock.advance(1)
        lim.on_sample(10.0, clock(), in_flight=8)
    assert lim.limit == 2  # floor


def test_engine_pressure_backs_off_at_most_once_per_target(clock: FakeClock) -> None:
    lim = make(clock, initial=20)
    lim.on_pressure()
    lim.on_pressure()
    assert lim.limit == 18
    clock.advance(1.0)
    lim.on_pressure()
    assert lim.limit == 16


def test_rejects_inconsistent_bounds() -> None:
    with pytest.raises(ValueError):
        AimdLimiter(initial=1, floor=2, ceiling=3, target_s=1.0)
