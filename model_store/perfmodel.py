"""A performance-only checkpoint: the demo model's tokenizer, a small Llama shape that tensor
parallelism of 2 (or 4, 8) can split, and seeded random weights.

Why: the demo model has 9 attention heads and 3 KV heads, so TP can only be 1 or 3, and a TP=2
against PP=2 comparison needs a shape that both split. Its answers are noise; its cost is real
(30 layers like the demo, hidden 512, 8 heads, 2 KV heads, ~115 M parameters). `make compare`
builds and serves it; nothing serves it by default. Same seed, same bytes of weights.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from model_store.hashing import manifest_of
from model_store.marker import is_complete, write_marker

SHAPE = {
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json", "generation_config.json")


class PerfModelError(Exception):
    """A one-line, user-facing failure."""


def build(tokenizer_dir: Path, out: Path, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    demo = LlamaConfig.from_pretrained(tokenizer_dir)
    cfg = LlamaConfig(
        **SHAPE,
        vocab_size=demo.vocab_size, bos_token_id=demo.bos_token_id,
        eos_token_id=demo.eos_token_id, pad_token_id=demo.pad_token_id,
        max_position_embeddings=demo.max_position_embeddings, rms_norm_eps=demo.rms_norm_eps,
        tie_word_embeddings=True, architectures=["LlamaForCausalLM"],
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy2(tokenizer_dir / name, out / name)


def ensure_perf_model(
    tokenizer_dir: Path, dest: Path, seed: int = 0, log: Callable[[str], object] = print
) -> Path:
    """Produce the checkpoint at `dest` unless it is already complete (then a no-op)."""
    dest = Path(dest)
    if is_complete(dest):
        log(f"{dest}: already complete")
        return dest
    if not (tokenizer_dir / "tokenizer.json").exists():
        raise PerfModelError(f"{tokenizer_dir} has no tokenizer.json (run make model first)")
    if dest.exists() and any(dest.iterdir()):
        raise PerfModelError(f"{dest} exists, is not empty and has no completion marker; "
                             "remove it or choose another --dest")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{dest.name}.tmp-", dir=dest.parent) as tmp:
        staged = Path(tmp) / "model"
        log(f"building the performance-only checkpoint (random weights, seed {seed}) ...")
        build(tokenizer_dir, staged, seed)
        files = manifest_of(staged)
        if dest.exists():
            dest.rmdir()
        os.replace(staged, dest)
    write_marker(dest, source=f"perf-only: {tokenizer_dir.name} tokenizer, Llama {SHAPE}, "
                              f"random weights seed {seed}; answers are noise", files=files)
    log(f"{dest}: complete ({sum(f.size for f in files.values()) / 1e6:.0f} MB)")
    return dest
