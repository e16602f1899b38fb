"""The workers' init container, run for real: the exact command the chart renders, against a
model directory on this machine. It must wait while the directory has no valid completion marker
(a half-written one included) and finish once model_store.marker says the model is complete."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from model_store.marker import MARKER_NAME, FileEntry, write_marker
from tests.deploy.manifests import REPO

pytestmark = pytest.mark.helm


def test_init_container_waits_for_a_valid_marker(render_case: Any, tmp_path: Path) -> None:
    pod = render_case("preset:values-cpu.yaml").worker_pods()[0]
    (init,) = pod.spec["initContainers"]
    command = init["command"]
    assert command[0] == "python3" and command[-1] == "/models/SmolLM2-135M-Instruct/demo"

    model_dir = tmp_path / "SmolLM2-135M-Instruct" / "demo"
    model_dir.mkdir(parents=True)
    (model_dir / MARKER_NAME).write_text('{"format": 1, "files": ', encoding="utf-8")  # torn
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, *command[1:-1], str(model_dir)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith(f"waiting for {model_dir / MARKER_NAME}"), first
        assert proc.poll() is None

        write_marker(model_dir, "s3://models/demo", {"config.json": FileEntry(2, "0" * 64)})
        assert proc.wait(timeout=30) == 0
        assert f"model complete: {model_dir}" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
