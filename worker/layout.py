"""What a model needs from a parallel layout: vLLM's sharding rules and the memory maths.

One module for the worker's pre-flight check (model_checks.py) and the planner (plan.py), so the
two never disagree.

Sharding rules, as vLLM 0.32 applies them (vllm/config/model.py, verify_with_parallel_config, and
the QKV/linear layers' partitioning):
- tensor parallel must divide `num_attention_heads`;
- tensor parallel and `num_key_value_heads` must divide one another: below the KV-head count each
  rank holds `kv_heads / tp` of them, above it the KV heads are replicated (`tp / kv_heads` ranks
  share each), so TP=16 with 8 KV heads is valid and TP=3 with 2 is not (multi-head latent
  attention has one latent "head", replicated on every rank);
- pipeline parallel may not exceed `num_hidden_layers` (every stage needs a layer).

Shapes, from the config's own keys:
- attention: grouped-query (q, k, v, o; Qwen2's QKV bias; Qwen3's q/k norms), or DeepSeek's
  multi-head latent attention (`q_lora_rank`, `kv_lora_rank`, `qk_nope_head_dim`,
  `qk_rope_head_dim`, `v_head_dim`);
- MLP: gated (gate, up, down) of `intermediate_size`, or mixture-of-experts: Mixtral
  (`num_local_experts` of `intermediate_size`), Qwen-MoE (`num_experts` of
  `moe_intermediate_size`, `shared_expert_intermediate_size`, `decoder_sparse_step`,
  `mlp_only_layers`), DeepSeek (`n_routed_experts` and `n_shared_experts` of
  `moe_intermediate_size`, dense below `first_k_dense_replace`, every `moe_layer_freq`-th
  layer), each with `num_experts_per_tok` routed experts active per token.

Memory: weights from the checkpoint's safetensors headers when the files are there (real tensor
sizes, any dtype or quantisation), otherwise from the config's shapes (an FP8 checkpoint's
`quantization_config` puts its linear layers at one byte); per GPU, the largest pipeline stage
as vLLM partitions the layers, over TP. KV cache per token 2 x layers x kv_heads x head_dim x
bytes (latent attention: layers x (kv_lora_rank + qk_rope_head_dim) x bytes), per rank with
replication counted. The longest context is vLLM's derived max_model_len (the smallest of the
config's length keys, times a RoPE scaling factor where vLLM applies one).
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
# vLLM's length keys (ModelArchConfigConvertor.derive_max_model_len_and_key), smallest wins.
_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                "model_max_length", "max_target_positions", "max_sequence_length",
                "max_seq_length", "seq_len")
# RoPE types whose max_position_embeddings is already the scaled length (vLLM 0.32,
# _get_and_verify_max_len); others multiply it by their `factor`.
_ROPE_PRESCALED = {"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"}


class LayoutError(ValueError):
    """The model's config cannot be read or is not a decoder we understand; names the file."""


@dataclass(frozen=True)
class Moe:
    """A mixture-of-experts MLP: routed experts (a few active per token) and shared ones."""

    experts: int
    active: int  # routed experts per token
    expert_intermediate: int
    shared_intermediate: int  # all shared experts together; 0 for none
    sparse_layers: frozenset[int]  # the layers with experts; the others are dense


@dataclass(frozen=True)
class Mla:
    """Multi-head latent attention (DeepSeek-V2/V3): low-rank q and compressed kv."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class ModelSpec:
    source: Path
    num_attention_heads: int
    num_key_value_heads: int
    num_hidden_layers: int
    hidden_size: int
    head_dim: int
    intermediate_size: int  # the dense MLP's
    vocab_size: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    moe: Moe | None
    mla: Mla | None
    config_dtype: str  # activations, KV cache, embeddings
    weight_dtype: str  # linear layers: config_dtype, or fp8 for an FP8 checkpoint
    max_len: int  # vLLM's derived max_model_len
    max_len_key: str
    files_bytes: int | None  # sum of the safetensors tensors, when present

    # --- parameters ----------------------------------------------------------------------------
    def attention_params(self) -> int:
        h, heads = self.hidden_size, self.num_attention_heads
        if self.mla is not None:
            m = self.mla
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            q = (h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * heads * qk
                 if m.q_lora_rank else h * heads * qk)
            kv = (h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
                  + m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim))
            return q + kv + heads * m.v_head_dim * h
        q, kv = heads * self.head_dim, self.num_key_value_heads * self.head_dim
        params = h * q + 2 * h * kv + q * h
        if self.qkv_bias:
            params += q + 2 * kv
        if self.qk_norm:
            params += 2 * self.head_dim
        return params

    def layer_params(self, layer: int) -> tuple[int, int]:
        """(all parameters, those in routed experts) of one decoder layer."""
        h = self.hidden_size
        base = self.attention_params() + 2 * h  # two RMSNorms
        if self.moe is None or layer not in self.moe.sparse_layers:
            return base + 3 * h * self.intermediate_size, 0
        m = self.moe
        routed = m.experts * 3 * h * m.expert_intermediate
        return base + routed + 3 * h * m.shared_intermediate + h * m.experts, routed

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def head_params(self) -> int:
        """The output head and final norm (a tied head shares the embedding's parameters)."""
        return (0 if self.tie_word_embeddings else self.embedding_params()) + self.hidden_size

    def params(self) -> int:
        """All parameters, from the config's shapes."""
        layers = sum(self.layer_params(i)[0] for i in range(self.num_hidden_layers))
        return layers + self.embedding_params() + self.head_params()

    def routed_params(self) -> int:
        return sum(self.layer_params(i)[1] for i in range(self.num_hidden_layers))

    def active_fraction(self, tokens: int = 1) -> float:
        """Share of the routed experts a decode step of `tokens` tokens reads: top-k of E for
        one token; 1 - (1 - k/E)^tokens for a batch, with tokens routed evenly."""
        if self.moe is None:
            return 1.0
        return 1.0 - (1.0 - self.moe.active / self.moe.experts) ** tokens

    def active_params(self) -> int:
        """Parameters one token runs through (routed experts: only its top-k)."""
        routed = self.routed_params()
        return int(self.params() - routed + routed * self.active_fraction(1))

    # --- bytes ---------------------------------------------------------------------------------
    def _shape_bytes(self, params_in_layers: float, other: float, dtype: str | None) -> float:
        if dtype is not None:
            return (params_in_layers + other) * dtype_bytes(dtype)
        return (params_in_layers * dtype_bytes(self.weight_dtype)
                + other * dtype_bytes(self.config_dtype))

    def _scale(self, dtype: str | None) -> float:
        """Real file bytes over shape bytes, when the checkpoint is there and no other dtype is
        asked for: applied to every part, so stages and experts keep their shares."""
        if self.files_bytes is None or dtype not in (None, self.config_dtype):
            return 1.0
        return self.files_bytes / self._shape_bytes(
            self.params() - self.embedding_params() - self.head_params(),
            self.embedding_params() + self.head_params(), None)

    def weights_bytes(self, dtype: str | None = None) -> int:
        """Real tensor bytes when the checkpoint is there and no other dtype is asked for;
        otherwise parameters x bytes (of `dtype`, or the checkpoint's own)."""
        if self.files_bytes is not None and dtype in (None, self.config_dtype):
            return self.files_bytes
        outer = self.embedding_params() + self.head_params()
        return int(self._shape_bytes(self.params() - outer, outer, dtype))

    def stage_bytes(self, pp: int, dtype: str | None = None) -> list[int]:
        """Weight bytes of each pipeline stage, layers split as vLLM does (get_pp_indices): the
        first stage also holds the embedding, the last the head (its own copy when tied)."""
        scale = self._scale(dtype)
        stages = []
        start = 0
        for rank, count in enumerate(pp_partition(self.num_hidden_layers, pp)):
            layers = sum(self.layer_params(i)[0] for i in range(start, start + count))
            start += count
            outer = 0
            if rank == 0:
                outer += self.embedding_params()
            if rank == pp - 1:
                outer += (self.head_params() if not self.tie_word_embeddings or pp == 1
                          else self.embedding_params() + self.hidden_size)
            stages.append(int(self._shape_bytes(layers, outer, dtype) * scale))
        return stages

    def gpu_weight_bytes(self, tp: int, pp: int, dtype: str | None = None) -> int:
        """Weights on the busiest GPU: the largest stage, sharded over TP."""
        return max(self.stage_bytes(pp, dtype)) // tp

    def bytes_read_per_step(self, tokens: int, dtype: str | None = None) -> float:
        """Weight bytes one decode step of `tokens` sequences reads: everything but the routed
        experts, and of those the share the batch touches."""
        routed = self._shape_bytes(self.routed_params(), 0, dtype) * self._scale(dtype)
        return self.weights_bytes(dtype) - routed * (1 - self.active_fraction(tokens))

    def kv_heads_per_rank(self, tp: int) -> int:
        """KV heads each TP rank holds: a share, or one replicated head when TP exceeds them."""
        return max(1, self.num_key_value_heads // tp)

    def kv_bytes_per_token(self, dtype: str | None = None, tp: int = 1, pp: int = 1) -> int:
        """KV-cache bytes per token: the whole model (tp=pp=1), or what one rank holds."""
        layers = max(pp_partition(self.num_hidden_layers, pp))
        size = dtype_bytes(dtype or self.config_dtype)
        if self.mla is not None:  # one latent vector per layer, replicated on every TP rank
            return int(layers * (self.mla.kv_lora_rank + self.mla.qk_rope_head_dim) * size)
        heads = self.num_key_value_heads if tp == 1 else self.kv_heads_per_rank(tp)
        return int(2 * layers * heads * self.head_dim * size)

    # --- compute -------------------------------------------------------------------------------
    def flops_per_token(self, context: float) -> float:
        """Decode FLOPs per token at `context` tokens of KV: 2 per active parameter (the input
        embedding is a lookup, not a product) plus attention's two products over the context."""
        matmul = 2 * (self.active_params() - self.embedding_params())
        heads = self.num_attention_heads
        if self.mla is not None:  # absorbed latent attention, as vLLM decodes it
            m = self.mla
            per_layer = 2 * context * heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
        else:
            per_layer = 4 * context * heads * self.head_dim
        return matmul + per_layer * self.num_hidden_layers


def pp_partition(layers: int, pp: int) -> list[int]:
    """Layers per pipeline stage as vLLM splits them (vllm/distributed/utils.py,
    get_pp_indices): evenly, the remainder to the stages before the last."""
    parts = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        parts[-i] += 1
    return parts


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


def spec_sharding_problems(spec: ModelSpec, tp: int, pp: int) -> list[str]:
    """sharding_problems for a model spec (latent attention has one KV head)."""
    kv = 1 if spec.mla is not None else spec.num_key_value_heads
    return sharding_problems(spec.num_attention_heads, kv, spec.num_hidden_layers, tp, pp)


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


def max_model_len(c: dict[str, Any]) -> tuple[int | None, str]:
    """vLLM's derived max_model_len and the key it comes from (vllm/config/model.py,
    _get_and_verify_max_len): the smallest length key (model_max_length wins when set), times
    the RoPE scaling factor for RoPE types that do not already count it. (None, "") with no
    length key: vLLM then takes any --max-model-len, and defaults to 2048."""
    found = [(c[k], k) for k in _LENGTH_KEYS if isinstance(c.get(k), int) and c[k] > 0]
    if not found:
        return None, ""
    length, key = min(found)
    if isinstance(c.get("model_max_length"), int) and c["model_max_length"] > 0:
        length, key = c["model_max_length"], "model_max_length"
    rope = c.get("rope_parameters") or c.get("rope_scaling")
    if isinstance(rope, dict) and "gemma3" not in str(c.get("model_type", "")):
        # Per-layer-type parameters ({"full_attention": {...}, ...}) or one set.
        sets = [rope] if ("rope_type" in rope or "type" in rope) else [
            v for v in rope.values() if isinstance(v, dict)]
        factor: float = 1.0
        for params in sets:
            kind = params.get("rope_type", params.get("type"))
            if kind not in _ROPE_PRESCALED and isinstance(params.get("factor"), (int, float)):
                factor = params["factor"]
        if factor != 1.0:
            return int(length * factor), f"{key} x rope factor {factor:g}"
    return length, key


def _moe(c: dict[str, Any], source: Path, layers: int, hidden: int) -> Moe | None:
    experts = c.get("n_routed_experts") or c.get("num_local_experts") or c.get("num_experts")
    if not experts or experts < 2:
        return None
    active = positive_int(c, "num_experts_per_tok", source, 2)
    expert_size = c.get("moe_intermediate_size") or c.get("intermediate_size") or 4 * hidden
    shared = (c.get("n_shared_experts") or 0) * expert_size
    shared += c.get("shared_expert_intermediate_size") or 0
    first_dense = c.get("first_k_dense_replace") or 0
    freq = c.get("moe_layer_freq") or 1
    step = c.get("decoder_sparse_step") or 1
    dense_only = set(c.get("mlp_only_layers") or ())
    # vLLM's tests per family (deepseek_v2.py, qwen2_moe.py / qwen3_moe.py; Mixtral: all).
    sparse = frozenset(
        i for i in range(layers)
        if i >= first_dense and i % freq == 0 and (i + 1) % step == 0 and i not in dense_only
    )
    return Moe(int(experts), active, int(expert_size), int(shared), sparse)


def _mla(c: dict[str, Any], source: Path) -> Mla | None:
    if not c.get("kv_lora_rank"):
        return None
    return Mla(
        q_lora_rank=c.get("q_lora_rank") or None,
        kv_lora_rank=positive_int(c, "kv_lora_rank", source),
        qk_nope_head_dim=positive_int(c, "qk_nope_head_dim", source),
        qk_rope_head_dim=positive_int(c, "qk_rope_head_dim", source),
        v_head_dim=positive_int(c, "v_head_dim", source),
    )


def read_spec(path: Path, *, with_files: bool = True) -> ModelSpec:
    """A model directory (config.json, maybe safetensors) or a config.json itself.
    `with_files=False` skips reading the safetensors headers (the shapes are enough)."""
    source, raw, c = read_config(path)
    heads = positive_int(c, "num_attention_heads", source)
    hidden = positive_int(c, "hidden_size", source)
    layers = positive_int(c, "num_hidden_layers", source)
    # Configs without the key use plain multi-head attention: one KV head per attention head.
    kv = positive_int(c, "num_key_value_heads", source, heads)
    head_dim = c.get("head_dim") or hidden // heads
    dtype = str(c.get("torch_dtype") or c.get("dtype") or raw.get("torch_dtype") or "bfloat16")
    dtype = dtype if dtype in DTYPE_BYTES else "bfloat16"
    quant = c.get("quantization_config") or raw.get("quantization_config") or {}
    weight_dtype = "fp8" if isinstance(quant, dict) and quant.get("quant_method") == "fp8" \
        else dtype
    model_type = str(c.get("model_type", ""))
    length, length_key = max_model_len(c)
    if length is None:
        length, length_key = 2048, "vLLM's default: the config has no length key"
    return ModelSpec(
        source=source,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        num_hidden_layers=layers,
        hidden_size=hidden,
        head_dim=int(head_dim),
        intermediate_size=positive_int(c, "intermediate_size", source, 4 * hidden),
        vocab_size=positive_int(c, "vocab_size", source, 32000),
        tie_word_embeddings=bool(c.get("tie_word_embeddings", raw.get("tie_word_embeddings"))),
        qkv_bias=bool(c.get("attention_bias") or model_type == "qwen2"),
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        moe=_moe(c, source, layers, hidden),
        mla=_mla(c, source),
        config_dtype=dtype,
        weight_dtype=weight_dtype,
        max_len=length,
        max_len_key=length_key,
        files_bytes=None if path.is_file() or not with_files else _safetensors_bytes(path),
    )


def training_bytes(params: float, weight_bytes: float = 2, optimizer_bytes: float = 8) -> float:
    """Weights plus AdamW's two fp32 moments, before activations and the x1.2 margin.

    >>> round(training_bytes(70e9) / 2**30)  # Llama 70B: ~652 GB (GiB) before x 1.2
    652
    >>> round(training_bytes(70e9) * RULE_OF_THUMB / 2**30)
    782
    """
    return params * (weight_bytes + optimizer_bytes)
