from __future__ import annotations

import pytest

from gateway.flow.limiter import AimdLimiter
from tests.gateway.flow.conftest import FakeClock


def make(clock: FakeClock, initial: int = 10) -> AimdLimiter:
    return AimdLimiter(initial=initial, floor=2, ceiling=20, target_s=1.0, backoff=0.9,
                       clock=clock)


def test_grows_with_the_headroom_while_the_limit_binds(clock: FakeClock) -> None:
    lim = make(clock)
    lim.on_pressure()  # a decrease ends slow start: 10 -> 9
    assert lim.limit == 9
    for _ in range(4):
        lim.on_sample(0.2, clock(), in_flight=9)  # 80% headroom: +0.2 per sample
    assert lim.limit == 9
    lim.on_sample(0.2, clock(), in_flight=9)
    assert lim.limit == 10
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


def test_slow_start_doubles_per_window_until_the_first_decrease(clock: FakeClock) -> None:
    lim = AimdLimiter(initial=32, floor=2, ceiling=1024, target_s=3.0, clock=clock)
    # Engines answer at 0.1 s against a 3 s target: every sample of a full window adds a slot.
    for window in range(4):
        for _ in range(lim.limit):
            lim.on_sample(0.1, clock(), in_flight=lim.limit)
        assert lim.limit == 32 * 2 ** (window + 1)
    # Near the target it is additive again (no whole slot per sample).
    lim.on_sample(2.0, clock(), in_flight=lim.limit)
    assert lim.limit == 512
    # The first miss ends slow start for good: far-below-target samples then grow additively.
    clock.advance(1)
    lim.on_sample(6.0, clock(), in_flight=512)
    assert lim.limit == 256
    for _ in range(10):
        lim.on_sample(0.1, clock(), in_flight=256)
    assert lim.limit == 258  # +0.24 per sample, not +10


def test_idle_pool_decays_toward_its_start_and_slow_starts_again(clock: FakeClock) -> None:
    lim = AimdLimiter(initial=32, floor=2, ceiling=1024, target_s=3.0, clock=clock)
    for _ in range(200):
        lim.on_sample(0.1, clock(), in_flight=lim.limit)
    clock.advance(1)
    lim.on_sample(6.0, clock(), in_flight=lim.limit)  # slow start over
    high = lim.limit
    assert high > 100
    lim.on_idle(29.0)  # under 10 targets (30 s): not idle
    assert lim.limit == high
    lim.on_idle(65.0)  # two idle spells: a quarter, not below the start
    assert lim.limit == max(32, high // 4)
    lim.on_idle(10_000.0)
    assert lim.limit == 32
    before = lim.limit
    for _ in range(before):
        lim.on_sample(0.1, clock(), in_flight=lim.limit)
    assert lim.limit == 2 * before  # slow start again
    low = AimdLimiter(initial=32, floor=2, ceiling=1024, target_s=3.0, clock=clock)
    low.on_pressure()
    low.on_idle(1000.0)
    assert low.limit == 28  # below its start: idleness does not raise it


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


def test_whole_answers_are_judged_per_token_against_their_own_best(clock: FakeClock) -> None:
    """The non-streamed class has no TTFT: at its best pace per token (whatever the length) it
    grows the limit like a fast stream would; at 3x that pace it cuts it."""
    lim = AimdLimiter(initial=8, floor=2, ceiling=1024, target_s=3.0, clock=clock)
    for window in range(3):
        for i in range(lim.limit):
            tokens = 10 if i % 2 else 200  # short and long answers, 20 ms per token each
            lim.on_whole_sample(0.02 * (tokens + 1), tokens, clock(), in_flight=lim.limit)
        assert lim.limit == 8 * 2 ** (window + 1)  # slow start: far below the target
    high = lim.limit
    clock.advance(1)
    lim.on_whole_sample(0.06 * 101, 100, clock(), in_flight=high)  # 3x slower per token
    assert lim.limit == high // 2
    clock.advance(10)
    lim.on_whole_sample(0.03 * 101, 100, clock(), in_flight=lim.limit)  # 1.5x: within tolerance
    assert lim.limit >= high // 2


def test_streamed_and_whole_answers_share_one_limit(clock: FakeClock) -> None:
    lim = make(clock)
    lim.on_whole_sample(0.02 * 11, 10, clock(), in_flight=10)
    lim.on_sample(0.1, clock(), in_flight=10)
    assert lim.limit == 12  # one slot from each class (slow start)


def test_whole_answers_faster_than_an_engine_decodes_are_no_signal(clock: FakeClock) -> None:
    """A near-free upstream answers in microseconds per token; a busy gateway core then adds a few
    ms. Against a best of 0.1 ms that read as a 30x miss and cut the limit (503s from a healthy
    upstream); below MIN_BEST_PER_TOKEN_S it is jitter, not load."""
    lim = AimdLimiter(initial=8, floor=2, ceiling=1024, target_s=3.0, clock=clock)
    lim.on_whole_sample(0.0001 * 11, 10, clock(), in_flight=8)
    before = lim.limit
    clock.advance(1)
    lim.on_whole_sample(0.003 * 11, 10, clock(), in_flight=before)  # 3 ms a token: still fast
    assert lim.limit >= before
    clock.advance(1)
    lim.on_whole_sample(0.015 * 11, 10, clock(), in_flight=lim.limit)  # 3x the 5 ms floor: a miss
    assert lim.limit < before


def test_growth_rate_is_slow_starts_pace_and_only_its(clock: FakeClock) -> None:
    lim = AimdLimiter(initial=32, floor=2, ceiling=1024, target_s=3.0, clock=clock)
    assert lim.growth_rate(32) == 0.0  # no sample yet: nothing known about the engines' pace
    for _ in range(5):
        lim.on_sample(0.1, clock(), in_flight=32)
    # Each of the 32 in flight adds a slot when its first token comes, ~0.1 s from now.
    assert lim.growth_rate(32) == pytest.approx(320.0)
    # Samples near the target add no whole slot: no slow-start growth to count on.
    lim.on_sample(2.0, clock(), in_flight=lim.limit)
    assert lim.growth_rate(32) == 0.0
    lim.on_sample(0.1, clock(), in_flight=lim.limit)
    assert lim.growth_rate(32) > 0.0
    # A pause forgets the pace: the next burst is judged as a cold start.
    lim.on_idle(10_000.0)
    assert lim.growth_rate(32) == 0.0
    # Once slow start is over (a miss), growth is additive: nothing to count on either.
    for _ in range(5):
        lim.on_sample(0.1, clock(), in_flight=lim.limit)
    clock.advance(1)
    lim.on_sample(6.0, clock(), in_flight=lim.limit)
    lim.on_sample(0.1, clock(), in_flight=lim.limit)
    assert lim.growth_rate(lim.limit) == 0.0


def test_growth_rate_of_whole_answers_runs_at_their_own_latency(clock: FakeClock) -> None:
    lim = AimdLimiter(initial=32, floor=2, ceiling=1024, target_s=3.0, clock=clock)
    for _ in range(3):
        # 2 s for 100 tokens, always the best seen: no latency on the streamed scale, so slow
        # start adds a slot per answer, and an answer comes back every 2 s per slot.
        lim.on_whole_sample(2.0, 100, clock(), in_flight=lim.limit)
    assert lim.growth_rate(30) == pytest.approx(15.0)


def test_a_new_ceiling_clamps_at_once_and_a_higher_one_lets_it_grow(clock: FakeClock) -> None:
    lim = make(clock)  # floor 2, ceiling 20
    for _ in range(100):
        lim.on_sample(0.1, clock(), in_flight=lim.limit)
    assert lim.limit == 20
    lim.set_ceiling(12)
    assert (lim.ceiling, lim.limit) == (12, 12)
    lim.set_ceiling(40)
    assert lim.limit == 12  # room, not slots: it grows into it on good samples
    for _ in range(100):
        lim.on_sample(0.1, clock(), in_flight=lim.limit)
    assert lim.limit == 40
    lim.set_ceiling(1)
    assert (lim.ceiling, lim.limit) == (2, 2)  # never below the floor
