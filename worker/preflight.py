"""The checks between "the model is on disk" and "start vLLM", for `run` and `argv` alike.

`llmserve-worker run` applies them before it starts the engine; `llmserve-worker argv` applies
them before it prints the command, so it never prints a command `run` would refuse, and prints
the one `run` would start (with the `--max-lora-rank` derived from the adapters).
"""

from __future__ import annotations

from collections.abc import Mapping

from worker.accelerators import check_accelerators, pod_accelerators
from worker.lora import check_adapters, with_rank
from worker.model_checks import check_layout, read_model_shape
from worker.settings import WorkerSettings


def preflight(settings: WorkerSettings, env: Mapping[str, str]) -> WorkerSettings:
    """Raise SettingsError naming the setting if vLLM would refuse these settings for the model
    at WORKER_MODEL_PATH (its layout, its context length, the pod's accelerators, each LoRA
    adapter); otherwise the settings to start with (WORKER_MAX_LORA_RANK resolved)."""
    check_layout(settings, read_model_shape(settings.model_path))
    check_accelerators(settings, pod_accelerators(settings, env))
    if not settings.lora_enabled:
        return settings
    return with_rank(settings, check_adapters(settings))
