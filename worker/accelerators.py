"""How many accelerators this pod has, and whether the parallel layout uses exactly those.

A layout that needs more GPUs than the pod has fails deep inside vLLM after a long start-up; one
that needs fewer leaves paid-for GPUs idle. Both are refused up front.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Mapping

from worker.settings import SettingsError, WorkerSettings


def nvidia_smi_listing() -> str | None:
    """``nvidia-smi -L`` output, or None when the tool is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _count_list(value: str) -> int:
    return len([item for item in value.split(",") if item.strip()])


def detect_gpus(
    env: Mapping[str, str], list_gpus: Callable[[], str | None] = nvidia_smi_listing
) -> int | None:
    """GPUs visible to this process, or None when it cannot be told."""
    # The device plugin / container runtime narrows what the pod sees; the narrowest source wins.
    cuda = env.get("CUDA_VISIBLE_DEVICES")
    if cuda is not None:
        return _count_list(cuda)
    nvidia = env.get("NVIDIA_VISIBLE_DEVICES", "").strip().lower()
    if nvidia and nvidia not in {"all", "none", "void"}:
        return _count_list(nvidia)
    listing = list_gpus()
    if listing is None:
        return None
    return sum(1 for line in listing.splitlines() if line.startswith("GPU "))


def pod_accelerators(
    settings: WorkerSettings,
    env: Mapping[str, str],
    list_gpus: Callable[[], str | None] = nvidia_smi_listing,
) -> int | None:
    """The accelerator count to check against: explicit, detected (gpu), or None (unknown)."""
    if settings.accelerators is not None:
        return settings.accelerators
    if settings.device == "cpu":
        return None
    return detect_gpus(env, list_gpus)


def check_accelerators(settings: WorkerSettings, available: int | None) -> None:
    if available is None:
        return
    need = settings.local_ranks
    if need != available:
        raise SettingsError(
            f"WORKER_TENSOR_PARALLEL_SIZE={settings.tensor_parallel_size} x "
            f"{settings.pipeline_parallel_size // settings.nnodes} pipeline stage(s) per node "
            f"(WORKER_PIPELINE_PARALLEL_SIZE={settings.pipeline_parallel_size} / "
            f"WORKER_NNODES={settings.nnodes}) needs {need} accelerator(s) but this pod has "
            f"{available} (WORKER_ACCELERATORS or detected)"
        )
