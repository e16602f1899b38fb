"""pull: the round trip, ROOT/<model>/<revision>, corruption, and every failure as one line."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from model_store.manifest import MANIFEST_NAME
from model_store.marker import MARKER_NAME
from model_store.staging import lease_file, staging_dir
from tests.conftest import S3Env
from tests.model_store.conftest import (
    PART,
    Pushed,
    assert_nothing_left,
    assert_same_model,
    authenticating_s3,
    one_line_error,
    write_model,
)
from tests.ports import free_port

pytestmark = pytest.mark.s3


def test_round_trip_and_second_pull_is_a_no_op(
    s3: S3Env, push_model: Callable[..., Pushed], tmp_path: Path
) -> None:
    pushed = push_model()
    dest = tmp_path / "vol" / "model" / "main"
    before = s3.counter.sent[pushed.bucket]
    proc = s3.cli("pull", pushed.url, dest, MODEL_STORE_PART_SIZE=PART)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(dest)
    assert_same_model(dest, pushed.local)
    assert s3.counter.sent[pushed.bucket] - before == pushed.size
    assert sorted(p.name for p in dest.parent.iterdir()) == ["main"]  # no staging, no lease
    again = s3.cli("pull", pushed.url, dest)
    assert again.returncode == 0 and "already complete" in again.stderr
    assert s3.counter.sent[pushed.bucket] - before == pushed.size  # no bytes the second time
    ok = s3.cli("verify", dest)
    assert ok.returncode == 0 and "OK, 5 files" in ok.stderr


def test_root_layout_model_and_revision(
    s3: S3Env, push_model: Callable[..., Pushed], tmp_path: Path
) -> None:
    pushed = push_model(prefix="org/llama/v2")
    proc = s3.cli("pull", pushed.url, "--root", tmp_path / "models")
    assert proc.returncode == 0, proc.stderr
    assert_same_model(tmp_path / "models" / "llama" / "v2", pushed.local)
    proc = s3.cli("pull", pushed.url, "--model", "x", "--revision", "r1",
                  MODEL_STORE_ROOT=str(tmp_path / "models"))
    assert proc.returncode == 0, proc.stderr
    assert_same_model(tmp_path / "models" / "x" / "r1", pushed.local)  # beside the other one
    one_line_error(s3.cli("pull", pushed.url).stderr, "give DEST, or set MODEL_STORE_ROOT")


def test_verify_names_the_bad_file(
    s3: S3Env, push_model: Callable[..., Pushed], tmp_path: Path
) -> None:
    pushed = push_model()
    dest = tmp_path / "m"
    assert s3.cli("pull", pushed.url, dest).returncode == 0
    target = dest / "tok" / "tokenizer.json"
    data = bytearray(target.read_bytes())
    data[1000] ^= 1
    target.write_bytes(bytes(data))
    proc = s3.cli("verify", dest)
    assert proc.returncode == 1
    one_line_error(proc.stderr, f"{target}: SHA-256 mismatch")
    (dest / "config.json").unlink()
    one_line_error(s3.cli("verify", dest).stderr, "config.json: missing", "1 more bad files")
    one_line_error(s3.cli("verify", tmp_path).stderr, "no valid completion marker")


@pytest.mark.parametrize("same_size", [True, False])
def test_object_changed_after_push_fails_naming_the_file(
    s3: S3Env, push_model: Callable[..., Pushed], tmp_path: Path, same_size: bool
) -> None:
    pushed = push_model()
    name = "model-00002.safetensors"
    data = bytearray((pushed.local / name).read_bytes())
    data[len(data) // 2] ^= 0xFF
    body = bytes(data) if same_size else bytes(data) + b"tail"
    s3.client().put_object(Bucket=pushed.bucket, Key=f"{pushed.prefix}/{name}", Body=body)
    dest = tmp_path / "vol" / "m"
    proc = s3.cli("pull", pushed.url, dest, MODEL_STORE_PART_SIZE=PART)
    assert proc.returncode == 1
    one_line_error(proc.stderr, name, "changed after push", "nothing published")
    assert not dest.exists() and not (dest / ".llmserve-complete.json").exists()


def test_missing_bucket(s3: S3Env, tmp_path: Path) -> None:
    dest = tmp_path / "new" / "deeper" / "m"
    proc = s3.cli("pull", "s3://no-such-bucket/m/main", dest)
    assert proc.returncode == 1
    one_line_error(proc.stderr, "bucket 'no-such-bucket' does not exist")
    assert not (tmp_path / "new").exists()  # the parents it created are gone too


def test_missing_prefix(s3: S3Env, tmp_path: Path) -> None:
    bucket = s3.bucket()
    dest = tmp_path / "m"
    proc = s3.cli("pull", f"s3://{bucket}/no/such/model", dest)
    assert proc.returncode == 1
    one_line_error(proc.stderr, f"no model at s3://{bucket}/no/such/model", MANIFEST_NAME)
    assert_nothing_left(dest)


@pytest.mark.parametrize("who", ["unknown", "no_rights"])
def test_bad_credentials(tmp_path: Path, who: str) -> None:
    dest = tmp_path / "m"
    with authenticating_s3(tmp_path) as (env, creds):
        proc = env.cli("pull", "s3://models/m/main", dest, timeout=60,
                       AWS_ACCESS_KEY_ID=creds[who].key, AWS_SECRET_ACCESS_KEY=creds[who].secret)
    assert proc.returncode == 1
    one_line_error(proc.stderr, env.endpoint, "'models'", "AWS_ACCESS_KEY_ID",
                   "MODEL_STORE_ENDPOINT_URL")
    if who == "unknown":
        assert "rejected the credentials (InvalidAccessKeyId)" in proc.stderr
    assert_nothing_left(dest)


def test_unreachable_endpoint(s3: S3Env, tmp_path: Path) -> None:
    dest = tmp_path / "m"
    closed = f"http://127.0.0.1:{free_port()}"
    proc = s3.cli("pull", "s3://models/m/main", dest, "--endpoint-url", closed,
                  "--max-attempts", "2", "--connect-timeout-s", "1")
    assert proc.returncode == 1
    one_line_error(proc.stderr, f"cannot reach the S3 endpoint {closed}")
    assert_nothing_left(dest)


def test_too_little_disk(s3: S3Env, push_model: Callable[..., Pushed], tmp_path: Path) -> None:
    pushed = push_model()
    dest = tmp_path / "m"
    before = s3.counter.sent[pushed.bucket]
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    proc = s3.cli("pull", pushed.url, dest, MODEL_STORE_FREE_SPACE_MARGIN=str(free))
    assert proc.returncode == 1
    one_line_error(proc.stderr, "not enough free space on", "MB to fetch")
    assert_nothing_left(dest)
    assert s3.counter.sent[pushed.bucket] == before  # checked before the first GET of model data


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("foreign", ["a file", "a file the model does not list", "a directory"])
def test_a_dest_that_is_not_a_model_is_refused_untouched(
    s3: S3Env, push_model: Callable[..., Pushed], tmp_path: Path, foreign: str
) -> None:
    """A DEST without a marker is taken back only if it is what a crash after publishing leaves:
    a user's file or directory given by mistake is neither moved aside nor emptied."""
    pushed = push_model()
    dest = tmp_path / "vol" / "m"
    dest.parent.mkdir()
    if foreign == "a file":
        dest.write_text("my notes")
        fragment, before = "is not a directory", {"": b"my notes"}
    else:
        mine = "notes.txt" if foreign.startswith("a file") else "work/notes.txt"
        write_model(dest, {"config.json": 10, "tok/tokenizer.json": 5, mine: 3})  # 2 it lists
        fragment, before = "which the model does not list", _files(dest)
    proc = s3.cli("pull", pushed.url, dest, MODEL_STORE_PART_SIZE=PART)
    assert proc.returncode == 2
    one_line_error(proc.stderr, str(dest), fragment)
    assert (dest.read_bytes() == before[""]) if dest.is_file() else _files(dest) == before
    assert sorted(p.name for p in dest.parent.iterdir()) == ["m"]  # no staging, no lease


def test_a_published_dest_without_its_marker_is_taken_back(
    s3: S3Env, push_model: Callable[..., Pushed], tmp_path: Path
) -> None:
    """A crash between the publishing rename and the marker (its temp file written, or not):
    the next pull checks the files it finds, fetches nothing and writes the marker."""
    pushed = push_model()
    dest = tmp_path / "m"
    assert s3.cli("pull", pushed.url, dest, MODEL_STORE_PART_SIZE=PART).returncode == 0
    (dest / MARKER_NAME).rename(dest / f"{MARKER_NAME}.tmp-1")
    before = s3.counter.sent[pushed.bucket]
    proc = s3.cli("pull", pushed.url, dest, MODEL_STORE_PART_SIZE=PART)
    assert proc.returncode == 0, proc.stderr
    assert "checking its files against the manifest" in proc.stderr
    assert s3.counter.sent[pushed.bucket] == before
    assert_same_model(dest, pushed.local)
    assert not staging_dir(dest).exists() and not lease_file(dest).exists()
