"""Loopback ports for the servers the tests start: the same helpers the benchmarks use."""

from __future__ import annotations

from bench.procs import free_port_pair, free_port_run
from devstack.procs import free_port

__all__ = ["free_port", "free_port_pair", "free_port_run"]
