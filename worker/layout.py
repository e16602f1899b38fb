"""What a model needs from a parallel layout: vLLM's sharding rules and the memory maths.

One module for the worker's pre-flight check (model_checks.py) and the planner (plan.py), so the
two never disagree.

Sharding rules, as vLLM 0.32 applies them (vllm/config/model.py, verify_with_parallel_config, and
the QKV/linear layers' partitioning):
- tensor parallel must divide `num_attention_heads`;
- tensor parallel and `num_key_value_heads` must divide one another: below the KV-head count each
  rank holds `kv_heads / tp` of them, above it the KV heads are replicated (`tp / kv_heads` ranks
  share each), so TP=16 with 8 KV heads is valid and TP=3 with 2 is not;
- pipeline parallel may not exceed `num_hidden_layers` (every stage needs a layer).

Memory: weights from the checkpoint's safetensors headers when the files are there (real tensor
sizes, any dtype or quantisation), otherwise from the config's shapes; KV cache per token
2 x layers x kv_heads x head_dim x bytes, per rank with replication counted.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
               "fp8": 1, "int8": 1, "int4": 0.5}
# safetensors dtype codes -> bytes per element
_ST_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
             "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
RULE_OF_THUMB = 1.2  # inference memory ~ parameters x bytes x 1.2


class LayoutError(ValueError):
    """The model's config cannot be read or is not a decoder we understand; names the file."""


@dataclass(frozen=True)
class ModelSpec:
    source: Path
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    hidden_size: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    num_experts: int  # 1 for dense models
    qkv_bias: bool
    config_dtype: str
    files_bytes: int | None  # sum of the safetensors tensors, when present

    def params(self) -> int:
        """Parameters from the config's shapes (Llama, Qwen2, Mistral, Mixtral families)."""
        h, hd = self.hidden_size, self.head_dim
        q, kv = self.num_attention_heads * hd, self.num_key_value_heads * hd
        attention = h * q + 2 * h * kv + q * h
        if self.qkv_bias:
            attention += q + 2 * kv
        mlp = 3 * h * self.intermediate_size * self.num_experts
        if self.num_experts > 1:
            mlp += h * self.num_experts  # the router
        per_layer = attention + mlp + 2 * h  # two RMSNorms
        embed = self.vocab_size * h
        head = 0 if self.tie_word_embeddings else embed
        return self.num_hidden_layers * per_layer + embed + head + h

    def weights_bytes(self, dtype: str | None = None) -> int:
        """Real tensor bytes when the checkpoint is there and no other dtype is asked for;
        otherwise parameters x bytes of `dtype`."""
        if self.files_bytes is not None and dtype in (None, self.config_dtype):
            return self.files_bytes
        return int(self.params() * dtype_bytes(dtype or self.config_dtype))

    def kv_heads_per_rank(self, tp: int) -> int:
        """KV heads each TP rank holds: a share, or one replicated head when TP exceeds them."""
        return max(1, self.num_key_value_heads // tp)

    def kv_bytes_per_token(self, dtype: str | None = None, tp: int = 1, pp: int = 1) -> int:
        """KV-cache bytes per token: the whole model (tp=pp=1), or what one rank holds."""
        layers = math.ceil(self.num_hidden_layers / pp)
        heads = self.num_key_value_heads if tp == 1 else self.kv_heads_per_rank(tp)
        return int(2 * layers * heads * self.head_dim * dtype_bytes(dtype or self.config_dtype))


def dtype_bytes(dtype: str) -> float:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise LayoutError(f"unknown dtype {dtype!r}; one of {', '.join(DTYPE_BYTES)}") from None


def sharding_problems(heads: int, kv: int, layers: int, tp: int, pp: int) -> list[str]:
    """Why vLLM would refuse this TP x PP for a model of this shape; empty if it would not."""
    problems = []
    if heads % tp:
        problems.append(f"TP={tp} does not divide {heads} attention heads")
    elif kv % tp and tp % kv:
        problems.append(
            f"TP={tp} and {kv} KV heads do not divide one another (KV heads are split when TP "
            "is below their count and replicated when above)"
        )
    if pp > layers:
        problems.append(f"PP={pp} exceeds {layers} layers")
    return problems


def valid_tp(heads: int, kv: int, up_to: int) -> list[int]:
    """Every tensor-parallel size up to `up_to` that shards these heads."""
    return [t for t in range(1, up_to + 1) if not sharding_problems(heads, kv, 1, t, 1)]


def positive_int(config: dict[str, Any], key: str, source: Path, default: int | None = None) -> int:
    value = config.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise LayoutError(f"{source} has no positive integer {key!r} (got {value!r})")
    return value


def _safetensors_bytes(directory: Path) -> int | None:
    """Sum of tensor sizes from the safetensors headers (8-byte length + JSON); no weights read."""
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for path in files:
        with open(path, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(length))
        for name, t in header.items():
            if name == "__metadata__":
                continue
            total += _ST_BYTES.get(t["dtype"], 2) * math.prod(t["shape"])
    return total


def read_config(path: Path) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """(config.json's path, the whole config, the language model's part of it) for a model
    directory or a config.json itself."""
    source = path if path.is_file() else path / "config.json"
    try:
        raw: Any = json.loads(source.read_text(encoding="utf-8"))
    except OSError as exc:
        raise LayoutError(f"cannot read {source} ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise LayoutError(f"{source} is not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise LayoutError(f"{source} is not a JSON object")
    # Multimodal configs keep the language model's shape under text_config.
    c: dict[str, Any] = raw
    if "num_attention_heads" not in raw and isinstance(raw.get("text_config"), dict):
        c = raw["text_config"]
    return source, raw, c


def read_spec(path: Path) -> ModelSpec:
    """A model directory (config.json, maybe safetensors) or a config.json itself."""
    source, raw, c = read_config(path)
    heads = positive_int(c, "num_attention_heads", source)
    hidden = positive_int(c, "hidden_size", source)
    # Configs without the key use plain multi-head attention: one KV head per attention head.
    kv = positive_int(c, "num_key_value_heads", source, heads)
    head_dim = c.get("head_dim") or hidden // heads
    dtype = str(c.get("torch_dtype") or c.get("dtype") or raw.get("torch_dtype") or "bfloat16")
    return ModelSpec(
        source=source,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        num_hidden_layers=positive_int(c, "num_hidden_layers", source),
        hidden_size=hidden,
        head_dim=int(head_dim),
        intermediate_size=positive_int(c, "intermediate_size", source, 4 * hidden),
        vocab_size=positive_int(c, "vocab_size", source, 32000),
        tie_word_embeddings=bool(c.get("tie_word_embeddings", raw.get("tie_word_embeddings"))),
        num_experts=int(c.get("num_local_experts") or c.get("num_experts") or 1),
        qkv_bias=bool(c.get("attention_bias") or c.get("model_type") == "qwen2"),
        config_dtype=dtype if dtype in DTYPE_BYTES else "bfloat16",
        files_bytes=None if path.is_file() else _safetensors_bytes(path),
    )


def training_bytes(params: float, weight_bytes: float = 2, optimizer_bytes: float = 8) -> float:
    """Weights plus AdamW's two fp32 moments, before activations and the x1.2 margin.

    >>> round(training_bytes(70e9) / 2**30)  # Llama 70B: ~652 GB (GiB) before x 1.2
    652
    >>> round(training_bytes(70e9) * RULE_OF_THUMB / 2**30)
    782
    """
    return params * (weight_bytes + optimizer_bytes)
