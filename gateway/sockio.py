"""Run the gateway's process with gateway/_sockio.c preloaded: socket I/O through recv/send.

That file says why (libuv reads and writes sockets with read(2)/write(2), which pass through the
VFS layer; recv/send do not). A preload must be in place when the process starts, so
`python -m gateway` re-executes itself once, with the same arguments and pid, when:

- the shim is built (it is optional, like gateway/_speedups.c, and Linux-only),
- `GATEWAY_SOCKIO` / `--sockio` is on (the default), and
- this process has not tried already (`_TRIED`: a loader that ignores LD_PRELOAD, e.g. in
  secure-execution mode, must not make it loop).

The re-executed process takes the shim out of LD_PRELOAD at once (`scrub`), so processes the
gateway starts run as usual, and says at start-up whether it took (`report`).

The shim is a plain shared library (no Python module: a non-Python program that inherits the
preload must load it), found by its path and read through ctypes.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import sysconfig
from pathlib import Path

log = logging.getLogger("gateway")

_TRIED = "LLMSERVE_SOCKIO_EXEC"


def shim_path() -> Path | None:
    """The built shim, or None (not built: no compiler, or not Linux)."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    path = Path(__file__).with_name(f"_sockio{suffix}")
    return path if path.is_file() else None


def _shim() -> ctypes.CDLL | None:
    # dlopen of the preloaded file hands back the object already loaded (glibc matches it by
    # name and by file); without a preload it loads a private copy, which changes nothing.
    path = shim_path()
    return ctypes.CDLL(str(path)) if path is not None else None


def active() -> bool:
    """Whether this process's `read` is the shim's, i.e. it was preloaded."""
    shim = _shim()
    if shim is None:
        return False
    process_read = ctypes.cast(ctypes.CDLL(None).read, ctypes.c_void_p).value
    return process_read == ctypes.cast(shim.read, ctypes.c_void_p).value


def counts() -> tuple[int, int]:
    """(reads and writes answered by recv/send, those passed to libc's read/write)."""
    shim = _shim()
    if shim is None:
        return 0, 0
    by_socket, by_libc = ctypes.c_ulong(), ctypes.c_ulong()
    shim.llmserve_sockio_counts(ctypes.byref(by_socket), ctypes.byref(by_libc))
    return by_socket.value, by_libc.value


def reexec_with_shim(wanted: bool) -> None:
    """Replace this process with itself under the shim, if wanted, built and not yet tried.
    Returns only when it does not (then `report` says why, once logging is set up)."""
    shim = shim_path()
    if shim is None or not wanted or os.environ.get(_TRIED) or active():
        return
    if any(c.isspace() or c == ":" for c in str(shim)):
        # ld.so splits LD_PRELOAD on spaces and colons: such a path cannot be preloaded.
        os.environ[_TRIED] = str(shim)
        return
    preload = os.environ.get("LD_PRELOAD", "")
    os.environ["LD_PRELOAD"] = f"{shim} {preload}".strip()
    os.environ[_TRIED] = str(shim)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def scrub() -> None:
    """Take the shim out of the LD_PRELOAD that processes started from here inherit (it stays
    loaded in this one). Call first thing: even building the app may start a program (a
    kubeconfig's credential plugin)."""
    shim = os.environ.get(_TRIED)
    preload = os.environ.get("LD_PRELOAD")
    if shim is None or preload is None:
        return
    rest = [p for p in preload.replace(":", " ").split() if p != shim]
    if rest:
        os.environ["LD_PRELOAD"] = " ".join(rest)
    else:
        del os.environ["LD_PRELOAD"]


def report(wanted: bool) -> None:
    """Say once whether socket I/O runs through the shim."""
    shim = os.environ.pop(_TRIED, None)
    if not wanted:
        return
    if active():
        log.info("socket I/O through recv/send (gateway/_sockio.c preloaded)")
    elif shim is not None:
        log.warning("socket I/O through read/write: the preload of %s did not take (LD_PRELOAD "
                    "ignored, or a space or colon in its path); the gateway runs, at 1-3%% more "
                    "CPU", shim)
    elif shim_path() is None:
        log.info("socket I/O through read/write: gateway/_sockio.c is not built")
    else:
        log.info("socket I/O through read/write: started without `python -m gateway`, which "
                 "preloads gateway/_sockio.c")
