"""Run the gateway's process with gateway/_sockio.c preloaded: socket I/O through recv/send.

That file says why (libuv reads and writes sockets with read(2)/write(2), which pass through the
VFS layer; recv/send do not). A preload must be in place when the process starts, so
`python -m gateway` re-executes itself once, with the same arguments and pid, when:

- the shim is built (it is optional, like gateway/_speedups.c, and Linux-only),
- `GATEWAY_SOCKIO` / `--sockio` is on (the default), and
- this process has not tried already (`_TRIED`: a loader that ignores LD_PRELOAD, e.g. in
  secure-execution mode, must not make it loop).

The shim leaves LD_PRELOAD once loaded (`settle`), so processes the gateway starts run as usual.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

log = logging.getLogger("gateway")

_TRIED = "LLMSERVE_SOCKIO_EXEC"


def shim_path() -> Path | None:
    """The built shim, or None (not built: no compiler, or not Linux)."""
    try:
        from gateway import _sockio  # type: ignore[attr-defined]
    except ImportError:
        return None
    return Path(_sockio.__file__)


def active() -> bool:
    """Whether this process's socket reads and writes go through the shim."""
    try:
        from gateway import _sockio  # type: ignore[attr-defined]
    except ImportError:
        return False
    return bool(_sockio.active())


def reexec_with_shim(wanted: bool) -> None:
    """Replace this process with itself under the shim, if wanted, built and not yet tried.
    Returns only when it does not (then `settle` says why, once logging is set up)."""
    if not wanted or os.environ.get(_TRIED) or active():
        return
    shim = shim_path()
    if shim is None:
        return
    preload = os.environ.get("LD_PRELOAD", "")
    os.environ["LD_PRELOAD"] = f"{shim} {preload}".strip()
    os.environ[_TRIED] = str(shim)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def settle(wanted: bool) -> None:
    """In the (re-executed) process: take the shim out of the environment children inherit, and
    say once whether socket I/O runs through it."""
    shim = os.environ.pop(_TRIED, None)
    if shim is not None:
        rest = [p for p in os.environ.get("LD_PRELOAD", "").split() if p != shim]
        if rest:
            os.environ["LD_PRELOAD"] = " ".join(rest)
        else:
            os.environ.pop("LD_PRELOAD", None)
    if not wanted:
        return
    if active():
        log.info("socket I/O through recv/send (gateway/_sockio.c preloaded)")
    elif shim is not None:
        log.warning("socket I/O through read/write: the preload of %s did not take (LD_PRELOAD "
                    "ignored?); the gateway runs, at 2-3%% more CPU", shim)
    elif shim_path() is None:
        log.info("socket I/O through read/write: gateway/_sockio.c is not built")
    else:
        log.info("socket I/O through read/write: started without `python -m gateway`, which "
                 "preloads gateway/_sockio.c")
