"""`llmserve-devstack demo-adapter`: a real PEFT adapter for the demo model, seeded, complete."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

from model_store.adapter import AdapterInfo
from model_store.marker import read_marker
from tests.cli import one_line_error
from tests.conftest import REPO

pytestmark = pytest.mark.slow

PROG = "llmserve-devstack demo-adapter"


def make(model_dir: Path, dest: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "devstack", "demo-adapter", "--model-dir", str(model_dir),
         "--dest", str(dest), *args],
        capture_output=True, text=True, timeout=300, cwd=REPO, check=False)


def weights(d: Path) -> dict[str, list[float]]:
    with safe_open(d / "adapter_model.safetensors", "pt") as f:
        return {k: f.get_tensor(k).flatten()[:16].tolist() for k in f.keys()}  # noqa: SIM118


def test_a_seeded_complete_adapter(real_model_dir: Path, tmp_path: Path) -> None:
    for name, seed in (("a", "1"), ("a2", "1"), ("b", "2")):
        done = make(real_model_dir, tmp_path / name, "--seed", seed)
        assert done.returncode == 0, done.stderr[-2000:]
    a, a2, b = (weights(tmp_path / n) for n in ("a", "a2", "b"))
    assert a == a2 and a != b  # one adapter per seed
    assert any("q_proj" in k for k in a) and any("v_proj" in k for k in a)
    assert all(any(x != 0 for x in v) for k, v in a.items() if "lora_B" in k)  # not a no-op
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert config["r"] == 8 and config["base_model_name_or_path"].endswith(real_model_dir.name)
    marker = read_marker(tmp_path / "a")
    assert marker is not None and marker.adapter == AdapterInfo(real_model_dir.name, 8)


def test_not_a_model_is_one_line(tmp_path: Path) -> None:
    done = make(tmp_path, tmp_path / "out")
    assert done.returncode == 1
    one_line_error(done.stderr, PROG, "has no config.json")
