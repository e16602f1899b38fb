from __future__ import annotations

import pytest

from gateway.errors import Unavailable, retry_after_s
from gateway.flow.retry_after import Pace, expected_wait, retry_after
from tests.gateway.flow.conftest import FakeClock


def test_service_time_is_littles_law_on_the_pool(clock: FakeClock) -> None:
    pace = Pace(clock)
    # Four requests in flight at a time, each taking 2 s: one ends every 0.5 s.
    n = 0
    for _ in range(4):
        pace.took(n, clock())
        n += 1
    for _ in range(40):
        clock.advance(0.5)
        pace.released(n, clock())
        pace.took(n - 1, clock())
    assert pace.service_s == pytest.approx(2.0, rel=0.01)


def test_silence_teaches_nothing(clock: FakeClock) -> None:
    # The pace of a pool's last requests survives a pause: the first wait estimated after it is
    # the time to the next free slot at that pace, not one of a rate decayed toward zero.
    pace = Pace(clock)
    for _ in range(10):
        pace.took(0, clock())
        clock.advance(1.0)
        pace.released(1, clock())
    assert pace.service_s == pytest.approx(1.0)
    clock.advance(600.0)  # the pool empty all along
    pace.took(0, clock())
    clock.advance(1.0)
    pace.released(1, clock())
    assert pace.service_s == pytest.approx(1.0)


def test_the_wait_is_the_next_free_slot_and_one_per_request_ahead() -> None:
    # 24 in flight at 6 s each: a slot every 0.25 s. The 8th over the limit waits 2 s.
    assert expected_wait(0, 24, 24, 6.0) == pytest.approx(0.25)
    assert expected_wait(7, 24, 24, 6.0) == pytest.approx(2.0)
    # Over the limit (a cut while requests were in flight): those above it end first.
    assert expected_wait(0, 30, 24, 6.0) == pytest.approx(7 * 6.0 / 30)
    assert retry_after(0, 24, 24, 0.01) == 1.0  # never below 1 s
    assert retry_after(10_000, 24, 24, 6.0) == 60.0  # nor above a minute


def test_header_and_message_say_the_same_whole_seconds() -> None:
    # The body said "retry after 3s" while the header said 4: one rounding for both now.
    for wait in (0.2, 1.0, 2.5, 3.4, 3.5, 59.01):
        exc = Unavailable(f"overloaded; retry after {retry_after_s(wait)}s", retry_after=wait)
        header = dict(exc.headers())[b"retry-after"].decode()
        assert exc.message.endswith(f"retry after {header}s")
        assert int(header) >= wait and int(header) >= 1
