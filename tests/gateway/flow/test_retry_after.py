from __future__ import annotations

import pytest

from gateway.flow.retry_after import DrainRate, expected_wait, retry_after
from tests.gateway.flow.conftest import FakeClock


def test_rate_from_completions(clock: FakeClock) -> None:
    d = DrainRate(clock)
    for _ in range(50):  # 10 per second for 5 s
        clock.advance(0.1)
        d.tick(clock())
    assert d.current() == pytest.approx(10.0, rel=0.05)


def test_silence_decays_the_rate(clock: FakeClock) -> None:
    d = DrainRate(clock)
    for _ in range(20):
        clock.advance(0.1)
        d.tick(clock())
    fast = d.current()
    clock.advance(10)
    assert d.current() < fast / 2


def test_retry_after_scales_with_depth_and_rate() -> None:
    assert retry_after(99, rate=10.0, limit=8, target_s=1.0) == pytest.approx(10.0)
    assert retry_after(99, rate=50.0, limit=8, target_s=1.0) == pytest.approx(2.0)
    assert retry_after(0, rate=100.0, limit=8, target_s=1.0) == 1.0  # never below 1 s
    assert retry_after(10**6, rate=1.0, limit=8, target_s=1.0) == 60.0  # capped
    # No completions yet: Little's law from the limit and the target.
    assert expected_wait(15, rate=0.0, limit=8, target_s=2.0) == pytest.approx(4.0)
