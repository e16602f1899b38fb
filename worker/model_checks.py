"""Checks of the parallel layout against the model's own ``config.json``.

vLLM finds the same problems, but only after minutes of start-up and with a stack trace; these run
in milliseconds once the model directory is complete and name the setting to change.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_layout(settings: WorkerSettings, shape: ModelShape) -> None:
    """Raise SettingsError (one line per problem) if the layout cannot shard this model."""
    problems: list[str] = []
    tp, pp = settings.tensor_parallel_size, settings.pipeline_parallel_size
    valid_tp = ", ".join(
        map(str, _divisors(math.gcd(shape.num_attention_heads, shape.num_key_value_heads)))
    )
    for key, heads in (
        ("num_attention_heads", shape.num_attention_heads),
        ("num_key_value_heads", shape.num_key_value_heads),
    ):
        if heads % tp:
            problems.append(
                f"WORKER_TENSOR_PARALLEL_SIZE={tp} does not divide {key}={heads} of "
                f"{shape.source}; use one of {valid_tp}"
            )
    if pp > shape.num_hidden_layers:
        problems.append(
            f"WORKER_PIPELINE_PARALLEL_SIZE={pp} exceeds num_hidden_layers="
            f"{shape.num_hidden_layers} of {shape.source}: every stage needs at least one layer"
        )
    if problems:
        raise SettingsError("; ".join(problems))
