from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.flow.limiter import AimdLimiter
from gateway.settings import FlowSettings
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


def test_slow_start_doubles_per_round_trip_until_the_first_decrease(clock: FakeClock) -> None:
    lim = AimdLimiter(initial=32, floor=2, ceiling=4096, target_s=3.0, clock=clock)
    # Streams keep their slots after the first token: each round trip only the requests sent in
    # the last one answer, and each adds two slots, so what is sent doubles every round trip.
    sent = 32
    for _ in range(4):
        before = lim.limit
        for _ in range(sent):
            lim.on_sample(0.1, clock(), in_flight=lim.limit)
        assert lim.limit - before == 2 * sent
        sent = lim.limit - before
    assert lim.limit == 32 + 64 + 128 + 256 + 512
    # The first miss ends slow start for good: far-below-target samples then grow additively.
    clock.advance(1)
    lim.on_sample(6.0, clock(), in_flight=lim.limit)
    assert lim.limit == 496
    for _ in range(10):
        lim.on_sample(0.1, clock(), in_flight=496)
    assert lim.limit == 498  # +0.24 per sample, not +20


def test_whole_answers_add_one_slot_each_in_slow_start(clock: FakeClock) -> None:
    # A whole answer frees its own slot as it ends: one more doubles the limit per round trip.
    lim = AimdLimiter(initial=8, floor=2, ceiling=1024, target_s=3.0, clock=clock)
    for _ in range(8):
        lim.on_whole_sample(1.0, 100, clock(), in_flight=8)  # always the best: no latency
    assert lim.limit == 16 and lim.slow_start


def test_slow_start_ends_at_half_the_target_cut_by_the_gradient(clock: FakeClock) -> None:
    lim = AimdLimiter(initial=16, floor=2, ceiling=1024, target_s=0.3, clock=clock)
    assert lim.first_token_s == 0.0  # nothing known yet
    for _ in range(16):
        lim.on_sample(0.05, clock(), in_flight=40)
    assert (lim.limit, lim.first_token_s, lim.slow_start) == (48, 0.05, True)
    # 0.16 s, over half the target: the engines queue. 2 x 0.05 / 0.16 of the limit would be
    # left (0.625); the cut never takes more than 30% off.
    lim.on_sample(0.16, clock(), in_flight=48)
    assert not lim.slow_start and lim.limit == 33
    assert lim.first_token_s == 0.0  # only slow start counts on it
    # A miss of the target itself may still cut at once: that was no cut of a round trip.
    lim.on_sample(0.45, clock(), in_flight=33)
    assert lim.limit == 22
    # A mild slowdown takes off only what the gradient says ...
    mild = AimdLimiter(initial=20, floor=2, ceiling=1024, target_s=0.3, clock=clock)
    for _ in range(10):
        mild.on_sample(0.1, clock(), in_flight=20)
    mild.on_sample(0.25, clock(), in_flight=40)
    assert mild.limit == 32  # 40 x 2 x 0.1 / 0.25
    # ... and never below the limit the climb started from: what it learnt before stays.
    high = AimdLimiter(initial=40, floor=2, ceiling=1024, target_s=0.3, clock=clock)
    high.on_sample(0.1, clock(), in_flight=40)
    high.on_sample(0.25, clock(), in_flight=40)
    assert high.limit == 40


def test_only_evidence_of_full_engines_cuts(clock: FakeClock) -> None:
    # A late first token with nothing else in flight is the request's own prefill (a long
    # prompt) or a busy host: no lower limit would make it faster. It neither cuts nor ends the
    # climb. With a second request in flight it is evidence of queueing.
    lim = AimdLimiter(initial=24, floor=2, ceiling=1024, target_s=3.0, clock=clock)
    for latency in (1.6, 2.9, 12.0):
        clock.advance(1)
        lim.on_sample(latency, clock(), in_flight=1)
    assert lim.limit == 24 and lim.slow_start
    clock.advance(1)
    lim.on_sample(6.0, clock(), in_flight=2)
    assert lim.limit == 12 and not lim.slow_start


def test_idle_time_keeps_the_limit_and_resumes_slow_start(clock: FakeClock) -> None:
    lim = AimdLimiter(initial=32, floor=2, ceiling=1024, target_s=3.0, clock=clock)
    for _ in range(200):
        lim.on_sample(0.1, clock(), in_flight=lim.limit)
    clock.advance(1)
    lim.on_sample(6.0, clock(), in_flight=lim.limit)  # slow start over
    high = lim.limit
    assert high > 100 and not lim.slow_start
    lim.on_idle()  # however long: idle time says nothing of the engines' capacity
    assert lim.limit == high and lim.slow_start
    for _ in range(high):
        lim.on_sample(0.1, clock(), in_flight=lim.limit)
    assert lim.limit == 3 * high  # slow start again: two slots per first token
    assert lim.first_token_s == 0.1
    low = AimdLimiter(initial=32, floor=2, ceiling=1024, target_s=3.0, clock=clock)
    low.on_pressure()
    low.on_idle()
    assert low.limit == 28  # below its start: idleness does not raise it either


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


def test_inconsistent_bounds_are_refused_by_the_settings() -> None:
    # The limiter trusts its bounds: FlowSettings validates them, once, at start-up.
    with pytest.raises(ValidationError, match="min_limit <= initial_limit <= max_limit"):
        FlowSettings(initial_limit=1, min_limit=2)


def test_whole_answers_grow_the_limit_and_never_cut_it(clock: FakeClock) -> None:
    """The non-streamed class has no first token: at its best pace per token (whatever the
    length) it grows the limit like a fast stream would; slower, it teaches nothing. A whole
    answer's latency is its prompt's prefill as much as its decode (a one-token answer to a long
    prompt is all prefill): no evidence of queueing, however slow."""
    lim = AimdLimiter(initial=8, floor=2, ceiling=1024, target_s=3.0, clock=clock)
    for window in range(3):
        for i in range(lim.limit):
            tokens = 10 if i % 2 else 200  # short and long answers, 20 ms per token each
            lim.on_whole_sample(0.02 * (tokens + 1), tokens, clock(), in_flight=lim.limit)
        assert lim.limit == 8 * 2 ** (window + 1)  # slow start: far below the target
    high = lim.limit
    for latency, tokens in ((0.06 * 101, 100), (4.0, 1), (30.0, 2)):  # 3x per token; prefills
        clock.advance(1)
        lim.on_whole_sample(latency, tokens, clock(), in_flight=high)
    assert lim.limit == high and lim.slow_start


def test_streamed_and_whole_answers_share_one_limit(clock: FakeClock) -> None:
    lim = make(clock)
    lim.on_whole_sample(0.02 * 11, 10, clock(), in_flight=10)
    lim.on_sample(0.1, clock(), in_flight=10)
    assert lim.limit == 13  # slow start: one slot from the whole answer, two from the stream


def test_the_fastest_first_token_is_slow_starts_alone_and_forgotten_after_a_pause(
    clock: FakeClock,
) -> None:
    lim = AimdLimiter(initial=32, floor=2, ceiling=1024, target_s=3.0, clock=clock)
    for latency in (0.3, 0.1, 0.2):
        lim.on_sample(latency, clock(), in_flight=32)
    assert lim.first_token_s == 0.1
    lim.on_idle()  # the pace before a pause says little about the next burst
    assert lim.first_token_s == 0.0 and lim.slow_start
    lim.on_sample(0.2, clock(), in_flight=32)
    lim.on_pressure()
    assert lim.first_token_s == 0.0 and not lim.slow_start


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
