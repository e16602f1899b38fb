"""push: every file, manifest last, multipart for big files, aborted uploads on failure."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from model_store.errors import StoreError
from model_store.manifest import MANIFEST_NAME
from model_store.marker import MARKER_NAME, write_marker
from model_store.push import push
from model_store.s3url import S3Url
from model_store.settings import StoreSettings
from tests.conftest import S3Env
from tests.model_store.conftest import (
    PART,
    MiB,
    Pushed,
    authenticating_s3,
    one_line_error,
    write_model,
)
from tests.s3server import client_env

pytestmark = pytest.mark.s3


def test_push_writes_every_file_and_the_manifest(s3: S3Env, push_model: Callable[..., Pushed]) -> None:
    pushed = push_model()
    client = s3.client()
    keys = {
        o["Key"] for o in client.list_objects_v2(Bucket=pushed.bucket)["Contents"]
    }
    names = {"config.json", "model-00001.safetensors", "model-00002.safetensors",
             "tok/tokenizer.json", "empty.txt", MANIFEST_NAME}
    assert keys == {f"{pushed.prefix}/{n}" for n in names}
    doc = json.loads(
        client.get_object(Bucket=pushed.bucket, Key=f"{pushed.prefix}/{MANIFEST_NAME}")["Body"].read()
    )
    assert doc["files"]["model-00001.safetensors"]["size"] == 12 * MiB + 7
    # 12 MiB in 5 MiB parts: a multipart ETag ("...-3"), which is why the manifest has SHA-256.
    head = client.head_object(Bucket=pushed.bucket, Key=f"{pushed.prefix}/model-00001.safetensors")
    assert head["ETag"].strip('"').endswith("-3")
    assert client.list_multipart_uploads(Bucket=pushed.bucket).get("Uploads", []) == []


def test_marker_is_not_pushed_and_ls_shows_models(s3: S3Env, tmp_path: Path) -> None:
    local = write_model(tmp_path / "m", {"a.bin": 1000})
    write_marker(local, "test", {})
    bucket = s3.bucket()
    assert s3.cli("push", local, f"s3://{bucket}/llama/main").returncode == 0
    client = s3.client()
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
    assert not [k for k in keys if MARKER_NAME in k]
    for prefix in ("llama/v2", "qwen/main"):  # two more models, copied server-side
        for key in keys:
            client.copy_object(Bucket=bucket, Key=key.replace("llama/main", prefix),
                               CopySource={"Bucket": bucket, "Key": key})
    client.put_object(Bucket=bucket, Key="half/a.bin", Body=b"x")  # no manifest: not a model
    listing = s3.cli("ls", f"s3://{bucket}")
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert [ln.split()[0] for ln in lines] == [
        f"s3://{bucket}/llama/main", f"s3://{bucket}/llama/v2", f"s3://{bucket}/qwen/main"
    ]
    assert all("1 files" in ln for ln in lines)
    assert len(s3.cli("ls", f"s3://{bucket}/llama").stdout.splitlines()) == 2
    one = s3.cli("ls", f"s3://{bucket}/llama/main").stdout
    assert "a.bin" in one and "1,000" in one
    one_line_error(s3.cli("ls", f"s3://{bucket}/half").stderr, "no models under")


def test_refuses_a_bucket_root_that_would_hide_the_other_models(
    s3: S3Env, tmp_path: Path
) -> None:
    local = write_model(tmp_path / "m", {"a.bin": 1000})
    bucket = s3.bucket()
    assert s3.cli("push", local, f"s3://{bucket}/llama/main").returncode == 0
    for root in (f"s3://{bucket}", f"s3://{bucket}/"):
        proc = s3.cli("push", local, root)
        assert proc.returncode == 2, proc.stderr
        one_line_error(proc.stderr, f"push needs a prefix under the bucket, e.g. s3://{bucket}/MODEL")
    keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket)["Contents"]]
    assert all(k.startswith("llama/main/") for k in keys)  # nothing written at the root
    listing = s3.cli("ls", f"s3://{bucket}")
    assert [ln.split()[0] for ln in listing.stdout.splitlines()] == [f"s3://{bucket}/llama/main"]


def test_refuses_an_empty_or_missing_dir_or_a_broken_link(s3: S3Env, tmp_path: Path) -> None:
    bucket = s3.bucket()
    (tmp_path / "empty").mkdir()
    write_marker(tmp_path / "empty", "test", {})  # only the marker: still nothing to push
    (tmp_path / "file").write_text("x")
    # A Hugging Face cache snapshot whose blob is gone: not pushed as a model without that file.
    linked = write_model(tmp_path / "linked", {"config.json": 10})
    (linked / "model.safetensors").symlink_to(tmp_path / "blobs" / "0123abcd")
    for local, fragment in [("empty", "no files"), ("nope", "not a directory"),
                            ("file", "not a directory"),
                            ("linked", "model.safetensors is a broken symlink")]:
        proc = s3.cli("push", tmp_path / local, f"s3://{bucket}/x")
        assert proc.returncode == 2, proc.stderr
        one_line_error(proc.stderr, fragment)
    assert "Contents" not in s3.client().list_objects_v2(Bucket=bucket)


def test_failed_part_aborts_multipart_uploads_and_writes_no_manifest(
    s3: S3Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in client_env(s3.direct).items():
        monkeypatch.setenv(k, v)
    local = write_model(tmp_path / "m", {"a.bin": 11 * MiB, "b.bin": 12 * MiB})
    bucket = s3.bucket()
    settings = StoreSettings(part_size=PART, concurrency=2, progress="off")  # type: ignore[arg-type]

    import model_store.push as push_mod

    real_call = push_mod._call

    def flaky(client: Any, dst: S3Url, what: str, fn: Callable[..., Any], **kw: Any) -> Any:
        if kw.get("PartNumber") == 2 and kw["Key"].endswith("b.bin"):
            raise StoreError(f"{what}: injected failure")
        return real_call(client, dst, what, fn, **kw)

    monkeypatch.setattr(push_mod, "_call", flaky)
    with pytest.raises(StoreError, match="b.bin part 2: injected failure"):
        push(settings, local, S3Url.parse(f"s3://{bucket}/m"), lambda _: None)
    client = s3.client()
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert f"m/{MANIFEST_NAME}" not in keys


@pytest.mark.parametrize("who", ["unknown", "no_rights"])
def test_bad_credentials_name_the_endpoint_the_bucket_and_the_setting(
    tmp_path: Path, who: str
) -> None:
    local = write_model(tmp_path / "m", {"a.bin": 1000})
    with authenticating_s3(tmp_path) as (env, creds):
        proc = env.cli("push", local, "s3://models/m/main", timeout=60,
                       AWS_ACCESS_KEY_ID=creds[who].key, AWS_SECRET_ACCESS_KEY=creds[who].secret)
    assert proc.returncode == 1
    one_line_error(proc.stderr, env.endpoint, "'models'", "AWS_ACCESS_KEY_ID",
                   "MODEL_STORE_ENDPOINT_URL")

