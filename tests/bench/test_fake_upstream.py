"""The fake upstream the gateway tests and benchmarks stand on: it must stop cleanly."""

from __future__ import annotations

import gc
import socket

import pytest

from bench.fake_upstream import start_in_thread


@pytest.mark.slow
def test_a_connection_accepted_as_it_stops_is_closed_not_leaked() -> None:
    # A client connecting the instant before the upstream stops (a health probe, say) used to
    # leave the server side's socket open on CPython 3.11 (its transport was set up after the
    # server closed). Any such socket is an unraisable ResourceWarning at the gc.collect() below,
    # which pytest turns into a failure under filterwarnings=error.
    for _ in range(20):
        with start_in_thread() as up:
            client = socket.create_connection((up.host, up.port))
        client.close()
        gc.collect()
    assert up.connections == set()
