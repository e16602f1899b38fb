"""Checks of the parallel layout against the model's own ``config.json``.

vLLM finds the same problems, but only after minutes of start-up and with a stack trace; these run
in milliseconds once the model directory is complete and name the setting to change.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.layout import sharding_problems, valid_tp
from worker.settings import SettingsError, WorkerSettings


@dataclass(frozen=True)
class ModelShape:
    """The few numbers of a transformer config that constrain the parallel layout."""

    source: Path
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int


def _int_field(config: dict[str, Any], key: str, source: Path) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SettingsError(f"{source} has no positive integer {key!r} (got {value!r})")
    return value


def read_model_shape(model_path: Path) -> ModelShape:
    source = model_path / "config.json"
    try:
        raw: Any = json.loads(source.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SettingsError(
            f"WORKER_MODEL_PATH={model_path}: cannot read {source} ({exc})"
        ) from None
    except ValueError as exc:
        raise SettingsError(f"{source} is not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise SettingsError(f"{source} is not a JSON object")
    # Multimodal configs keep the language model's shape under text_config.
    config: dict[str, Any] = raw
    if "num_attention_heads" not in raw and isinstance(raw.get("text_config"), dict):
        config = raw["text_config"]
    heads = _int_field(config, "num_attention_heads", source)
    # Configs without the key use plain multi-head attention: one KV head per attention head.
    kv_heads = (
        _int_field(config, "num_key_value_heads", source)
        if "num_key_value_heads" in config
        else heads
    )
    layers = _int_field(config, "num_hidden_layers", source)
    return ModelShape(source, heads, kv_heads, layers)


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
    if messages:
        raise SettingsError("; ".join(messages))
