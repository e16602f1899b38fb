"""A stand-in for vLLM's process tree, for the launcher tests (no vLLM needed).

Like vLLM's API server it leaves a child behind when it exits; the child ignores SIGTERM, like an
engine core busy in a kernel. Writes "<own pid> <child pid>" to PIDFILE once the tree is set up.

usage: fake_engine.py PIDFILE [--polite] [--exit-code N] [--worker-title] [--serve-port P]
  --polite        the child exits on SIGTERM too (a well-behaved engine)
  --exit-code N   exit with N right after setup instead of waiting (an engine crash)
  --worker-title  the child's command line starts with VLLM::Worker, as vLLM's model ranks do,
                  and a second child titled VLLM::EngineCore writes its pid to PIDFILE.core
  --serve-port P  answer 200 on GET /health at 127.0.0.1:P once the file PIDFILE.serve exists
"""

from __future__ import annotations

import argparse
import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

CHILD = """
import signal, sys, time
if {ignore}:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ready", flush=True)
time.sleep(3600)
"""


def _serve_health(port: int, ready: Path) -> None:
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if ready.exists() else 503)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", port), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("pidfile", type=Path)
    parser.add_argument("--polite", action="store_true")
    parser.add_argument("--exit-code", type=int)
    parser.add_argument("--worker-title", action="store_true")
    parser.add_argument("--serve-port", type=int)
    args = parser.parse_args()
    exit_code: int | None = args.exit_code
    if args.serve_port is not None:
        _serve_health(args.serve_port, args.pidfile.with_suffix(".serve"))

    argv0 = "VLLM::Worker_TP0" if args.worker_title else sys.executable
    child = subprocess.Popen(
        [argv0, "-c", CHILD.format(ignore=not args.polite)], executable=sys.executable,
        stdout=subprocess.PIPE,
    )
    if args.worker_title:
        core = subprocess.Popen(["VLLM::EngineCore", "-c", CHILD.format(ignore=not args.polite)],
                                executable=sys.executable, stdout=subprocess.PIPE)
        assert core.stdout is not None
        core.stdout.readline()
        args.pidfile.with_suffix(".core").write_text(str(core.pid), encoding="utf-8")
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
