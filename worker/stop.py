"""A stop request that a signal handler may set.

A Python signal handler runs in the main thread between two of its bytecodes, possibly while that
thread holds a lock. ``threading.Event.set`` takes the event's lock, so calling it from a handler
can wait forever on a lock its own thread holds: a worker told to stop right as it starts waiting
on the event would never exit. ``StopRequest`` takes no lock: the handler flips a flag and writes a
byte to a pipe, and a waiter sleeps in ``select`` on that pipe, so it wakes at once.
"""

from __future__ import annotations

import contextlib
import os
import select
from typing import Protocol


class Stop(Protocol):
    """What a wait loop needs from a stop request (``threading.Event`` also fits)."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class StopRequest:
    """Set once, from a signal handler or any thread; waited on by the main flow."""

    def __init__(self) -> None:
        self._set = False
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)

    def set(self) -> None:
        self._set = True
        if self._write >= 0:
            with contextlib.suppress(OSError):  # BlockingIOError: full, so already awake
                os.write(self._write, b"\0")

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        """True once set; otherwise after ``timeout`` seconds, False."""
        if not self._set and self._read >= 0:
            # A signal handled during select: select is retried (PEP 475) and sees the byte.
            select.select([self._read], [], [], timeout)
        return self._set

    def close(self) -> None:
        """Release the pipe; call once no handler can set this any more."""
        read, write, self._read, self._write = self._read, self._write, -1, -1
        for fd in (read, write):
            if fd >= 0:
                os.close(fd)
