"""The worker's stop request: set from a signal handler or a thread, it wakes a waiter at once."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import pytest

from worker.stop import StopRequest


@pytest.fixture
def stop() -> Iterator[StopRequest]:
    request = StopRequest()
    yield request
    request.close()


def test_a_signal_handler_wakes_the_waiter(stop: StopRequest) -> None:
    previous = signal.signal(signal.SIGUSR1, lambda sig, frame: stop.set())
    try:
        timer = threading.Timer(0.1, signal.pthread_kill,
                                args=(threading.main_thread().ident, signal.SIGUSR1))
        timer.start()
        started = time.monotonic()
        assert stop.wait(30) is True
        assert time.monotonic() - started < 5
        timer.join()
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_another_thread_wakes_the_waiter(stop: StopRequest) -> None:
    threading.Timer(0.1, stop.set).start()
    started = time.monotonic()
    assert stop.wait(30) is True
    assert time.monotonic() - started < 5
    assert stop.is_set()


def test_an_unset_request_waits_out_its_timeout(stop: StopRequest) -> None:
    started = time.monotonic()
    assert stop.wait(0.2) is False
    assert 0.2 <= time.monotonic() - started < 5
    assert not stop.is_set()


def test_setting_twice_and_after_close_is_harmless() -> None:
    request = StopRequest()
    request.set()
    request.set()
    assert request.wait(0) is True
    request.close()
    request.set()  # a late handler must not write to a file descriptor reused by then
    assert request.is_set()
