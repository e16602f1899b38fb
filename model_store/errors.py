"""The exceptions the CLI turns into a one-line error: exit code 2 for a usage error (what was
given cannot work as written), 1 for a failure of the transfer itself."""

from __future__ import annotations


class StoreError(Exception):
    """A user-facing failure: the message is one line that says what and where."""


class LeaseLost(StoreError):
    """Another puller took over our lease (we were presumed dead): stop without publishing."""


class UsageError(StoreError):
    """What the user gave cannot work as written (a malformed S3 URL): exit code 2."""
