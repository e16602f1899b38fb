"""`python -m gateway` with a drain shorter than its longest request, which its settings refuse
(GATEWAY_DRAIN_TIMEOUT_S under GATEWAY_TIMEOUTS__TOTAL_S would cut streams the gateway lets
run). The drain's expiry stays the backstop for what outlives the total in production (a
request retried on another replica, one that waited in the queue first), which takes long to
stage; test_server's drain-expiry test reaches it this way instead.

usage: short_drain.py DRAIN_S [gateway flags...]"""

from __future__ import annotations

import sys

from gateway.cli import settings_from_args
from gateway.server import run

if __name__ == "__main__":
    settings = settings_from_args(sys.argv[2:])
    run(settings.model_copy(update={"drain_timeout_s": float(sys.argv[1])}))
