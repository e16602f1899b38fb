"""Fixtures for the worker tests: a clean environment, fake model directories, process groups.

The real demo model (``real_model_dir``) comes from the shared tests/conftest.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from model_store.marker import write_marker

# Env vars that would leak the machine's (or a pod's) configuration into unit tests.
_LEAKY_PREFIXES = ("WORKER_", "LWS_")
_LEAKY_NAMES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")

ModelDirFactory = Callable[..., Path]
REPO = Path(__file__).resolve().parents[2]


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


class Spawner:
    """Starts processes in their own groups and kills every group it knows of at teardown."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[str]] = []
        self.pgids: set[int] = set()

    def start(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[str]:
        env = {**os.environ, "PYTHONPATH": str(REPO), **kwargs.pop("env", {})}
        proc = subprocess.Popen(
            list(argv), cwd=REPO, env=env, text=True, start_new_session=True, **kwargs
        )
        self.processes.append(proc)
        self.pgids.add(proc.pid)
        return proc

    def track(self, pgid: int) -> None:
        """Also kill this group at teardown (e.g. an engine group started by a worker)."""
        self.pgids.add(pgid)

    def cleanup(self) -> None:
        for pgid in self.pgids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        for proc in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


@pytest.fixture
def spawner() -> Iterator[Spawner]:
    spawned = Spawner()
    try:
        yield spawned
    finally:
        spawned.cleanup()
