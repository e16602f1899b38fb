from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from model_store.__main__ import PROG
from model_store.hashing import manifest_of
from model_store.marker import read_marker
from tests.cli import one_line_error


def test_refuses_a_nonempty_unmarked_destination(tmp_path: Path) -> None:
    dest = tmp_path / "m"
    dest.mkdir()
    (dest / "half-written.safetensors").write_bytes(b"x")
    proc = subprocess.run([sys.executable, "-m", "model_store", "bootstrap-demo", "--dest",
                           str(dest)], capture_output=True, text=True, check=False)
    assert proc.returncode == 1
    one_line_error(proc.stderr, PROG, "no completion marker")
    assert [p.name for p in dest.iterdir()] == ["half-written.safetensors"]


@pytest.mark.engine
def test_demo_model_is_whole_and_a_second_run_is_a_no_op(real_model_dir: Path) -> None:
    marker = read_marker(real_model_dir)
    assert marker is not None
    files = manifest_of(real_model_dir)  # the marker itself is not listed
    assert files == marker.files
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
    before = (real_model_dir / "model.safetensors").stat().st_mtime_ns
    proc = subprocess.run([sys.executable, "-m", "model_store", "bootstrap-demo", "--dest",
                           str(real_model_dir)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0 and "already complete" in proc.stdout
    assert (real_model_dir / "model.safetensors").stat().st_mtime_ns == before
