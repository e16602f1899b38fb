"""Checks of the parallel layout against the model's own ``config.json``.

vLLM finds the same problems, but only after minutes of start-up and with a stack trace; these run
in milliseconds once the model directory is complete and name the setting to change.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from worker.layout import (
    LayoutError,
    max_model_len,
    positive_int,
    read_config,
    sharding_problems,
    valid_tp,
)
from worker.settings import SettingsError, WorkerSettings

# vLLM's own switch for a context beyond the model's (its check is skipped too).
ALLOW_LONG_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"


@dataclass(frozen=True)
class ModelShape:
    """The few numbers of a transformer config that constrain the parallel layout and the
    context length. Latent attention (DeepSeek's MLA) counts as one KV head, as vLLM shards it."""

    source: Path
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    # vLLM's derived max_model_len and where it comes from; None when the config has no length
    # key (vLLM then takes any --max-model-len).
    max_len: int | None = None
    max_len_key: str = ""


def read_model_shape(model_path: Path) -> ModelShape:
    try:
        source, _, config = read_config(model_path)
        heads = positive_int(config, "num_attention_heads", source)
        # Configs without the key use plain multi-head attention: one KV head per attention head.
        kv_heads = 1 if config.get("kv_lora_rank") else positive_int(
            config, "num_key_value_heads", source, heads)
        layers = positive_int(config, "num_hidden_layers", source)
    except LayoutError as exc:
        message = str(exc)
        if message.startswith("cannot read"):
            message = f"WORKER_MODEL_PATH={model_path}: {message}"
        raise SettingsError(message) from None
    return ModelShape(source, heads, kv_heads, layers, *max_model_len(config))


def check_layout(settings: WorkerSettings, shape: ModelShape) -> None:
    """Raise SettingsError (one line per problem) if vLLM would refuse this layout for the model.

    The rules are worker/layout.py's, shared with the planner (`python -m worker plan`)."""
    tp, pp = settings.tensor_parallel_size, settings.pipeline_parallel_size
    heads, kv = shape.num_attention_heads, shape.num_key_value_heads
    problems = sharding_problems(heads, kv, shape.num_hidden_layers, tp, 1)
    messages = []
    if problems:
        # The nearest valid sizes, below and above: the ones a user would try next.
        valid = valid_tp(heads, kv, max(4 * tp, heads))
        below = [t for t in valid if t < tp][-1:]
        above = [t for t in valid if t > tp][:1]
        nearest = ", ".join(map(str, below + above))
        messages.append(
            f"WORKER_TENSOR_PARALLEL_SIZE={tp}: {problems[0]} of {shape.source}; "
            f"nearest valid: {nearest}"
        )
    if pp > shape.num_hidden_layers:
        messages.append(
            f"WORKER_PIPELINE_PARALLEL_SIZE={pp} exceeds num_hidden_layers="
            f"{shape.num_hidden_layers} of {shape.source}: every stage needs at least one layer"
        )
    allow_long = os.environ.get(ALLOW_LONG_ENV, "0").strip().lower() in ("1", "true")
    wanted = settings.max_model_len
    if wanted is not None and shape.max_len is not None and wanted > shape.max_len \
            and not allow_long:
        messages.append(
            f"WORKER_MAX_MODEL_LEN={wanted} exceeds the model's maximum {shape.max_len} "
            f"({shape.max_len_key} of {shape.source}), which vLLM refuses "
            f"({ALLOW_LONG_ENV}=1 lets vLLM take it)"
        )
    if messages:
        raise SettingsError("; ".join(messages))
