"""The one exception the CLI turns into a one-line error (and a non-zero exit)."""

from __future__ import annotations


class StoreError(Exception):
    """A user-facing failure: the message is one line that says what and where."""


class LeaseLost(StoreError):
    """Another puller took over our lease (we were presumed dead): stop without publishing."""
