"""Fixtures for the worker tests: a clean environment, fake model directories, the real model."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from model_store.marker import is_complete, write_marker

# Env vars that would leak the machine's (or a pod's) configuration into unit tests.
_LEAKY_PREFIXES = ("WORKER_", "LWS_")
_LEAKY_NAMES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")

ModelDirFactory = Callable[..., Path]


@pytest.fixture(autouse=True)
def clean_worker_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(_LEAKY_PREFIXES) or name in _LEAKY_NAMES:
            monkeypatch.delenv(name)


@pytest.fixture
def make_model_dir(tmp_path: Path) -> ModelDirFactory:
    """Create a model directory with a config.json (SmolLM2-135M's shape by default)."""

    def make(
        name: str = "SmolLM2-135M-Instruct",
        heads: int = 9,
        kv_heads: int = 3,
        layers: int = 30,
        complete: bool = True,
    ) -> Path:
        model_dir = tmp_path / name
        model_dir.mkdir()
        config = {
            "architectures": ["LlamaForCausalLM"],
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "num_hidden_layers": layers,
        }
        (model_dir / "config.json").write_text(json.dumps(config), encoding="utf-8")
        if complete:
            write_marker(model_dir, source="test", files={})
        return model_dir

    return make


@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    """The real demo model (SmolLM2-135M-Instruct, HF layout), from LLMSERVE_MODEL_DIR."""
    raw = os.environ.get("LLMSERVE_MODEL_DIR")
    if not raw:
        pytest.fail(
            "LLMSERVE_MODEL_DIR is not set: point it at a complete model directory, e.g. one made "
            "by `python -m model_store bootstrap-demo --dest DIR`"
        )
    path = Path(raw)
    if not is_complete(path):
        pytest.fail(f"LLMSERVE_MODEL_DIR={path} has no valid completion marker")
    return path
