from __future__ import annotations

import pytest

from gateway.flow.buckets import KeyLimits, TokenBucket
from tests.gateway.flow.conftest import FakeClock


def test_bucket_burst_then_refill(clock: FakeClock) -> None:
    b = TokenBucket(60, clock=clock)  # 1 per second, burst 60
    assert all(b.try_take() == 0.0 for _ in range(60))
    assert b.try_take() == pytest.approx(1.0)
    clock.advance(0.5)
    assert b.try_take() == pytest.approx(0.5)
    clock.advance(0.5)
    assert b.try_take() == 0.0
    clock.advance(3600)
    assert b.try_take(60) == 0.0  # refilled, but only up to the burst
    assert b.try_take() > 0


def test_requests_per_minute(clock: FakeClock) -> None:
    lim = KeyLimits(rpm=2, tpm=None, clock=clock)
    assert lim.admit() is None and lim.admit() is None
    refusal = lim.admit()
    assert refusal is not None and refusal.reason == "rpm"
    assert refusal.retry_after_s == pytest.approx(30.0)  # 2/min: one back every 30 s
    lim.refund()
    assert lim.admit() is None


def test_tokens_debited_after_use_and_refused_until_repaid(clock: FakeClock) -> None:
    lim = KeyLimits(rpm=None, tpm=600, clock=clock)  # 10 tokens/s
    assert lim.admit() is None
    lim.used(900)  # one long answer overdraws the bucket: level -300
    refusal = lim.admit()
    assert refusal is not None and refusal.reason == "tpm"
    assert refusal.retry_after_s == pytest.approx(30.0, abs=0.01)
    clock.advance(refusal.retry_after_s + 0.01)
    assert lim.admit() is None


def test_unlimited_key_never_refuses() -> None:
    lim = KeyLimits(None, None)
    lim.used(10**9)
    assert all(lim.admit() is None for _ in range(1000))
