"""bench/envoy.py's configurations are ones the real Envoy accepts (`envoy --mode validate`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from bench.envoy import ENVOY, VARIANTS, config


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("fail_open", [False, True])
def test_envoy_validates_each_variant(variant: str, fail_open: bool, tmp_path: Path) -> None:
    assert ENVOY is not None
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(config(
        8081, 9901, variant=variant, epp_port=9002, endpoints=("127.0.0.1:8000", "[::1]:8001"),
        fail_open=fail_open, subset=("127.0.0.1:8000",))))
    done = subprocess.run([ENVOY, "--mode", "validate", "-c", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_variant_not_known_is_refused() -> None:
    with pytest.raises(ValueError, match="variant must be one of"):
        config(1, 2, variant="maglev")
