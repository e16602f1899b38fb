"""The performance-only checkpoint: a shape TP=2 splits, the demo tokenizer, seeded weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_store import perfmodel
from model_store.marker import read_marker
from worker.layout import sharding_problems


def _tokenizer_dir(tmp_path: Path) -> Path:
    """A stand-in for the demo model's directory: its config and tokenizer files only."""
    d = tmp_path / "demo"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "model_type": "llama", "vocab_size": 64, "bos_token_id": 1, "eos_token_id": 2,
        "pad_token_id": 2, "max_position_embeddings": 128, "rms_norm_eps": 1e-5}))
    (d / "tokenizer.json").write_text("{}")
    (d / "tokenizer_config.json").write_text("{}")
    return d


def test_shape_splits_for_tp2_and_pp2_by_vllms_rules() -> None:
    s = perfmodel.SHAPE
    heads, kv, layers = s["num_attention_heads"], s["num_key_value_heads"], s["num_hidden_layers"]
    assert sharding_problems(heads, kv, layers, tp=2, pp=1) == []
    assert sharding_problems(heads, kv, layers, tp=1, pp=2) == []
    assert sharding_problems(9, 3, 30, tp=2, pp=1) != []  # the demo model's shape does not
    assert s["hidden_size"] == heads * s["head_dim"]


@pytest.mark.slow
def test_seeded_build_is_reproducible_and_marked(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    # A tiny version of the shape keeps the test fast; the code path is the real one.
    monkeypatch.setattr(perfmodel, "SHAPE", {
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8})
    tok = _tokenizer_dir(tmp_path)
    a = perfmodel.ensure_perf_model(tok, tmp_path / "a", seed=7, log=lambda _: None)
    b = perfmodel.ensure_perf_model(tok, tmp_path / "b", seed=7, log=lambda _: None)
    c = perfmodel.ensure_perf_model(tok, tmp_path / "c", seed=8, log=lambda _: None)
    weights = [(d / "model.safetensors").read_bytes() for d in (a, b, c)]
    assert weights[0] == weights[1] != weights[2]
    cfg = json.loads((a / "config.json").read_text())
    assert cfg["num_key_value_heads"] == 2 and cfg["vocab_size"] == 64
    assert (a / "tokenizer.json").exists()
    marker = read_marker(a)
    assert marker is not None and "random weights seed 7" in marker.source
    # Complete already: a no-op.
    logs: list[str] = []
    perfmodel.ensure_perf_model(tok, a, seed=7, log=logs.append)
    assert logs == [f"{a}: already complete"]
