"""gateway/_sockio.c: socket I/O through recv/send when preloaded, libc's own for the rest, and
`python -m gateway` preloading it (gateway/sockio.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from gateway import sockio
from tests.gateway.conftest import (
    RELAY_TESTS,
    UpstreamFactory,
    gateway_process,
    run_tests_with,
    url_of,
)

ROOT = Path(__file__).resolve().parents[2]

_built = sockio.shim_path()
if _built is None:  # pragma: no cover - says what to do
    pytest.fail("gateway/_sockio.c is not built: run `make install` (it needs a C compiler)",
                pytrace=False)
SHIM: Path = _built


def preloaded(script: str) -> dict[str, object]:
    """Run `script` in a Python with the shim preloaded; it prints one JSON object."""
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT,
                         env={**os.environ, "LD_PRELOAD": str(SHIM)}, capture_output=True,
                         text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    out: dict[str, object] = json.loads(run.stdout.strip().splitlines()[-1])
    return out


def test_loading_it_alone_takes_nothing_over() -> None:
    # dlopen comes after libc in the lookup order: only a preload replaces read/write.
    assert not sockio.active()
    assert sockio.counts() == (0, 0)


def test_the_built_shim_is_not_older_than_its_source() -> None:
    source = ROOT / "gateway" / "_sockio.c"
    assert SHIM.stat().st_mtime >= source.stat().st_mtime, (
        f"{SHIM.name} is older than {source.name}: run `make install`")


def test_a_program_that_is_not_python_runs_with_it() -> None:
    # Inherited before the gateway scrubs it (a kubeconfig credential plugin run while the app is
    # built): the shim must load without Python in the process, eagerly bound too.
    for env in ({}, {"LD_BIND_NOW": "1"}):
        run = subprocess.run(["sh", "-c", "echo ok | cat"], capture_output=True, text=True,
                             env={**os.environ, **env, "LD_PRELOAD": str(SHIM)}, check=False)
        assert (run.returncode, run.stdout, run.stderr) == (0, "ok\n", "")


def test_sockets_go_through_recv_and_send_and_everything_else_through_libc(
        tmp_path: Path) -> None:
    out = preloaded(f"""
        import errno, json, os, signal, socket
        from gateway import sockio as _sockio
        # SIGPIPE's default kills the process: a write to a closed socket must not raise it.
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        res = {{"active": _sockio.active()}}
        s0 = _sockio.counts()
        a, b = socket.socketpair()
        assert os.write(a.fileno(), b"hello") == 5
        res["socket_read"] = os.read(b.fileno(), 100).decode()
        b.setblocking(False)
        try:
            os.read(b.fileno(), 100)
        except BlockingIOError:
            res["eagain"] = True  # a non-blocking socket with nothing to read: as read(2)
        s1 = _sockio.counts()
        res["by_socket"] = s1[0] - s0[0]
        # A pipe and a file: libc's read/write, same bytes.
        r, w = os.pipe()
        os.write(w, b"piped")
        res["pipe_read"] = os.read(r, 100).decode()
        path = {str(tmp_path / "f")!r}
        with open(path, "wb") as f:
            f.write(b"filed")
        with open(path, "rb") as f:
            res["file_read"] = f.read().decode()
        s2 = _sockio.counts()
        res["pipe_file_by_socket"] = s2[0] - s1[0]
        # An fd number that was a socket, then a file, then a socket again (close forgets it).
        fd = a.fileno()
        a.close()
        fd2 = os.open(path, os.O_RDONLY)
        res["reused_as_file"] = fd2 == fd and os.read(fd2, 100).decode() == "filed"
        os.close(fd2)
        c, d = socket.socketpair()
        before = _sockio.counts()
        os.write(c.fileno(), b"x")
        res["reused_again_by_socket"] = (_sockio.counts()[0] - before[0] == 1
                                         and d.recv(10) == b"x")
        # A zero-length read returns at once, as read(2) does (recv would wait for data).
        e, f = socket.socketpair()
        res["zero_length"] = os.read(f.fileno(), 0)  == b""
        # errno stays as it was when libc's call succeeds after the shim's recv was refused.
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        r2, w2 = os.pipe()
        os.write(w2, b"z")
        ctypes.set_errno(0)
        n = libc.read(r2, ctypes.create_string_buffer(8), 8)
        res["errno_kept"] = (n, ctypes.get_errno())
        # A number closed by a raw syscall (as libuv closes its fds) while marked "not a socket"
        # must not keep a later socket on plain read/write: new sockets are marked.
        import platform
        libc.syscall(3 if platform.machine() == "x86_64" else 57, r2)  # SYS_close
        g, h = socket.socketpair()
        res["renumbered"] = g.fileno() == r2 or h.fileno() == r2
        before = _sockio.counts()
        os.write(g.fileno(), b"q")
        os.read(h.fileno(), 1)
        res["renumbered_by_socket"] = _sockio.counts()[0] - before[0]
        # uvloop's own reads and writes (libuv) go through the shim.
        import asyncio, uvloop
        async def echo():
            x, y = socket.socketpair()
            r, w = await asyncio.open_connection(sock=x)
            r2_, w2_ = await asyncio.open_connection(sock=y)
            start = _sockio.counts()[0]
            for _ in range(10):
                w.write(b"ping")
                await w.drain()
                await r2_.readexactly(4)
            done = _sockio.counts()[0] - start
            w.close(); w2_.close()
            return done
        res["uvloop_by_socket"] = uvloop.new_event_loop().run_until_complete(echo()) >= 20
        # The peer gone: EPIPE, and no SIGPIPE (the process is still here to say so).
        d.close()
        try:
            for _ in range(3):
                os.write(c.fileno(), b"y" * 65536)
        except (BrokenPipeError, ConnectionResetError) as exc:
            res["closed_peer"] = errno.errorcode[exc.errno]
        print(json.dumps(res))
    """)
    assert out == {
        "active": True, "socket_read": "hello", "eagain": True, "by_socket": 3,
        "pipe_read": "piped", "file_read": "filed", "pipe_file_by_socket": 0,
        "reused_as_file": True, "reused_again_by_socket": True, "zero_length": True,
        "errno_kept": [1, 0], "renumbered": True, "renumbered_by_socket": 2,
        "uvloop_by_socket": True, "closed_peer": out.get("closed_peer"),
    }
    assert out["closed_peer"] in ("EPIPE", "ECONNRESET")


def test_scrub_takes_the_shim_out_of_what_children_inherit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LD_PRELOAD", f"{SHIM} /opt/other.so")
    monkeypatch.setenv("LLMSERVE_SOCKIO_EXEC", str(SHIM))
    sockio.scrub()
    assert os.environ["LD_PRELOAD"] == "/opt/other.so"
    sockio.report(True)
    assert "LLMSERVE_SOCKIO_EXEC" not in os.environ
    monkeypatch.setenv("LD_PRELOAD", str(SHIM))
    monkeypatch.setenv("LLMSERVE_SOCKIO_EXEC", str(SHIM))
    sockio.scrub()
    assert "LD_PRELOAD" not in os.environ


@pytest.mark.parametrize("why", ["tried", "spaced"])
def test_the_reexec_is_tried_once_and_only_where_it_can_take(why: str, tmp_path: Path) -> None:
    # In a child: were the guard broken, execv would replace the test's own process.
    # "tried": a loader that ignores LD_PRELOAD (secure execution) must not make it loop.
    # "spaced": ld.so splits LD_PRELOAD on spaces and colons; such a path is not preloaded.
    spaced = tmp_path / "a dir" / "gateway"
    if why == "spaced":
        spaced.parent.mkdir()
        (spaced.parent / "gateway").symlink_to(ROOT / "gateway")
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(spaced.parent) if why == "spaced" else str(ROOT)!r})
        from gateway import sockio
        if {why == "tried"}:
            os.environ["LLMSERVE_SOCKIO_EXEC"] = "x"
        sockio.reexec_with_shim(True)
        print("returned", os.environ.get("LD_PRELOAD", ""), sockio.shim_path())
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "LLMSERVE_SOCKIO_EXEC")}
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("returned  "), run.stdout  # no exec, LD_PRELOAD untouched
    assert (" " in run.stdout.split("returned  ", 1)[1]) == (why == "spaced")


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_python_m_gateway_preloads_it_and_serves_through_it(upstreams: UpstreamFactory) -> None:
    up = upstreams(tokens=20)
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "max_tokens": 20}
    direct = httpx.post(url_of(up) + "/v1/chat/completions", json=body, timeout=30)
    with gateway_process(up, "--log-level", "info") as (gw, url):
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
        assert r.text.count("data: ") == direct.text.count("data: ") >= 20  # every event
        assert SHIM.name in _maps(gw.pid)  # the same pid: execv replaced the process in place
        gw.terminate()
        gw.wait(20)
        assert gw.stderr is not None
        log = gw.stderr.read()
    assert "socket I/O through recv/send" in log, log[-2000:]


def test_no_sockio_runs_without_it(upstreams: UpstreamFactory) -> None:
    with gateway_process(upstreams(), "--no-sockio") as (gw, url):
        assert httpx.get(url + "/ready").status_code == 200
        assert SHIM.name not in _maps(gw.pid)


@pytest.mark.slow
def test_the_relay_tests_pass_under_the_shim() -> None:
    # Back-pressure, partial writes, EOF and resets in the relay and the edge, with every socket
    # read and write going through recv/send.
    run_tests_with({"LD_PRELOAD": str(SHIM)}, "__import__('gateway.sockio', fromlist=['_']).active()",
              (*RELAY_TESTS, "tests/gateway/test_edge.py"))
