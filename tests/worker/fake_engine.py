"""A stand-in for vLLM's process tree, for the launcher tests (no vLLM needed).

Like vLLM's API server it leaves a child behind when it exits; the child ignores SIGTERM, like an
engine core busy in a kernel. Writes "<own pid> <child pid>" to PIDFILE once the tree is set up.

usage: fake_engine.py PIDFILE [--polite] [--exit-code N]
  --polite       the child exits on SIGTERM too (a well-behaved engine)
  --exit-code N  exit with N right after setup instead of waiting (an engine crash)
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CHILD = """
import signal, sys, time
if {ignore}:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(3600)
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("pidfile", type=Path)
    parser.add_argument("--polite", action="store_true")
    parser.add_argument("--exit-code", type=int)
    args = parser.parse_args()
    exit_code: int | None = args.exit_code

    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(ignore=not args.polite)], stdout=subprocess.PIPE
    )
    assert child.stdout is not None
    child.stdout.readline()  # its SIGTERM disposition is in place before anyone learns its pid
    tmp = args.pidfile.with_suffix(".tmp")
    tmp.write_text(f"{os.getpid()} {child.pid}", encoding="utf-8")
    os.replace(tmp, args.pidfile)

    if exit_code is not None:
        return exit_code
    # Exit at once on SIGTERM without touching the child, as vLLM's API server does.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    time.sleep(3600)
    return 0


if __name__ == "__main__":
    sys.exit(main())
