"""Helpers of the routing tests."""

from __future__ import annotations

from gateway.routing.backend import Backend


def probed_backends(n: int) -> tuple[Backend, ...]:
    """`n` backends (http://10.0.0.i:8000) whose health probe passed: routable."""
    out = tuple(Backend(f"http://10.0.0.{i}:8000") for i in range(n))
    for b in out:
        b.probe_ok = True
    return out
