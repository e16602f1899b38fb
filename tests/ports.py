"""Loopback ports for the servers the tests start (one helper for every test package)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port free on 127.0.0.1 right now (the OS picks it; a later bind may still race)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port_pair() -> int:
    """A port P such that P and P+1 are both free now (for servers numbered from a base)."""
    while True:
        base = free_port()
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", base))
                b.bind(("127.0.0.1", base + 1))
            return base
        except OSError:
            continue
