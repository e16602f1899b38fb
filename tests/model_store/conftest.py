"""Synthetic models (random bytes, several files) pushed to the loopback S3 server."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest

from model_store.__main__ import PROG
from model_store.hashing import manifest_of
from model_store.marker import MARKER_NAME, read_marker
from tests import cli
from tests.conftest import S3Env
from tests.s3server import Counter, moto_server

MiB = 1 << 20
PART = "5MiB"  # S3's minimum: many parts from a small model


def write_model(root: Path, sizes: dict[str, int]) -> Path:
    for name, size in sizes.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    return root


@dataclass(frozen=True)
class Pushed:
    local: Path
    url: str
    bucket: str
    prefix: str

    @property
    def size(self) -> int:
        return sum(e.size for e in manifest_of(self.local).values())


SMALL = {"config.json": 2_000, "model-00001.safetensors": 12 * MiB + 7,
         "model-00002.safetensors": 9 * MiB, "tok/tokenizer.json": 300_000, "empty.txt": 0}


@pytest.fixture
def push_model(s3: S3Env, tmp_path: Path) -> Callable[..., Pushed]:
    def push(sizes: dict[str, int] = SMALL, prefix: str = "org/model/main") -> Pushed:
        local = write_model(tmp_path / "local", sizes)
        bucket = s3.bucket()
        url = f"s3://{bucket}/{prefix}"
        proc = s3.cli("push", local, url, MODEL_STORE_PART_SIZE=PART)
        assert proc.returncode == 0, proc.stderr
        return Pushed(local, url, bucket, prefix)

    return push


@dataclass(frozen=True)
class Credentials:
    key: str
    secret: str


@contextmanager
def authenticating_s3(tmp_path: Path) -> Iterator[tuple[S3Env, dict[str, Credentials]]]:
    """A moto server that authenticates every request after its setup (a bucket "models", an IAM
    user without any policy), and two sets of bad credentials: a key it never issued
    ("unknown", refused as InvalidAccessKeyId) and a real key without rights ("no_rights",
    AccessDenied), as AWS S3 and MinIO answer them."""
    # The first three requests go unauthenticated: create_user, create_access_key, create_bucket.
    with moto_server(tmp_path / "auth.log", {"INITIAL_NO_AUTH_ACTION_COUNT": "3"}) as endpoint:
        env = S3Env(endpoint, endpoint, Counter())
        iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1",
                           aws_access_key_id="setup", aws_secret_access_key="setup")
        iam.create_user(UserName="nobody")
        issued = iam.create_access_key(UserName="nobody")["AccessKey"]
        env.client().create_bucket(Bucket="models")
        yield env, {"unknown": Credentials("AKIANOTAREALKEY00000", "wrong"),
                    "no_rights": Credentials(issued["AccessKeyId"], issued["SecretAccessKey"])}


def assert_same_model(dest: Path, local: Path) -> None:
    marker = read_marker(dest)
    assert marker is not None
    assert manifest_of(dest) == manifest_of(local) == marker.files
    assert (dest / MARKER_NAME).is_file()


def assert_nothing_left(dest: Path) -> None:
    """No DEST, no staging, no lease: the volume looks as if the pull never ran."""
    assert not dest.exists()
    leftovers = [p.name for p in dest.parent.iterdir()] if dest.parent.exists() else []
    assert not [n for n in leftovers if dest.name in n], leftovers


def one_line_error(stderr: str, *fragments: str) -> None:
    cli.one_line_error(stderr, PROG, *fragments)
