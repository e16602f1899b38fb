"""A real S3-protocol endpoint for tests: moto's standalone server in a subprocess on loopback,
optionally behind a small HTTP proxy that counts (and can throttle) the object bytes it sends.

Clients talk to either only through boto3 with `endpoint_url` and path-style addressing, exactly
as to MinIO. The proxy counts the body bytes of GET responses per bucket, excluding the manifest:
that is "the bytes the server sent" for model files.
"""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from model_store.manifest import MANIFEST_NAME
from tests.ports import free_port

HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"}
CHUNK = 64 << 10


def client_env(endpoint: str, key: str = "testing", secret: str = "testing") -> dict[str, str]:
    """Env for a model_store subprocess (or boto3) talking to `endpoint`; no host AWS config."""
    return {
        "AWS_ACCESS_KEY_ID": key,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_REGION": "us-east-1",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
        "MODEL_STORE_ENDPOINT_URL": endpoint,
        "MODEL_STORE_PATH_STYLE": "true",
    }


@contextmanager
def moto_server(log: Path, extra_env: dict[str, str] | None = None) -> Iterator[str]:
    """Run `moto_server` on a free loopback port; yield its endpoint URL."""
    port = free_port()
    env = {**os.environ, **(extra_env or {})}
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from moto.server import main; main()",
             "-H", "127.0.0.1", "-p", str(port)],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start:\n{log.read_text()[-2000:]}")
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Counter:
    """Object bytes sent per bucket; `rate` (bytes/s, 0 = unlimited) throttles per bucket."""

    sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    gets: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    rate: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, bucket: str, n: int) -> None:
        with self.lock:
            self.sent[bucket] += n


def _handler(upstream: tuple[str, int], counter: Counter) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
            conn = http.client.HTTPConnection(*upstream, timeout=120)
            try:
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                self._relay(resp)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client went away (e.g. kill -9)
            finally:
                conn.close()

        do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

        def _relay(self, resp: http.client.HTTPResponse) -> None:
            path = self.path.split("?", 1)[0]
            bucket, _, key = path.lstrip("/").partition("/")
            counted = self.command == "GET" and key and not key.endswith(MANIFEST_NAME)
            length = resp.getheader("Content-Length")
            self.send_response_only(resp.status, resp.reason)
            for k, v in resp.getheaders():
                if k.lower() not in HOP and k.lower() != "content-length":
                    self.send_header(k, v)
            if length is None:  # not streamed upstream: buffer it (only small replies)
                data = resp.read()
                length = str(len(data))
                chunks: Iterator[bytes] = iter([data])
            else:
                chunks = iter(lambda: resp.read(CHUNK), b"")
            self.send_header("Content-Length", length)
            self.end_headers()
            if self.command == "HEAD":
                return
            if counted:
                with counter.lock:
                    counter.gets[bucket] += 1
            for chunk in chunks:
                rate = counter.rate.get(bucket, 0.0)
                if counted and rate:
                    time.sleep(len(chunk) / rate)
                self.wfile.write(chunk)
                if counted:
                    counter.add(bucket, len(chunk))

    return Handler


@contextmanager
def counting_proxy(endpoint: str) -> Iterator[tuple[str, Counter]]:
    host, port = endpoint.removeprefix("http://").split(":")
    counter = Counter()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler((host, int(port)), counter))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="s3-proxy", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", counter
    finally:
        server.shutdown()
        server.server_close()
